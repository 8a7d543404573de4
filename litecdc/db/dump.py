"""Dump user tables as SQL statements, with values written exactly (see sqltext)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import apsw

from litecdc.db.schema import USER_OBJECTS
from litecdc.db.sqltext import POSITIVE_ZERO, parse_template, sql_literal
from litecdc.errors import DataTypeError, RequestError


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def dump_statements(
    conn: apsw.Connection, *, transaction: bool, tables: Sequence[str] | None = None
) -> Iterator[str]:
    """Yield CREATE and INSERT statements that rebuild every user object of ``conn`` — or,
    given ``tables`` (rqlite's ``/db/backup?fmt=sql&tables=a,b``), those tables with their
    indexes and triggers (a view when named), and nothing of any other.

    Every table is created first, then the rows of each, then ``sqlite_sequence``'s
    entries, then indexes, views and triggers: no INSERT names a table that does not exist
    yet (with foreign keys enforced, SQLite refuses an insert into a table whose parent
    table is missing) and no trigger fires while rows are inserted. Rows keep their rowid
    where no column holds it (as sqlite3's ``.dump --preserve-rowids``): it is such a
    table's key in change events, and rowids renumbered by a load would make them differ
    from the file's. With ``transaction`` the output is wrapped in BEGIN/COMMIT like
    sqlite3's ``.dump``.
    """
    if transaction:
        yield "PRAGMA foreign_keys=OFF;"
        yield "BEGIN TRANSACTION;"
    conn.execute("BEGIN")  # one consistent read
    try:
        if tables is not None:
            _check_named(conn, tables)
        chosen = (
            ""
            if tables is None
            else " AND lower(tbl_name) IN (SELECT lower(value) FROM json_each(?))"
        )
        objects = conn.execute(
            f"SELECT type, name, sql FROM sqlite_schema WHERE {USER_OBJECTS} AND sql IS NOT NULL"
            f"{chosen} ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 "
            "WHEN 'view' THEN 2 ELSE 3 END, rowid",
            () if tables is None else (json.dumps(list(tables)),),
        ).fetchall()
        tables = [str(name) for kind, name, _ in objects if kind == "table"]
        for kind, _, sql in objects:
            if kind == "table":
                yield _ended(str(sql))
        for name in tables:
            yield from _rows(conn, name)
        yield from _sequences(conn, tables)
        for kind, _, sql in objects:
            if kind != "table":
                yield _ended(str(sql))
    finally:
        conn.execute("COMMIT")
    if transaction:
        yield "COMMIT;"


def _check_named(conn: apsw.Connection, tables: Sequence[str]) -> None:
    """Refuse names that are not a table or view of the database (SQLite's names: ASCII
    letters in any case): a dump would leave them out without a word."""
    unknown = [
        str(name)
        for (name,) in conn.execute(
            "SELECT value FROM json_each(?) WHERE lower(value) NOT IN (SELECT lower(name) "
            f"FROM sqlite_schema WHERE type IN ('table', 'view') AND {USER_OBJECTS})",
            (json.dumps(list(tables)),),
        )
    ]
    if unknown:
        raise RequestError(
            f"tables: no such table: {', '.join(unknown)} (a dump of chosen tables names "
            "tables or views of the database, separated by commas)"
        )


def _ended(sql: str) -> str:
    """A schema object's SQL ended with ``;`` — after a newline when it ends in a ``--``
    comment, which SQLite keeps in the stored SQL and which swallowed the ``;`` (QA: such
    a view's dump loaded neither here nor into sqlite3)."""
    return sql.rstrip() + parse_template(sql).terminator


def _value_literal(value: Any) -> str:
    """A stored value as the dump writes it: no minus ever comes before a value of a
    VALUES list, so +0.0 is written as sqlite3's .dump writes it."""
    text = sql_literal(value)
    return "0.0" if text == POSITIVE_ZERO else text


def _rows(conn: apsw.Connection, name: str) -> Iterator[str]:
    """INSERT statements for the rows of table ``name``."""
    info = conn.execute(
        "SELECT name, type, pk, hidden FROM pragma_table_xinfo(?)", (name,)
    ).fetchall()
    # generated columns are computed again on insert; they cannot be given values
    columns = [_quote(str(column)) for column, _, _, hidden in info if hidden == 0]
    rowid = _hidden_rowid(conn, name, info)
    listed = ",".join([rowid, *columns] if rowid else columns)
    quoted = _quote(name)
    insert = f"INSERT INTO {quoted}({listed}) VALUES("
    try:
        for row in conn.execute(f"SELECT {listed} FROM {quoted}"):
            yield f"{insert}{','.join(map(_value_literal, row))});"
    except UnicodeDecodeError as exc:
        raise DataTypeError(
            f"table {name} holds text that is not valid UTF-8 ({exc.reason} at byte "
            f"{exc.start}: {exc.object[exc.start : exc.start + 4]!r}); litecdc keeps "
            "text as UTF-8: store such values as BLOBs (CAST(column AS BLOB))"
        ) from None


def _hidden_rowid(conn: apsw.Connection, name: str, info: list[tuple[Any, ...]]) -> str | None:
    """The name by which to read and insert the rowid of table ``name`` when no column
    holds it (no INTEGER PRIMARY KEY); None when one does, or it has none (WITHOUT ROWID,
    virtual tables), or its columns take all three of the rowid's names."""
    listed = conn.execute(
        "SELECT type, wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (name,)
    ).fetchall()
    if not listed or listed[0][0] != "table" or listed[0][1]:
        return None
    key = [(str(column), str(declared).upper()) for column, declared, pk, _ in info if pk]
    if len(key) == 1 and key[0][1] == "INTEGER":
        # an INTEGER PRIMARY KEY holds the rowid — unless declared DESC (SQLite's quirk):
        # SQLite itself says, reading it as the rowid or as a column
        plan = conn.execute(f"EXPLAIN SELECT {_quote(key[0][0])} FROM {_quote(name)}")
        if any(step[1] == "Rowid" for step in plan):
            return None
    taken = {str(column).lower() for column, *_ in info}
    return next((alias for alias in ("rowid", "oid", "_rowid_") if alias not in taken), None)


def _sequences(conn: apsw.Connection, tables: list[str]) -> Iterator[str]:
    """``sqlite_sequence``'s entries of ``tables`` (AUTOINCREMENT's high-water marks): the
    rows alone would give the largest rowid left, and a load would reuse deleted ones."""
    if not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'").fetchall():
        return
    wanted = set(tables)
    for name, seq in conn.execute("SELECT name, seq FROM sqlite_sequence").fetchall():
        if name in wanted:
            table, high = sql_literal(name), sql_literal(seq)
            yield f"DELETE FROM sqlite_sequence WHERE name = {table};"
            yield f"INSERT INTO sqlite_sequence(name, seq) VALUES({table}, {high});"
