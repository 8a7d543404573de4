"""WAL checkpoints run on the engine's checkpointer thread, never inside a client's COMMIT."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from litecdc import NodeConfig, Statement, Store
from litecdc.db.checkpoint import CHECKPOINT_PAGES, BackgroundCheckpointer, InlineCheckpointer
from litecdc.db.engine import Engine
from litecdc.journal.journal import Journal

S = Statement
PAGE = 4096


def wal_pages(store: Store) -> int:
    wal = Path(store.engine.path + "-wal")
    return wal.stat().st_size // (PAGE + 24) if wal.exists() else 0


def write_pages(store: Store, pages: int) -> None:
    """Commit about ``pages`` pages of new rows, a transaction of ~100 pages at a time."""
    for _ in range(pages // 100):
        store.execute(
            [S("INSERT INTO t(v) VALUES(randomblob(3900))") for _ in range(100)], transaction=True
        )


def checkpointer(store: Store) -> BackgroundCheckpointer:
    found = store.engine._checkpointer
    assert found is not None
    return found


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert condition(), "timed out"


def test_commits_leave_checkpoints_to_the_background_thread(store: Store) -> None:
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")])
    background = checkpointer(store)
    background.pages = 10**9  # asleep: nothing checkpoints the WAL now
    write_pages(store, int(CHECKPOINT_PAGES * 1.5))
    # SQLite's autocheckpoint would have copied the WAL back at 1000 pages, inside a COMMIT
    assert wal_pages(store) > CHECKPOINT_PAGES
    db_size = os.path.getsize(store.engine.path)

    background.pages = CHECKPOINT_PAGES
    write_pages(store, 100)  # a commit over the threshold wakes the thread
    wait_for(lambda: background.checkpoints >= 1 and os.path.getsize(store.engine.path) > db_size)
    wal_before = os.path.getsize(store.engine.path + "-wal")
    write_pages(store, 100)  # the WAL starts over instead of growing
    assert os.path.getsize(store.engine.path + "-wal") == wal_before
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(1700,)]


def test_a_writer_that_never_pauses_keeps_the_wal_bounded(store: Store) -> None:
    """The WAL starts over only when a write begins after a complete checkpoint: past
    ``limit`` pages the writer waits for one after its commit."""
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")])
    background = checkpointer(store)
    background.pages, background.limit = 50, 300
    largest = 0
    for _ in range(40):  # ~200 pages per transaction, back to back
        write_pages(store, 100)
        largest = max(largest, background.wal_pages)
    # at most the limit plus one transaction (~200 pages) before the WAL starts over
    assert largest <= 300 + 300, largest
    assert background.checkpoints >= 10
    assert wal_pages(store) <= 600


def test_small_commits_wake_the_thread_once_per_threshold_not_each_time(store: Store) -> None:
    """Past the threshold every commit used to wake the thread, and each checkpoint syncs
    the database file: single-row writes lost a third of their rate."""
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")])
    background = checkpointer(store)
    background.pages, background.limit = 40, 10**9
    commits = grown = 0
    # the WAL's growth over the run: a checkpoint that catches up (a slow, loaded machine)
    # lets the next write start the WAL over, so its size alone does not say it
    while grown < 400:
        before = background.wal_pages
        store.execute([S("INSERT INTO t(v) VALUES(randomblob(3900))")])
        after = background.wal_pages
        grown += after - before if after >= before else after
        commits += 1
    time.sleep(0.2)  # let the last wake-up finish
    assert commits > 40
    assert background.checkpoints <= grown // 40 + 1, (background.checkpoints, commits, grown)


def test_closing_the_store_stops_its_checkpointer(tmp_path: Path) -> None:
    before = {t for t in threading.enumerate() if t.name == "litecdc-checkpoint"}
    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    mine = {t for t in threading.enumerate() if t.name == "litecdc-checkpoint"} - before
    assert len(mine) == 1
    store.close()
    assert not any(t.is_alive() for t in mine)
    # the last connection's close checkpoints and removes the WAL, as in plain SQLite
    assert not Path(store.engine.path + "-wal").exists()


def test_a_failing_checkpoint_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An error in the checkpoint (here its connection is gone, standing in for I/O
    trouble that cannot be caused on demand) is logged; the thread carries on and the
    next commit over the threshold checkpoints."""
    path = str(tmp_path / "db.sqlite")
    writer = apsw.Connection(path)
    writer.execute("PRAGMA journal_mode=WAL").fetchall()
    writer.execute("CREATE TABLE t(v)")
    background = BackgroundCheckpointer(writer, path, pages=1)
    working = background._conn
    try:
        broken = apsw.Connection(path)
        broken.close()
        background._conn = broken
        background._wake.set()
        wait_for(lambda: "WAL checkpoint failed, will try again" in caplog.text)
        assert background.checkpoints == 0
        background._conn = working
        writer.execute("INSERT INTO t VALUES(1)")  # the WAL hook wakes the thread again
        wait_for(lambda: background.checkpoints >= 1)
    finally:
        background._conn = working
        background.close()
        writer.close()


def test_without_the_thread_the_writer_checkpoints_after_its_commit(tmp_path: Path) -> None:
    """Cluster nodes run without it (measured: slower on a busy machine, see store.py)."""
    engine = Engine(tmp_path / "db.sqlite", background_checkpoints=False)
    try:
        assert isinstance(engine._checkpointer, InlineCheckpointer)
        journal = Journal(engine)
        journal.commit([S("CREATE TABLE t(v)")])
        for _ in range(15):  # ~1500 pages in all: a checkpoint starts the WAL over
            journal.commit(
                [
                    S(
                        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                        "WHERE i < 50) INSERT INTO t SELECT randomblob(3900) FROM n"
                    )
                ]
            )
        wal = Path(engine.path + "-wal").stat().st_size // (PAGE + 24)
        assert wal <= CHECKPOINT_PAGES + 100
    finally:
        engine.close()


def test_the_wal_is_cut_back_after_one_large_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Soak QA: after one bulk insert the WAL file kept its size (48 MB) for good; SQLite
    cuts it back to journal_size_limit when it starts over after a checkpoint."""
    from litecdc.db import engine as engine_module

    monkeypatch.setattr(engine_module, "WAL_SIZE_LIMIT_BYTES", 1024 * 1024)
    store = Store(NodeConfig(data_dir=tmp_path / "n"))
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")])
        store.execute(
            [S("INSERT INTO t(v) VALUES(randomblob(3900))") for _ in range(1500)], transaction=True
        )
        wal = Path(store.engine.path + "-wal")
        assert wal.stat().st_size > 5 * 1024 * 1024  # the transaction, whole

        def cut_back() -> bool:
            store.execute([S("INSERT INTO t(v) VALUES(1)")])  # a write starts the WAL over
            return wal.stat().st_size <= 1024 * 1024 + 10 * (PAGE + 24)

        wait_for(cut_back)
    finally:
        store.close()


def test_a_checkpoint_failing_after_a_commit_leaves_the_commit_standing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Full-disk QA: a cluster writer ran SQLite's autocheckpoint inside COMMIT; on a
    full disk that checkpoint failed, SQLite ignored it, but APSW raised the Python VFS's
    write error out of the COMMIT that had succeeded — the apply loop then re-applied
    the committed batch forever (UNIQUE constraint failed: _litecdc_journal.cid). The
    disk is a real tmpfs (root only: CI runs as root): room for the commit's WAL frames,
    not for the checkpoint's copy into the database file."""
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "small"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    engine = Engine(disk / "db.sqlite", background_checkpoints=False)
    try:
        journal = Journal(engine)
        rows = (
            "INSERT INTO t(b) SELECT randomblob(3900) FROM (WITH RECURSIVE s(i) AS "
            "(SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 100) SELECT i FROM s)"
        )
        journal.commit([S("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")])
        checkpointer = engine._checkpointer
        assert isinstance(checkpointer, InlineCheckpointer)
        before = checkpointer.wal_pages
        journal.commit([S(rows)])
        step = checkpointer.wal_pages - before  # pages per commit: table and captured images
        while checkpointer.wal_pages + step < CHECKPOINT_PAGES:
            journal.commit([S(rows)])  # (the next one takes the WAL past the threshold)
        stat = os.statvfs(disk)
        with open(disk / "filler", "wb") as filler:  # room for the next commit's frames
            filler.write(b"\0" * (stat.f_bavail * stat.f_frsize - (step + 100) * (PAGE + 24)))
        last = journal.last_cid()
        outcome = journal.commit([S(rows)])  # over 1000 pages: the checkpoint cannot grow
        assert outcome.cid == last + 1 and outcome.results[0].error is None
        assert "WAL checkpoint failed, will try again: database or disk is full" in caplog.text
        assert journal.last_cid() == last + 1
        assert engine._read("SELECT count(*) FROM t")[0][0] % 100 == 0
        (disk / "filler").unlink()
        journal.commit([S(rows)])  # room again: the next commit checkpoints
        assert checkpointer.checkpoints >= 1
    finally:
        engine.close()
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


def test_journal_trims_on_a_cluster_writer_are_checkpointed(tmp_path: Path) -> None:
    """Review: a trim's DELETE committed on its own, past the checkpoint after COMMIT:
    on a quiet cluster node, trims alone grew the WAL to 13,000 pages (54 MB)."""
    engine = Engine(tmp_path / "db.sqlite", background_checkpoints=False, synchronous="off")
    try:
        engine._internal("BEGIN IMMEDIATE")
        engine._internal(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 8000) "
            "INSERT INTO _litecdc_journal(cid, query, snapshot, ts, seed) SELECT i + 1, "
            "printf('INSERT INTO t VALUES(%d, ''%s'')', i, hex(randomblob(300))), 0, 0, 0 FROM n"
        )
        engine._commit_transaction()
        engine._writer.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        for k in range(1, 800):
            assert engine.delete_journal_through(k * 10) == 10  # (as Journal.truncate)
        wal = Path(engine.path + "-wal").stat().st_size // (PAGE + 24)
        assert wal <= CHECKPOINT_PAGES + 100, wal
    finally:
        engine.close()
