"""Snapshot chunks from the worker processes (ADBC) are exactly what ``read_rows`` builds,
and every value ADBC would convert on its own terms sends the chunk back to it."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import time
from collections.abc import Iterator
from typing import Any

import apsw
import pytest

from litecdc.db import page_workers, source
from litecdc.db.page_workers import PageWorkers
from litecdc.db.schema import CREATE_INTERNAL
from litecdc.wire import from_ipc


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[apsw.Connection, str]]:
    path = str(tmp_path_factory.mktemp("pages") / "db.sqlite")
    conn = apsw.Connection(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(CREATE_INTERNAL)
    conn.execute(
        "CREATE TABLE clean(id INTEGER PRIMARY KEY, t TEXT, r REAL, i INTEGER, b BLOB);"
        "CREATE TABLE keyed(region TEXT, n INT, v REAL, PRIMARY KEY(region, n)) WITHOUT ROWID;"
        "CREATE TABLE nokey(a TEXT, b INT);"
        "CREATE TABLE odd(id INTEGER PRIMARY KEY, t TEXT, u, num NUMERIC, b BLOB);"
        # no INTEGER column to carry the mark of a value ADBC would convert
        "CREATE TABLE words(k TEXT PRIMARY KEY, v BLOB, w REAL) WITHOUT ROWID;"
    )
    with conn:
        conn.executemany(
            "INSERT INTO clean VALUES(?, ?, ?, ?, ?)",
            [
                (i, f"héllo {i} 😀", v, 2**62 - i, bytes([i % 256]) * 3)
                for i, v in enumerate([0.1, -0.0, 1e308, 5e-324, float("inf"), None] * 500, 1)
            ],
        )
        conn.executemany(
            "INSERT INTO keyed VALUES(?, ?, ?)",
            [(r, n, n / 7) for r in ("eu", "us", "ásia") for n in range(300)],
        )
        conn.executemany("INSERT INTO nokey VALUES(?, ?)", [(f"a{i}", i) for i in range(700)])
        conn.execute("INSERT INTO clean(id, t) VALUES (9000, NULL)")  # a row of NULLs
        conn.executemany(
            "INSERT INTO words VALUES(?, ?, ?)",
            [(f"w{i:04}", b"v%d" % i, i / 3) for i in range(900)],
        )
    yield conn, path
    conn.close()


@pytest.fixture(scope="module")
def workers(db: tuple[apsw.Connection, str]) -> Iterator[PageWorkers]:
    pool = PageWorkers(db[1], 1)
    yield pool
    pool.close()


def _bits(table: Any) -> list[list[Any]]:
    """Rows with floats as their bit patterns (so -0.0 and 0.0 differ)."""
    return [
        [struct.pack(">d", v) if isinstance(v, float) else v for v in row.values()]
        for row in table.to_pylist()
    ]


@pytest.mark.parametrize("table", ["clean", "keyed", "nokey", "words"])
def test_worker_chunks_equal_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers, table: str
) -> None:
    conn, _ = db
    spec = source.describe(conn, table)
    after: list[Any] | None = None
    pages = 0
    while True:
        data = workers.rows_ipc(spec, after, None, 400)
        assert data is not None, "a clean chunk is built by the worker"
        fast = from_ipc(data)
        slow = source.read_rows(conn, spec, after, None, 400)
        assert fast.schema == slow.rows.schema  # metadata included: cid, last_key, done
        assert _bits(fast) == _bits(slow.rows)
        pages += 1
        if slow.done:
            break
        after = slow.last_key
    assert pages > 1


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("t", b"a blob in a TEXT column"),
        ("u", 1.5),  # an untyped column: read_rows writes numbers out exactly
        ("u", b"blob"),
        ("num", 2**60),  # NUMERIC as float64: not exact past 2**53
        ("b", "text in a BLOB column"),
    ],
)
def test_values_adbc_would_convert_go_to_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers, column: str, value: Any
) -> None:
    conn, _ = db
    with conn:
        conn.execute("DELETE FROM odd")
        conn.execute("INSERT INTO odd(id, t, u, num, b) VALUES (1, 'x', 'y', 1.5, x'00')")
        conn.execute(f"INSERT INTO odd(id, {column}) VALUES (2, ?)", (value,))
    assert workers.rows_ipc(source.describe(conn, "odd"), None, None, 100) is None


def test_a_table_without_integer_columns_marks_such_values_in_a_column_of_their_own(
    db: tuple[apsw.Connection, str], workers: PageWorkers
) -> None:
    conn, _ = db
    spec = source.describe(conn, "words")
    sql, _ = source.rows_query(spec, None, None, 10)
    assert "CASE" not in sql
    with conn:
        conn.execute("INSERT INTO words VALUES ('w0500x', 'text in a BLOB column', 1.0)")
    try:
        assert workers.rows_ipc(spec, ["w0490"], None, 100) is None
        assert workers.rows_ipc(spec, None, ["w0490"], 100) is not None  # before it: clean
    finally:
        with conn:
            conn.execute("DELETE FROM words WHERE k = 'w0500x'")


def test_the_chunk_cid_is_the_head_it_was_read_at(
    db: tuple[apsw.Connection, str], workers: PageWorkers
) -> None:
    conn, _ = db
    spec = source.describe(conn, "clean")
    before = from_ipc(workers.rows_ipc(spec, None, None, 10) or b"")
    with conn:
        conn.execute("INSERT INTO _litecdc_journal(query, snapshot) VALUES ('', 0)")
    after = from_ipc(workers.rows_ipc(spec, None, None, 10) or b"")
    cids = [t.column("_litecdc_cid").to_pylist() for t in (before, after)]
    head = source.head_cid(conn)
    assert cids == [[head - 1] * 10, [head] * 10]
    assert before.schema.metadata[b"litecdc.cid"] == str(head - 1).encode()


def test_an_empty_chunk_goes_to_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers
) -> None:
    conn, _ = db
    assert workers.rows_ipc(source.describe(conn, "clean"), [10**9], None, 100) is None


@pytest.mark.parametrize("odd", ["'text after 3000 integers'", "2.5", "0.5"])
@pytest.mark.parametrize("late_at", [5000, 0])
def test_mixed_classes_adbc_refuses_go_to_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers, odd: str, late_at: int
) -> None:
    """Text, or a REAL SQLite keeps as it is (QA: pyarrow cut 2.5 to 2 in read_rows), in
    an INTEGER column, after 3000 integers or first."""
    conn, _ = db
    with conn:
        conn.execute("DROP TABLE IF EXISTS late")
        conn.execute("CREATE TABLE late(id INTEGER PRIMARY KEY, i INTEGER)")
        conn.executemany("INSERT INTO late VALUES(?, ?)", [(k, k) for k in range(1, 3000)])
        conn.execute(f"INSERT INTO late VALUES({late_at}, {odd})")
    assert workers.rows_ipc(source.describe(conn, "late"), None, None, 10_000) is None


def test_chunks_come_through_the_spool_and_leave_nothing_behind(
    db: tuple[apsw.Connection, str],
) -> None:
    conn, path = db
    spec = source.describe(conn, "clean")
    pool = PageWorkers(path, 2)
    try:
        first = pool.rows_ipc(spec, None, None, 500)
        assert pool._spool is not None
        spool = pool._spool.path
        assert spool.startswith(page_workers.SHM)
        assert first is not None and from_ipc(first).num_rows == 500
        assert os.listdir(spool) == [page_workers.OWNER_LOCK]  # the chunk: read once, unlinked
    finally:
        pool.close()
    assert not os.path.exists(spool)


def test_without_a_spool_chunks_come_through_the_pipe(
    db: tuple[apsw.Connection, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, path = db
    monkeypatch.setattr(page_workers, "SHM", "/nonexistent")  # as on a machine without it
    spec = source.describe(conn, "clean")
    pool = PageWorkers(path, 1)
    try:
        data = pool.rows_ipc(spec, None, None, 500)
        assert pool._spool is None
        assert data is not None and from_ipc(data).num_rows == 500
    finally:
        pool.close()


def test_spools_nobody_holds_are_removed_and_held_ones_kept(
    db: tuple[apsw.Connection, str],
) -> None:
    def spool(name: str, *, lock: bool) -> str:
        path = os.path.join(page_workers.SHM, f"litecdc-pages-{name}")
        os.makedirs(path)
        with open(os.path.join(path, "chunk.arrows"), "wb") as f:
            f.write(b"a chunk")
        if lock:
            with open(os.path.join(path, page_workers.OWNER_LOCK), "wb"):
                pass
        return path

    killed = spool("1-killed", lock=True)  # its node died: nobody holds the lock
    old = spool("2-old", lock=False)  # no lock file, an hour old
    os.utime(old, (time.time() - 3600,) * 2)
    fresh = spool("3-fresh", lock=False)  # being created by another node right now
    live = spool("4-live", lock=True)  # another node (here: another open file) holds it
    holder = os.open(os.path.join(live, page_workers.OWNER_LOCK), os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    conn, path = db
    pool = PageWorkers(path, 1)
    try:
        assert pool.rows_ipc(source.describe(conn, "clean"), None, None, 10) is not None
        assert not os.path.exists(killed) and not os.path.exists(old)
        assert os.path.exists(fresh) and os.path.exists(live)
        assert pool._spool is not None and os.path.isdir(pool._spool.path)  # its own
    finally:
        pool.close()
        os.close(holder)
        shutil.rmtree(fresh)
        shutil.rmtree(live)


def test_a_spool_that_cannot_be_written_falls_back_to_the_pipe(
    db: tuple[apsw.Connection, str],
) -> None:
    conn, path = db
    spec = source.describe(conn, "clean")
    pool = PageWorkers(path, 1)
    try:
        assert pool.rows_ipc(spec, None, None, 10) is not None
        assert pool._spool is not None
        shutil.rmtree(pool._spool.path)  # removed under the node (as a full /dev/shm fails)
        data = pool.rows_ipc(spec, None, None, 300)
        assert data is not None and from_ipc(data).num_rows == 300
    finally:
        pool.close()


def test_a_read_transaction_that_cannot_be_ended_discards_the_chunk_and_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SQLite ends a transaction itself on an I/O error, and ADBC's rollback then fails on
    every later call: an I/O error cannot be caused on demand, so a stand-in connection
    whose rollback fails plays it (in this process, without ADBC)."""
    events: list[str] = []

    class Cursor:
        def close(self) -> None:
            events.append("cursor closed")

    class Connection:
        def rollback(self) -> None:
            raise OSError("no transaction is active")

        def close(self) -> None:
            events.append("connection closed")

    monkeypatch.setattr(page_workers, "_conn", Connection())
    monkeypatch.setattr(page_workers, "_connect", lambda: events.append("reconnected"))
    assert page_workers._end_read(Cursor()) is False
    assert events == ["cursor closed", "connection closed", "reconnected"]


def test_a_spool_file_gone_before_the_node_reads_it_means_read_rows(tmp_path: Any) -> None:
    assert page_workers._take(str(tmp_path / "gone.arrows")) is None
