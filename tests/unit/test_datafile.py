"""Opening a data directory: a file litecdc cannot use is refused with what is wrong, and
left exactly as it was; a usable one records the data format it was written in."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest

from litecdc import NodeConfig, Statement, Store
from litecdc.db.datafile import expected_columns, unusable
from litecdc.db.engine import Engine
from litecdc.db.schema import (
    DATA_FORMAT,
    DATA_FORMAT_KEY,
    INTERNAL_TABLES,
    NODE_STATE_TABLE,
    RESHAPES_TABLE,
    UNLOGGED_TABLE,
)
from litecdc.errors import ConfigError, DataFileError, LoadError

S = Statement


def open_store(data_dir: Path) -> Store:
    return Store(NodeConfig(data_dir=data_dir, source_workers=0))


def db_file(data_dir: Path) -> Path:
    return Path(NodeConfig(data_dir=data_dir).db_path)


def test_a_new_data_directory_records_the_data_format(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        assert store.engine.node_state(DATA_FORMAT_KEY) == DATA_FORMAT
    finally:
        store.close()


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = db_file(tmp_path)
    garbage = os.urandom(64 * 1024)
    path.write_bytes(garbage)
    with pytest.raises(DataFileError) as refused:
        open_store(tmp_path)
    assert str(refused.value).startswith(
        f"cannot use the node's database {path}: it is not an SQLite database; "
    )
    assert path.read_bytes() == garbage
    assert not Path(f"{path}-wal").exists()
    open_store(tmp_path / "other").close()  # the lock on the refused directory was released
    with pytest.raises(DataFileError):
        open_store(tmp_path)


def test_a_full_disk_at_start_names_the_disk_not_the_file() -> None:
    """Retain QA: a node started on a nearly full disk was told its (sound) database
    file was unusable and to restore it from a backup."""
    error = unusable("/d/db.sqlite", apsw.FullError("database or disk is full"))
    assert str(error) == (
        "cannot use the node's database /d/db.sqlite: the disk it is on is full (database or "
        "disk is full); free space there and start the node again"
    )
    assert "backup" in str(unusable("/d/db.sqlite", apsw.CorruptError("malformed")))


@contextlib.contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """``chattr +i``: refuses writes even to root (the suite runs as root in CI, which
    file modes do not stop); skipped where the file system or user cannot set it."""
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"chattr +i unavailable here: {made.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_database_or_directory_the_node_cannot_write_is_named_as_such(tmp_path: Path) -> None:
    """Config QA: an immutable db.sqlite ended the start with a traceback (the failed
    open's close raised 'disk I/O error' over 'attempt to write a readonly database'); an
    immutable data directory was said to hold a database to restore from a backup."""
    open_store(tmp_path).close()
    path = db_file(tmp_path)
    content = path.read_bytes()
    with _immutable(path), pytest.raises(DataFileError) as refused:
        open_store(tmp_path)
    assert str(refused.value).startswith(f"cannot use the node's database {path}: ")
    assert (
        "(it cannot be opened for writing: Operation not permitted); let the node's user "
        "write there, or start the node on another --data-dir" in str(refused.value)
    )
    assert path.read_bytes() == content
    for left in tmp_path.glob("db.sqlite-*"):
        left.unlink()  # (closed cleanly: none stay; a crash would leave them)
    # an immutable data directory, with the -wal and -shm a crash leaves or without: the
    # node opened the first, then answered every /db/backup 500 (its copy is made there)
    for crash_left in ((), ("-wal", "-shm")):
        for suffix in crash_left:
            Path(f"{path}{suffix}").write_bytes(b"")
        with _immutable(tmp_path), pytest.raises(ConfigError) as refused:
            open_store(tmp_path)
        assert str(refused.value) == (
            f"cannot use the data directory {tmp_path}: no file can be made there (Operation "
            "not permitted), where the node makes its backups' copies and SQLite the "
            "database's -wal and -shm files; let the node's user write there, or start the "
            "node on another --data-dir"
        )
        assert path.read_bytes() == content
    open_store(tmp_path).close()  # and it opens once it may write

    # review: a -shm left by another user (a node run once as root), and a db.sqlite that
    # is a symbolic link (its -wal and -shm files go beside its target)
    shm = Path(f"{path}-shm")  # (for the link too: beside its target, where SQLite looks)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "db.sqlite").symlink_to(path)
    for data_dir in (tmp_path, linked):
        shm.write_bytes(b"")
        with _immutable(shm), pytest.raises(DataFileError) as refused:
            open_store(data_dir)
        assert f"({shm} cannot be opened for writing: Operation not permitted)" in str(
            refused.value
        )
        shm.unlink()
    with _immutable(tmp_path), pytest.raises(DataFileError) as refused:
        open_store(linked)
    assert f"no file can be made in {tmp_path}, where SQLite keeps" in str(refused.value)

    # config QA re-test: a new, immutable data directory ("cannot start: [Errno 1] …",
    # exit status 1: the lock file could not be made)
    empty = tmp_path / "empty"
    empty.mkdir()
    with _immutable(empty), pytest.raises(ConfigError) as refused:
        open_store(empty)
    assert str(refused.value) == (
        f"cannot use the data directory {empty}: {empty}/litecdc.lock cannot be opened for "
        "writing (Operation not permitted); let the node's user write there, or start the "
        "node on another --data-dir"
    )


def _plain_database(path: Path, *statements: str) -> bytes:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path.read_bytes()


def test_an_internal_table_of_another_layout_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = db_file(tmp_path)
    before = _plain_database(
        path, "CREATE TABLE _litecdc_journal(x)", "INSERT INTO _litecdc_journal VALUES(7)"
    )
    with pytest.raises(DataFileError) as refused:
        open_store(tmp_path)
    message = str(refused.value)
    assert "its table _litecdc_journal has the columns (x), this litecdc writes (cid, " in message
    assert "not written by this litecdc version" in message
    # unchanged: still a rollback-journal file (no switch to WAL), no internal table added
    assert path.read_bytes() == before


def test_a_file_written_by_a_newer_litecdc_is_refused(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    store.close()
    conn = apsw.Connection(str(db_file(tmp_path)))
    conn.execute(
        f"UPDATE {NODE_STATE_TABLE} SET value = ? WHERE name = ?",
        (DATA_FORMAT + 1, DATA_FORMAT_KEY),
    )
    conn.close()
    with pytest.raises(DataFileError) as refused:
        open_store(tmp_path)
    assert (
        f"it was written by a newer litecdc (data format {DATA_FORMAT + 1}; this version "
        f"reads format {DATA_FORMAT} and older)"
    ) in str(refused.value)


def test_a_file_from_before_the_format_stamp_is_opened_and_stamped(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    store.close()
    conn = apsw.Connection(str(db_file(tmp_path)))
    conn.execute(f"DELETE FROM {NODE_STATE_TABLE} WHERE name = ?", (DATA_FORMAT_KEY,))
    conn.close()
    store = open_store(tmp_path)
    try:
        assert store.engine.node_state(DATA_FORMAT_KEY) == DATA_FORMAT
        assert store.query([S("SELECT x FROM t")])[0].rows == [(1,)]
    finally:
        store.close()


def _as_data_format(path: Path, version: int) -> None:
    """Make a litecdc file what a litecdc of an older data format left: format 1 had no
    _litecdc_reshapes, formats 1 and 2 no _litecdc_unlogged."""
    conn = apsw.Connection(str(path))
    conn.execute(f"DROP TABLE {UNLOGGED_TABLE}")
    if version < 2:
        conn.execute(f"DROP TABLE {RESHAPES_TABLE}")
    conn.execute(
        f"UPDATE {NODE_STATE_TABLE} SET value = ? WHERE name = ?", (version, DATA_FORMAT_KEY)
    )
    conn.close()


@pytest.mark.parametrize("version", [1, 2])
def test_a_file_of_an_older_data_format_is_upgraded(tmp_path: Path, version: int) -> None:
    """Format 2 added the record of each table's last reshape, format 3 that of the last
    commit that changed a table's rows without row changes: an older file gets the tables
    it lacks, its tables' cids unknown (0) until their next such commit, and the new stamp
    (an older litecdc would neither keep the records nor let DDL pass their names)."""
    store = open_store(tmp_path)
    store.execute([S("CREATE TABLE t(x, y)"), S("INSERT INTO t VALUES(1, 2)")])
    store.execute([S("ALTER TABLE t ADD COLUMN z DEFAULT 3")])
    store.close()
    _as_data_format(db_file(tmp_path), version)
    store = open_store(tmp_path)
    try:
        assert store.engine.node_state(DATA_FORMAT_KEY) == DATA_FORMAT == 3
        table = store.source_table("t")[0]
        assert (table.unlogged_cid, table.reshaped_cid > 0) == (0, version == 2)
        dropped = store.execute([S("ALTER TABLE t DROP COLUMN y")]).cid
        table = store.source_table("t")[0]
        assert (table.reshaped_cid, table.unlogged_cid) == (dropped, dropped)
        assert store.query([S("SELECT x, z FROM t")])[0].rows == [(1, 3)]
    finally:
        store.close()


def test_a_snapshot_of_data_format_1_is_installed_with_what_it_lacks(tmp_path: Path) -> None:
    engine = Engine(tmp_path / "node.sqlite", background_checkpoints=False)
    try:
        peer = Engine(tmp_path / "peer.sqlite", background_checkpoints=False)
        peer.backup(str(tmp_path / "snapshot.sqlite"))
        peer.close()
        _as_data_format(tmp_path / "snapshot.sqlite", 1)
        assert engine.restore_from(str(tmp_path / "snapshot.sqlite"))[DATA_FORMAT_KEY] == 1
        assert engine.node_state(DATA_FORMAT_KEY) == DATA_FORMAT
        assert engine.reshaped_cids() == {} == engine.unlogged_cids()
    finally:
        engine.close()


def test_a_plain_sqlite_file_is_adopted_as_the_starting_state(tmp_path: Path) -> None:
    _plain_database(
        db_file(tmp_path),
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)",
        "INSERT INTO t VALUES(1, 'a')",
    )
    store = open_store(tmp_path)
    try:
        assert store.query([S("SELECT id, v FROM t")])[0].rows == [(1, "a")]
        outcome = store.execute([S("INSERT INTO t VALUES(2, 'b')")])
        assert outcome.cid == 2
        changes = store.changes(after=0, limit=10)
        assert [(c.op, c.after) for c in changes] == [("insert", {"id": 2, "v": "b"})]
    finally:
        store.close()


def test_a_data_directory_that_is_a_file_is_refused(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "data"
    not_a_dir.write_text("x")
    with pytest.raises(
        ConfigError, match=f"^data directory {not_a_dir} is a file, not a directory$"
    ):
        open_store(not_a_dir)
    assert not_a_dir.read_text() == "x"


def test_a_snapshot_of_a_newer_litecdc_is_not_installed(tmp_path: Path) -> None:
    """One version per cluster: a catching-up node refuses a newer node's snapshot before
    anything of its own database changes."""
    engine = Engine(tmp_path / "node.sqlite", background_checkpoints=False)
    try:
        peer = Engine(tmp_path / "peer.sqlite", background_checkpoints=False)
        peer.backup(str(tmp_path / "snapshot.sqlite"))
        peer.close()
        conn = apsw.Connection(str(tmp_path / "snapshot.sqlite"))
        conn.execute(f"UPDATE {NODE_STATE_TABLE} SET value = 99 WHERE name = ?", (DATA_FORMAT_KEY,))
        conn.close()
        with pytest.raises(LoadError, match=r"^snapshot: it was written by a newer litecdc"):
            engine.restore_from(str(tmp_path / "snapshot.sqlite"))
        assert engine.node_state(DATA_FORMAT_KEY) == DATA_FORMAT
    finally:
        engine.close()


def test_every_internal_table_has_an_expected_layout() -> None:
    assert set(expected_columns()) == INTERNAL_TABLES
    assert expected_columns()[NODE_STATE_TABLE] == ["name", "value"]


def test_a_data_dir_or_database_reached_through_a_symbolic_link_opens(tmp_path: Path) -> None:
    """Review QA: a --data-dir under a symbolic link (a linked /data, macOS's /tmp) and a
    db.sqlite linked to a database elsewhere were refused as "not an error; restore it
    from a backup": litecdc's VFS took the base VFS's SQLITE_OK_SYMLINK for an error.
    SQLite's own VFS follows links, with the WAL next to the real file."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real)
    store = open_store(tmp_path / "linked" / "node")
    store.execute([Statement("CREATE TABLE t(x)"), Statement("INSERT INTO t VALUES (1)")])
    store.close()
    assert (real / "node" / "db.sqlite").exists()
    store = open_store(tmp_path / "linked" / "node")
    assert store.query([Statement("SELECT x FROM t")])[0].rows == [(1,)]
    store.close()
    # db.sqlite itself a link to a database in another directory
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(real / "node" / "db.sqlite", elsewhere / "db.sqlite")
    (real / "node" / "db.sqlite").symlink_to(elsewhere / "db.sqlite")
    store = open_store(real / "node")
    store.execute([Statement("INSERT INTO t VALUES (2)")])
    assert store.query([Statement("SELECT x FROM t ORDER BY x")])[0].rows == [(1,), (2,)]
    assert (elsewhere / "db.sqlite-wal").exists()  # next to the real file, as SQLite does
    store.close()


def test_a_data_directory_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    """Review: a disk with no room for one more file was told to 'let the node's user
    write there'. A real tmpfs out of inodes (mounting it needs root, as CI runs)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=16", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        data_dir = disk / "node"
        data_dir.mkdir()
        (data_dir / "litecdc.lock").touch()  # (opened, not made: the probe meets the limit)
        with contextlib.suppress(OSError):
            for i in range(100):
                (disk / f"filler{i}").touch()
        with pytest.raises(ConfigError) as refused:
            open_store(data_dir)
        assert str(refused.value) == (
            f"cannot use the data directory {data_dir}: the disk it is on is full (No space "
            "left on device); free space there and start the node again"
        )
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)
