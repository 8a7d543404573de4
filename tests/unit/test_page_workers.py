"""Snapshot chunks from the worker processes (ADBC) are exactly what ``read_rows`` builds,
and every value ADBC would convert on its own terms sends the chunk back to it."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import apsw
import pytest

from litecdc.db import source
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


@pytest.mark.parametrize("table", ["clean", "keyed", "nokey"])
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


def test_an_empty_chunk_goes_to_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers
) -> None:
    conn, _ = db
    assert workers.rows_ipc(source.describe(conn, "clean"), [10**9], None, 100) is None


def test_mixed_classes_adbc_refuses_go_to_read_rows(
    db: tuple[apsw.Connection, str], workers: PageWorkers
) -> None:
    conn, _ = db
    with conn:
        conn.execute("CREATE TABLE IF NOT EXISTS late(id INTEGER PRIMARY KEY, i INTEGER)")
        conn.executemany("INSERT INTO late VALUES(?, ?)", [(k, k) for k in range(3000)])
        conn.execute("INSERT INTO late VALUES(5000, 'text after 3000 integers')")
    assert workers.rows_ipc(source.describe(conn, "late"), None, None, 10_000) is None
