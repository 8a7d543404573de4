"""SQL text for ``/db/load``: split into statements, a dump's transaction wrapper removed.

rqlite runs an uploaded SQL text on the database as it is (an uploaded SQLite *file*
replaces the database). A dump — sqlite3's ``.dump``, rqlite's or litecdc's
``/db/backup?fmt=sql`` — wraps its statements in ``PRAGMA foreign_keys=OFF; BEGIN
TRANSACTION; … COMMIT;``. litecdc runs every load as one transaction of its own and
refuses transaction control and connection PRAGMAs in writes, so those wrapper
statements are dropped; everything else runs as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import apsw

#: BEGIN [DEFERRED|IMMEDIATE|EXCLUSIVE] [TRANSACTION], COMMIT/END [TRANSACTION]
_WRAPPER = re.compile(
    r"(?:BEGIN(?:\s+(?:DEFERRED|IMMEDIATE|EXCLUSIVE))?|COMMIT|END)(?:\s+TRANSACTION)?\s*;?",
    re.IGNORECASE,
)
#: PRAGMA foreign_keys=OFF (a dump's first line), in any of SQLite's spellings
_FOREIGN_KEYS_PRAGMA = re.compile(
    r"PRAGMA\s+(?:main\s*\.\s*)?foreign_keys\s*(?:=\s*[\w']+|\(\s*[\w']+\s*\))\s*;?",
    re.IGNORECASE,
)
#: a dump's copy of the query planner's statistics (sqlite3's .dump and rqlite's dump write
#: them after ``ANALYZE sqlite_schema``): a client may not write them (db/access.py)
_NAME = r"[\"`\[]?{}[\"`\]]?"
_MAIN = r"(?:" + _NAME.format("main") + r"\s*\.\s*)?"
_STATISTICS_ROW = re.compile(
    r"(?:INSERT|REPLACE)\s+(?:OR\s+\w+\s+)?INTO\s+"
    + _MAIN
    + _NAME.format("sqlite_stat[1-4]")
    + r"[\s(]",
    re.IGNORECASE,
)
#: the line before them, which makes the statistics tables (emptying them when they exist:
#: a node that had run ANALYZE refused that too — review QA)
_STATISTICS_TABLES = re.compile(
    r"ANALYZE\s+" + _MAIN + _NAME.format("sqlite_(?:schema|master)") + r"\s*;?", re.IGNORECASE
)
_LEADING_COMMENTS = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)


def split_statements(sql: str) -> list[str]:
    """The statements of ``sql`` in order, each with its ``;`` (the last may have none).

    A ``;`` inside a string, a quoted name, a comment or a CREATE TRIGGER body does not
    end a statement: SQLite's own ``sqlite3_complete`` (``apsw.complete``) decides at
    each ``;`` outside quotes and comments, which this scan finds in one pass.
    """
    statements: list[str] = []
    start, i, n = 0, 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in "'\"`[":
            close = "]" if ch == "[" else ch
            end = sql.find(close, i + 1)
            while end != -1 and close != "]" and sql.startswith(close * 2, end):
                end = sql.find(close, end + 2)  # a doubled quote stays inside
            i = n if end == -1 else end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end == -1 else end + 2
        elif ch == ";":
            i += 1
            # (a NUL, which apsw.complete refuses, only decides nothing here: the
            # statement holding it fails to run, "null character in query" — fuzz QA)
            if apsw.complete(sql[start:i].replace("\x00", " ")):
                statements.append(sql[start:i])
                start = i
        else:
            i += 1
    if _body(sql[start:]):
        statements.append(sql[start:])  # a last statement without its ';'
    return statements


def _body(statement: str) -> str:
    """The statement without the comments and blanks before it, and trailing blanks."""
    lead = _LEADING_COMMENTS.match(statement)
    return statement[lead.end() if lead else 0 :].rstrip()


def is_dump_wrapper(statement: str) -> bool:
    """Whether ``statement`` is a dump's transaction wrapper (BEGIN/COMMIT/END or
    ``PRAGMA foreign_keys=…``), which a load leaves out."""
    body = _body(statement)
    return bool(_WRAPPER.fullmatch(body) or _FOREIGN_KEYS_PRAGMA.fullmatch(body))


#: what a dump's ``PRAGMA foreign_keys=OFF`` becomes in a load on a node with --fk: the
#: closest a transaction can come (foreign_keys cannot change inside one) — every check
#: waits for the end of the load, when the rows must hold together
DEFER_FOREIGN_KEYS = "PRAGMA defer_foreign_keys=ON;"


def load_statements(text: str, *, defer_foreign_keys: bool = False) -> list[str]:
    """The statements of an uploaded SQL text that a load runs, in order (no empty ones,
    no dump wrapper, no rows of the planner's statistics — a dump of an analyzed database
    could not load: run ANALYZE on the tables afterwards; with ``defer_foreign_keys``, a
    dump's ``PRAGMA foreign_keys=OFF`` becomes ``DEFER_FOREIGN_KEYS``)."""
    out = []
    for statement in split_statements(text):
        body = _body(statement)
        if defer_foreign_keys and _turns_foreign_keys_off(body):
            out.append(DEFER_FOREIGN_KEYS)
        elif (
            body not in ("", ";")
            and not is_dump_wrapper(statement)
            and not _STATISTICS_ROW.match(body)
            and not _STATISTICS_TABLES.fullmatch(body)
        ):
            out.append(statement)
    return out


def _turns_foreign_keys_off(body: str) -> bool:
    if not _FOREIGN_KEYS_PRAGMA.fullmatch(body):
        return False
    value = re.search(r"[=(]\s*'?(\w+)", body)
    return value is not None and value.group(1).lower() in ("off", "0", "false", "no")


def children_first(tables: Sequence[str], references: Mapping[str, set[str]]) -> list[str]:
    """``tables`` ordered so that each comes before the tables it references
    (``references``: table → the tables its foreign keys name, in any case), in their
    given order otherwise; tables referencing each other in a cycle keep their order."""
    left = list(tables)
    lowered = {t: {r.lower() for r in references.get(t, set())} - {t.lower()} for t in tables}
    ordered: list[str] = []
    while left:
        # the first table no table still to empty references; any, in a cycle
        names = {t.lower() for t in left}
        referenced = set().union(*(lowered[t] & names for t in left))
        pick = next((t for t in left if t.lower() not in referenced), left[0])
        ordered.append(pick)
        left.remove(pick)
    return ordered
