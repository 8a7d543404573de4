"""Opening a node's SQLite file: refuse, with what is wrong, a file litecdc cannot use.

A data directory outlives the litecdc that wrote it. Before the engine creates its
internal tables it checks that the file is an SQLite database at all, that it was not
written by a newer litecdc (the data format recorded in ``_litecdc_node_state``), and
that internal tables already there have the columns this version writes — otherwise
the first write would fail deep inside, or worse, succeed against another layout.
A plain SQLite file without litecdc's tables is adopted as it is (standalone use of an
existing database); its existing rows are the starting state, not change events.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import apsw

from litecdc.db.schema import (
    CREATE_CDC_STATE,
    CREATE_HOLDS,
    CREATE_INTERNAL,
    DATA_FORMAT,
    DATA_FORMAT_KEY,
    INTERNAL_TABLES,
    NODE_STATE_TABLE,
)
from litecdc.errors import DataFileError, LitecdcError

#: the first 16 bytes of every SQLite database file
SQLITE_HEADER = b"SQLite format 3\x00"
#: offset of an SQLite file's "file format write version" and "read version" bytes: "1 for
#: rollback journalling modes and 2 for WAL journalling mode" (sqlite.org/fileformat2.html)
FILE_FORMAT_VERSIONS = 18

#: what a file that is not a usable database makes SQLite raise, and what that means
_UNUSABLE = {
    apsw.NotADBError: "it is not an SQLite database",
    apsw.CorruptError: "the database file is corrupt",
    apsw.CantOpenError: "it cannot be opened",
    apsw.ReadOnlyError: "it is read-only",
    apsw.PermissionsError: "permission denied",
}
#: errors that may come from access to the file or its directory rather than its content
_ACCESS_ERRORS = (apsw.CantOpenError, apsw.ReadOnlyError, apsw.PermissionsError, apsw.IOError)


@functools.cache
def expected_columns() -> dict[str, list[str]]:
    """Each internal table's columns, in order, as this version creates them (do not
    modify the answer: it is shared)."""
    conn = apsw.Connection(":memory:")
    try:
        conn.execute(CREATE_INTERNAL + CREATE_CDC_STATE + CREATE_HOLDS)
        return {table: _columns(conn, table) for table in sorted(INTERNAL_TABLES)}
    finally:
        conn.close()


def _columns(conn: apsw.Connection, table: str) -> list[str]:
    return [str(row[1]) for row in conn.execute("SELECT * FROM pragma_table_info(?)", (table,))]


def check_paths(path: str) -> None:
    """The database file and its ``-wal``/``-shm`` companions are files or absent: SQLite
    reports a directory or a dangling link there as "not an error" or a disk I/O error,
    pointing a user at the wrong fix (CLI QA: tracebacks, "restore it from a backup")."""
    for where in (path, f"{path}-wal", f"{path}-shm"):
        what = _not_a_file(Path(where))
        if what is not None:
            raise DataFileError(
                f"cannot use the node's database {path}: {where} is {what}, where SQLite "
                "keeps a file; move it away or start the node on another --data-dir"
            )


def _not_a_file(where: Path) -> str | None:
    if where.is_symlink() and not where.exists():
        return f"a symbolic link to {os.readlink(where)!r}, which does not exist"
    if not where.exists() or where.is_file():
        return None
    return "a directory" if where.is_dir() else "not a regular file"


def unusable(path: str, exc: apsw.Error) -> DataFileError:
    """The error for an SQLite error met while opening ``path``."""
    if isinstance(exc, apsw.FullError):
        # the disk, not the file: the file is fine once there is room (retain QA: told to
        # restore a good file from a backup)
        return DataFileError(
            f"cannot use the node's database {path}: the disk it is on is full ({exc}); "
            "free space there and start the node again"
        )
    reason = next((text for kind, text in _UNUSABLE.items() if isinstance(exc, kind)), None)
    detail = reason or str(exc)
    access = _access_problem(Path(path)) if isinstance(exc, _ACCESS_ERRORS) else None
    if access is not None:
        # (config QA: a read-only directory or file was met with "restore it from a
        # backup", and the file was fine)
        return DataFileError(
            f"cannot use the node's database {path}: {detail} ({access}); let the node's "
            "user write there, or start the node on another --data-dir"
        )
    return DataFileError(
        f"cannot use the node's database {path}: {detail}; restore it from a backup "
        "(GET /db/backup) or start the node on another --data-dir"
    )


def _access_problem(path: Path) -> str | None:
    """Why the node cannot write ``path`` or create files beside it (SQLite keeps its
    ``-wal`` and ``-shm`` files there), found by trying; None when it can. Trying, not
    permission bits: root passes those, and an immutable file or a read-only mount
    refuses root too."""
    # (where the file really is: a db.sqlite that is a symbolic link has its -wal and
    # -shm files beside its target, review)
    real = Path(os.path.realpath(path))
    for where, what in ((path, "it"), (Path(f"{real}-wal"), None), (Path(f"{real}-shm"), None)):
        # (review: a -wal or -shm left by another user — a node run once as root — made
        # "it is read-only; restore it from a backup", the database being fine)
        if where.exists():
            try:
                os.close(os.open(where, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY))
            except OSError as exc:
                return f"{what or where} cannot be opened for writing: {exc.strerror or exc}"
    directory = real.parent
    if (refused := file_creation_error(directory)) is not None:
        return (
            f"no file can be made in {directory}, where SQLite keeps the database's -wal "
            f"and -shm files: {refused.strerror or refused}"
        )
    return None


#: the name of the file made (and removed at once) to find out whether one can be
PROBE_FILE_PREFIX = ".litecdc-probe-"


def file_creation_error(directory: Path) -> OSError | None:
    """The error making a file in ``directory`` meets, found by trying (root passes
    permission bits; an immutable directory or a read-only mount refuses root too), or
    None when a file can be made there."""
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_FILE_PREFIX, dir=directory)
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(probe)
    return None


def layout_problem(conn: apsw.Connection) -> str | None:
    """Why litecdc cannot use this file's internal tables: written by a newer litecdc, or
    tables of another layout; None when it can (none there yet is fine).

    Run before CREATE_INTERNAL, whose IF NOT EXISTS would keep a table of another layout.
    """
    present = {
        str(row[0])
        for row in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
        if str(row[0]) in INTERNAL_TABLES
    }
    if NODE_STATE_TABLE in present:
        rows = conn.execute(
            f"SELECT value FROM {NODE_STATE_TABLE} WHERE name = ?", (DATA_FORMAT_KEY,)
        ).fetchall()
        found = rows[0][0] if rows else None
        if found is not None and (not isinstance(found, int) or found > DATA_FORMAT):
            return (
                f"it was written by a newer litecdc (data format {found!r}; this version "
                f"reads format {DATA_FORMAT} and older)"
            )
    expected = expected_columns()
    for table in sorted(present):
        columns = _columns(conn, table)
        if columns != expected[table]:
            return (
                f"its table {table} has the columns ({', '.join(columns)}), this litecdc "
                f"writes ({', '.join(expected[table])}): it was not written by this "
                "litecdc version"
            )
    return None


def check_existing(conn: apsw.Connection, path: str) -> None:
    """Raise DataFileError when the node cannot use the file at ``path`` (see layout_problem)."""
    problem = layout_problem(conn)
    if problem is not None:
        raise DataFileError(
            f"cannot use the node's database {path}: {problem}; run the litecdc that wrote "
            "it, or start this one on another --data-dir (and load that litecdc's "
            "GET /db/backup?fmt=sql into it)"
        )


def stamp_format(conn: apsw.Connection) -> None:
    """Record this version's data format (after CREATE_INTERNAL, which created what an
    older format lacks: format 1 had no ``_litecdc_reshapes``). An older litecdc then
    refuses the file: it would neither keep that table nor let DDL pass its name."""
    conn.execute(
        f"INSERT INTO {NODE_STATE_TABLE}(name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = excluded.value WHERE value < excluded.value",
        (DATA_FORMAT_KEY, DATA_FORMAT),
    )


def mark_rollback_journal(path: str) -> None:
    """Make the backup copy at ``path`` a DELETE (rollback journal) mode database.

    ``path`` is a complete backup with no -wal file beside it, so its journal mode is only
    these two header bytes; 1, 1 is what ``PRAGMA journal_mode=DELETE`` leaves there.
    """
    with open(path, "r+b") as file:
        file.seek(FILE_FORMAT_VERSIONS)
        versions = file.read(2)
        if versions not in (b"\x01\x01", b"\x02\x02"):
            raise LitecdcError(
                f"backup: the copy's file format versions are {versions.hex()}, not WAL or "
                "rollback journal; cannot make a DELETE mode copy"
            )
        file.seek(FILE_FORMAT_VERSIONS)
        file.write(b"\x01\x01")
