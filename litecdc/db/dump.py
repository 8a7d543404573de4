"""Dump user tables as SQL statements, with values written exactly (see sqltext)."""

from __future__ import annotations

from collections.abc import Iterator

import apsw

from litecdc.db.schema import USER_OBJECTS
from litecdc.db.sqltext import sql_literal
from litecdc.errors import DataTypeError


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def dump_statements(conn: apsw.Connection, *, transaction: bool) -> Iterator[str]:
    """Yield CREATE and INSERT statements that rebuild every user object of ``conn``.

    Tables come first (with their rows), then indexes, views and triggers, so that
    triggers do not fire while rows are inserted. With ``transaction`` the output
    is wrapped in BEGIN/COMMIT like sqlite3's ``.dump``.
    """
    if transaction:
        yield "PRAGMA foreign_keys=OFF;"
        yield "BEGIN TRANSACTION;"
    conn.execute("BEGIN")  # one consistent read
    try:
        objects = conn.execute(
            f"SELECT type, name, sql FROM sqlite_schema WHERE {USER_OBJECTS} AND sql IS NOT NULL "
            "ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 WHEN 'view' THEN 2 "
            "ELSE 3 END, rowid"
        ).fetchall()
        for kind, name, sql in objects:
            name = str(name)
            yield f"{sql};"
            if kind != "table":
                continue
            quoted = _quote(name)
            # generated columns are computed again on insert; they cannot be given values
            columns = [
                _quote(str(column))
                for column, hidden in conn.execute(
                    "SELECT name, hidden FROM pragma_table_xinfo(?)", (name,)
                )
                if hidden == 0
            ]
            listed = ",".join(columns)
            rows = conn.execute(f"SELECT {listed} FROM {quoted}")
            insert = f"INSERT INTO {quoted}({listed}) VALUES("
            try:
                for row in rows:
                    yield f"{insert}{','.join(map(sql_literal, row))});"
            except UnicodeDecodeError as exc:
                raise DataTypeError(
                    f"table {name} holds text that is not valid UTF-8 ({exc.reason} at byte "
                    f"{exc.start}: {exc.object[exc.start : exc.start + 4]!r}); litecdc keeps "
                    "text as UTF-8: store such values as BLOBs (CAST(column AS BLOB))"
                ) from None
    finally:
        conn.execute("COMMIT")
    if transaction:
        yield "COMMIT;"
