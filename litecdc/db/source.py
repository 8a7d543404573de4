"""The pull source: what the pipeline reads from a node's SQLite file.

Three reads, each inside ONE SQLite read transaction (``Engine.read_consistent``) so
that it reports the cid it saw (the journal's head in that transaction):

- ``describe``: a table's columns, the Arrow type each is mirrored as, its key, the
  cid of its last reshape (``reshaped_cid``: created, or changed other than by adding a
  column — a copy from before it is stale) and the last cid that changed the rows under
  its name without row changes (``unlogged_cid``: a changes read across it is refused;
  see db/reshape.py);
- ``read_rows``: a snapshot chunk — rows of a key range in key order (keyset paging by
  the last key, so a chunk costs one index seek whatever its position);
- ``read_table_changes``: a table's row changes in a cid range, as typed events
  (an update that changes the key becomes a delete of the old key and an upsert).

SQLite columns are dynamically typed; each column is mirrored as the Arrow type its
declared type's affinity implies (``arrow_type_name``). Integers in a REAL column become
floats (SQLite itself does that on storage); any other value that does not fit is a
``DataTypeError`` naming the table, column and key, never a silent conversion — a blob
in a TEXT column or text in a BLOB column too: their bytes are not the other type's
value (UTF-8 or not), and once converted nothing could tell them apart.

Keys are compared by SQLite, never by the reader: ranges, pages and split keys follow
the key columns' collations (NOCASE, RTRIM, an application's own) and SQLite's order of
storage classes (NULL, numbers, text, blobs), and keys travel as the values stored —
an integer in an untyped key column stays an integer, even though the column is
mirrored as text. A primary key of a rowid table other than INTEGER PRIMARY KEY may
hold NULLs, several rows of them (``SourceTable.key_nulls``): NULLs sort first, rows
of one key come in rowid order, and a page never ends inside such a run of rows.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import msgspec
import pyarrow as pa
import pyarrow.compute

from litecdc.db.schema import (
    CDC_STATE_TABLE,
    CHANGES_TABLE,
    INTERNAL_PREFIX,
    JOURNAL_TABLE,
    RESHAPES_TABLE,
    SEQ_BITS,
    UNLOGGED_TABLE,
    last_change_id,
)
from litecdc.errors import (
    DataTypeError,
    NotFoundError,
    PositionUnavailableError,
    RequestError,
    TableReshapedError,
    UnloggedChangesError,
)
from litecdc.wire import (
    ARROW_TYPES,
    CID_COLUMN,
    OP_COLUMN,
    ROWID_COLUMN,
    SEQ_COLUMN,
    encode_key,
    jsonable,
    name_folds,
)

_decode_image = msgspec.msgpack.Decoder(dict[str, Any]).decode


#: words of declared types of NUMERIC affinity whose columns hold numbers in practice;
#: every other name with that affinity (JSON, UUID, INET, EMAIL, URL…) is mirrored as text
_NUMBER_WORDS = frozenset(
    {"NUM", "DEC", "NUMBER", "AUTONUMBER", "FIXED", "SERIAL", "SMALLSERIAL", "BIGSERIAL",
     "YEAR", "BIT", "CURRENCY", "SINGLE", "PERCENT", "COUNTER", "OID", "XID"}
)  # fmt: skip
#: parts of such words (BIGNUMERIC, SMALLDECIMAL, SMALLMONEY…); not NUMBER, a part of
#: names of text kinds (PHONENUMBER)
_NUMBER_PARTS = ("NUMERIC", "DECIMAL", "MONEY")


def arrow_type_name(declared: str, *, strict: bool = False) -> str:
    """The Arrow type a column of SQLite declared type ``declared`` is mirrored as.

    SQLite's affinity rules, in their order: INT → int64; CHAR/CLOB/TEXT → string;
    BLOB → binary; REAL/FLOA/DOUB → float64. Then what has NUMERIC affinity:
    BOOL → int64 (SQLite stores 0/1), DATE/TIME → string (stored as text by the date
    functions), the names of number kinds (NUMBER, CURRENCY…, and words holding NUMERIC,
    DECIMAL or MONEY, as BIGNUMERIC) → float64,
    and any other name → string: NUMERIC affinity too, but such columns (JSON, UUID,
    INET, EMAIL, URL…) hold text, and text holds numbers exactly as well (types QA: a
    JSON column's every value stopped its subscription; INET and URL columns did too).
    A column with no declared type can hold anything; it is mirrored as text (numbers
    written out exactly), and so is a STRICT table's ``ANY`` column, which has no
    affinity either (QA: it was mirrored as float64).
    """
    t = declared.upper()
    if strict and t == "ANY":
        return "string"
    if "INT" in t:
        return "int64"
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return "string"
    if "BLOB" in t:
        return "binary"
    if not t.strip():
        return "string"
    if "REAL" in t or "FLOA" in t or "DOUB" in t:
        return "float64"
    if "BOOL" in t:
        return "int64"
    if "DATE" in t or "TIME" in t:
        return "string"
    words = re.findall(r"[A-Z]+", t)
    if _NUMBER_WORDS.intersection(words) or any(p in w for w in words for p in _NUMBER_PARTS):
        return "float64"
    return "string"


@dataclass(frozen=True)
class SourceTable:
    """A table as the pull source serves it (JSON: ``pipeline.tables.TableSpec``)."""

    name: str
    columns: tuple[tuple[str, str, str, bool], ...]  # (name, declared type, arrow, not null)
    key: tuple[str, ...]
    rowid_key: bool  # key is ROWID_COLUMN (no declared primary key)
    defaults: tuple[str | None, ...] = ()  # each column's DEFAULT as SQL text (None: none)
    #: per key column: whether it can hold NULL (a rowid table's declared PRIMARY KEY
    #: other than INTEGER PRIMARY KEY, without NOT NULL: SQLite lets several rows hold
    #: NULL there); () when none can
    key_nulls: tuple[bool, ...] = ()
    #: how SQL reaches the rowid (``rowid``, or ``_rowid_``/``oid`` when a column is named
    #: so); None for a WITHOUT ROWID table
    rowid_name: str | None = "rowid"
    #: whether the key is the rowid: no declared primary key, or an INTEGER PRIMARY KEY
    #: (which SQLite keeps as the rowid: a change of it is a change of the rowid)
    key_is_rowid: bool = False
    #: the cid that created the table or last changed it other than by adding a column
    #: (db/reshape.py): a copy of it from before then misses what that did. 0: unknown (a
    #: table of a data directory from before litecdc recorded it, untouched since)
    reshaped_cid: int = 0
    #: the last cid that changed the rows under the table's name without row changes
    #: (dropped, renamed, created from a query, a column dropped or given a DEFAULT; see
    #: db/reshape.py): its change events after an earlier cid cannot rebuild it past
    #: then. 0: none recorded
    unlogged_cid: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.name,
            "columns": [
                {"name": n, "declared_type": d, "arrow": a, "not_null": nn, "default": dflt}
                for (n, d, a, nn), dflt in zip(
                    self.columns,
                    self.defaults or (None,) * len(self.columns),
                    strict=True,
                )
            ],
            "key": list(self.key),
            "reshaped_cid": self.reshaped_cid,
            "unlogged_cid": self.unlogged_cid,
        }

    @property
    def column_names(self) -> list[str]:
        return [c[0] for c in self.columns]

    @property
    def stored_columns(self) -> list[str]:
        """The table's own columns (without the rowid key column)."""
        return [c[0] for c in self.columns if not (self.rowid_key and c[0] == ROWID_COLUMN)]

    def key_sql(self) -> list[str]:
        return [self.rowid_sql] if self.rowid_key else [_quote(k) for k in self.key]

    def order_sql(self) -> str:
        """ORDER BY of key order: the key, then the rowid where rows may share a key
        (NULLs), so that a page can end inside such a run and the next go on from there."""
        order = self.key_sql()
        if any(self.key_nulls):
            order.append(self.rowid_sql)
        return ", ".join(order)

    @property
    def rowid_sql(self) -> str:
        if self.rowid_name is None:
            raise RequestError(f"table {self.name} has no rowid")
        return self.rowid_name

    def row_schema(self, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
        fields = [pa.field(n, ARROW_TYPES[a]) for n, _, a, _ in self.columns]
        return pa.schema([*fields, pa.field(CID_COLUMN, pa.int64(), nullable=False)], metadata)

    def change_schema(self, metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
        fields = [pa.field(n, ARROW_TYPES[a]) for n, _, a, _ in self.columns]
        head = [
            pa.field(CID_COLUMN, pa.int64(), nullable=False),
            pa.field(SEQ_COLUMN, pa.int64(), nullable=False),
            pa.field(OP_COLUMN, pa.string(), nullable=False),
        ]
        return pa.schema([*head, *fields], metadata)


def _rows(conn: apsw.Connection, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
    return rows


HEAD_CID_SQL = f"SELECT max(cid) FROM {JOURNAL_TABLE}"


def head_cid(conn: apsw.Connection) -> int:
    return int(_rows(conn, HEAD_CID_SQL)[0][0])


def pruned_cid(conn: apsw.Connection) -> int:
    """The cid the change log was pruned through (0 before anything was)."""
    try:
        rows = _rows(conn, f"SELECT value FROM {CDC_STATE_TABLE} WHERE name = 'pruned'")
    except apsw.SQLError:  # no CDC state table yet
        return 0
    return int(rows[0][0]) if rows else 0


def oldest_change_cid(conn: apsw.Connection) -> int | None:
    """The cid of the oldest change still kept (one B-tree seek, not a count)."""
    rows = _rows(conn, f"SELECT cid FROM {CHANGES_TABLE} ORDER BY id LIMIT 1")
    return int(rows[0][0]) if rows else None


def webhook_hwm(conn: apsw.Connection) -> int | None:
    """The CDC webhook's high watermark; None when no CDC service recorded one."""
    try:
        rows = _rows(conn, f"SELECT value FROM {CDC_STATE_TABLE} WHERE name = 'hwm'")
    except apsw.SQLError:  # no CDC state table yet
        return None
    return int(rows[0][0]) if rows else None


def reshaped_cid(conn: apsw.Connection, table: str) -> int:
    """The cid of ``table``'s last reshape (db/reshape.py); 0 when none is recorded."""
    try:
        rows = _rows(conn, f"SELECT cid FROM {RESHAPES_TABLE} WHERE name = ?", (table,))
    except apsw.SQLError:  # a file the engine has not opened yet (a page worker's read)
        return 0
    return int(rows[0][0]) if rows else 0


def unlogged_cid(conn: apsw.Connection, table: str, *, after: int | None = None) -> int:
    """The last cid that changed the rows under the name ``table`` without row changes
    (db/reshape.py) — with ``after``, the first such cid after it; 0 when there is none."""
    which = "max(cid)" if after is None else "min(cid)"
    try:
        rows = _rows(
            conn,
            f"SELECT {which} FROM {UNLOGGED_TABLE} WHERE name = ? AND cid > ?",
            (table, -1 if after is None else after),
        )
    except apsw.SQLError:  # a file the engine has not opened yet (a page worker's read)
        return 0
    return int(rows[0][0] or 0) if rows else 0


def user_tables(conn: apsw.Connection) -> list[str]:
    rows = _rows(
        conn,
        "SELECT name FROM pragma_table_list WHERE schema = 'main' AND type = 'table' ORDER BY name",
    )
    return [r[0] for r in rows if not _is_hidden(r[0])]


def describe(conn: apsw.Connection, table: str) -> SourceTable:
    """The table's columns and key; NotFoundError for anything that is not a user table."""
    found = _rows(
        conn,
        "SELECT name, type, wr, strict FROM pragma_table_list WHERE schema = 'main' AND "
        "name = ? COLLATE NOCASE",
        (table,),
    )
    if not found or found[0][1] != "table" or _is_hidden(found[0][0]):
        gone = unlogged_cid(conn, table) if not found and not _is_hidden(table) else 0
        # (QA: a reader of a table dropped since was told no more than "no table")
        since = f" (a table of that name was dropped or renamed at cid {gone})" if gone else ""
        raise NotFoundError(f"no table {table!r} in this database{since}")
    name, _, without_rowid, strict = found[0]
    info = _rows(
        conn, 'SELECT name, type, "notnull", pk, dflt_value FROM pragma_table_xinfo(?)', (name,)
    )
    columns = [
        (c[0], str(c[1] or ""), arrow_type_name(str(c[1] or ""), strict=bool(strict)), bool(c[2]))
        for c in info
    ]
    defaults = tuple(c[4] for c in info)
    pk_info = sorted((c for c in info if c[3]), key=lambda c: c[3])
    pk = [c[0] for c in pk_info]
    _refuse_our_column_names(name, [c[0] for c in info], rowid_key=not pk)
    rowid_name = None if without_rowid else _rowid_name([c[0] for c in info])
    reshaped = reshaped_cid(conn, name)
    unlogged = unlogged_cid(conn, name)
    if pk:
        # an INTEGER PRIMARY KEY is the rowid (never NULL) and has no index of its own;
        # any other key of a rowid table is a UNIQUE index, which lets NULLs in
        key_index = _rows(conn, "SELECT 1 FROM pragma_index_list(?) WHERE origin = 'pk'", (name,))
        nulls = tuple(not c[2] for c in pk_info) if key_index and not without_rowid else ()
        if any(nulls) and rowid_name is None:
            _refuse_unreachable_rowid(name)
        return SourceTable(
            name,
            tuple(columns),
            tuple(pk),
            rowid_key=False,
            defaults=defaults,
            key_nulls=nulls if any(nulls) else (),
            rowid_name=rowid_name,
            key_is_rowid=not key_index and not without_rowid,
            reshaped_cid=reshaped,
            unlogged_cid=unlogged,
        )
    if without_rowid:  # cannot happen: WITHOUT ROWID needs a primary key
        raise NotFoundError(f"table {name!r} has no key")
    if rowid_name is None:
        _refuse_unreachable_rowid(name)
    return SourceTable(
        name,
        ((ROWID_COLUMN, "INTEGER", "int64", True), *columns),
        (ROWID_COLUMN,),
        True,
        defaults=(None, *defaults),
        rowid_name=rowid_name,
        key_is_rowid=True,
        reshaped_cid=reshaped,
        unlogged_cid=unlogged,
    )


def _refuse_our_column_names(table: str, columns: Sequence[str], *, rowid_key: bool) -> None:
    """A column named as one the pull source adds (its version, order and op columns,
    the rowid of a table without a key) would appear twice in what it serves and in
    every mirror (QA: subscribed, then every sink failed on 'duplicate column'); SQLite,
    MariaDB and the sinks' own checks take names regardless of case."""
    ours = [CID_COLUMN, SEQ_COLUMN, OP_COLUMN, *([ROWID_COLUMN] if rowid_key else [])]
    for column in columns:
        if any(form in ours for form in name_folds(column)):  # (_LITECDC_CİD too: idents QA)
            raise DataTypeError(
                f"table {table} has a column named {column!r}, a name the pull source gives "
                f"a column of its own ({', '.join(ours)}): rename the column to subscribe "
                "to the table"
            )


def _rowid_name(columns: Sequence[str]) -> str | None:
    """How SQL reaches a rowid table's rowid: the first of its three names that no column
    takes; None when columns take all three (``rowid`` then means the column, as it does
    in SQLite, and nothing reaches the rowid)."""
    taken = {c.lower() for c in columns}
    return next((n for n in ("rowid", "_rowid_", "oid") if n not in taken), None)


def _refuse_unreachable_rowid(table: str) -> None:
    # (types QA: the snapshot keyed such a table by the column named rowid, its changes
    # by the real rowid — a delete then removed another row from every mirror)
    raise DataTypeError(
        f"table {table} has columns named rowid, _rowid_ and oid, so SQL cannot read its "
        "rowid, which the pull source keys its rows by (it has no primary key, or one "
        "that lets NULLs in): rename one of those columns, or give the table a primary "
        "key of NOT NULL columns, to subscribe to it"
    )


def approximate_rows(conn: apsw.Connection, table: SourceTable) -> int:
    return int(_rows(conn, f"SELECT count(*) FROM {_quote(table.name)}")[0][0])


def splits(conn: apsw.Connection, table: SourceTable, partitions: int) -> list[list[Any]]:
    """Up to ``partitions - 1`` keys cutting the table into ranges of about equal size.

    The keys are the stored values in SQLite's key order (collations, NULLs first):
    ranges ``(after, until]`` between them hold every row once. One pass over the key's
    index: each cut is found from the previous one."""
    if partitions < 1:
        raise RequestError(f"partitions must be at least 1, got {partitions}")
    count = approximate_rows(conn, table)
    if count == 0 or partitions == 1:
        return []
    keys = ", ".join(table.key_sql())
    cuts: list[list[Any]] = []
    position = 0  # rows up to the last cut (about: NULL keys make runs of equal keys)
    for i in range(1, partitions):
        target = count * i // partitions  # the cut is the target-th row
        if target <= position:
            continue
        where, params = _key_bounds(table, cuts[-1] if cuts else None, None)
        row = conn.execute(
            f"SELECT {keys} FROM {_quote(table.name)}"
            + (f" WHERE {' AND '.join(where)}" if where else "")
            + f" ORDER BY {table.order_sql()} LIMIT 1 OFFSET ?",
            (*params, target - position - 1),
        ).fetchall()
        if not row:
            break
        cuts.append(list(row[0]))
        position = target
    return cuts


@dataclass(frozen=True)
class RowsPage:
    rows: pa.Table
    cid: int
    last_key: list[Any] | None
    done: bool


def read_rows(
    conn: apsw.Connection,
    table: SourceTable,
    after_key: Sequence[Any] | None,
    until_key: Sequence[Any] | None,
    limit: int,
) -> RowsPage:
    """Rows with ``after_key < key <= until_key`` in key order, ``limit`` of them — and,
    when several rows share the last one's key (NULLs in the key), the rest of those
    too: paging by last key would skip them."""
    if limit < 1:
        raise RequestError(f"limit must be at least 1, got {limit}")
    where, params = _key_bounds(table, after_key, until_key)
    shared = any(table.key_nulls)  # rows may share a key: select the rowid too
    select = [
        *(table.key_sql() if table.rowid_key else []),
        *map(_quote, table.stored_columns),
        *([table.rowid_sql] if shared else []),
    ]
    sql = (
        f"SELECT {', '.join(select)} FROM {_quote(table.name)}"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + f" ORDER BY {table.order_sql()} LIMIT ?"
    )
    cid = head_cid(conn)
    rows = conn.execute(sql, (*params, limit)).fetchall()
    key_positions = [table.column_names.index(k) for k in table.key]
    done = len(rows) < limit
    if shared and rows:
        last = rows[-1]
        same_key = [last[i] for i in key_positions]
        if not done and None in same_key:  # the rest of the rows of that key
            same = [f"{k} IS ?" for k in table.key_sql()]
            rows += conn.execute(
                f"SELECT {', '.join(select)} FROM {_quote(table.name)} WHERE "
                f"{' AND '.join(same)} AND {select[-1]} > ? ORDER BY {select[-1]}",
                (*same_key, last[-1]),
            ).fetchall()
        rows = [row[:-1] for row in rows]
    last_key = [rows[-1][i] for i in key_positions] if rows else None
    meta = {
        b"litecdc.cid": str(cid).encode(),
        b"litecdc.last_key": encode_key(last_key).encode(),
        b"litecdc.done": b"true" if done else b"false",
    }
    schema = table.row_schema(meta)
    arrays = _columns(table, rows, key_positions)
    arrays.append(pa.array([cid] * len(rows), pa.int64()))
    return RowsPage(pa.Table.from_arrays(arrays, schema=schema), cid, last_key, done)


_SAFE_FLOAT_INT = 2**53


def _mismatch_check(name: str, declared: str, arrow: str) -> str | None:
    """An SQL condition true for a value ADBC would convert silently where ``read_rows``
    converts differently or refuses; None when ADBC itself refuses every such value
    (INTEGER columns; REAL affinity, which stores only floats, text and blobs)."""
    column = _quote(name)
    t = declared.upper()
    if arrow == "binary":
        return f"typeof({column}) NOT IN ('blob', 'null')"
    if arrow == "string":
        if "CHAR" in t or "CLOB" in t or "TEXT" in t:  # TEXT affinity: numbers become text
            return f"typeof({column}) = 'blob'"
        return f"typeof({column}) NOT IN ('text', 'null')"
    if arrow == "float64" and not ("REAL" in t or "FLOA" in t or "DOUB" in t):
        # NUMERIC affinity keeps integers: exact as floats only up to 2**53
        return (
            f"(typeof({column}) = 'integer' AND {column} NOT BETWEEN "
            f"-{_SAFE_FLOAT_INT} AND {_SAFE_FLOAT_INT})"
        )
    return None


def _key_bounds(
    table: SourceTable, after_key: Sequence[Any] | None, until_key: Sequence[Any] | None
) -> tuple[list[str], list[Any]]:
    """WHERE conditions (and their parameters) for ``after_key < key <= until_key``, in
    SQLite's own order of the key (its collations; NULLs first where the key may hold
    them), in terms its query planner turns into a range of the key's index."""
    keys = table.key_sql()
    for bound in (after_key, until_key):
        if bound is not None and len(bound) != len(keys):
            raise RequestError(
                f"a key of table {table.name} has {len(keys)} value(s) ({', '.join(table.key)}),"
                f" got {len(bound)}"
            )
    columns = ", ".join(keys)
    marks = ", ".join("?" * len(keys))
    if not any(table.key_nulls):
        where: list[str] = []
        params: list[Any] = []
        for bound, op in ((after_key, ">"), (until_key, "<=")):
            if bound is not None:
                where.append(f"({columns}) {op} ({marks})")
                params.extend(bound)
        return where, params
    return _nullable_key_bounds(table, after_key, until_key)


def _nullable_key_bounds(
    table: SourceTable, after_key: Sequence[Any] | None, until_key: Sequence[Any] | None
) -> tuple[list[str], list[Any]]:
    """``_key_bounds`` of a key that may hold NULLs, which sort before every value.

    SQL's comparisons give NULL where a NULL decides them, so: ``key > bound`` is the
    row-value comparison when the bound has no NULL (a NULL deciding it makes the key
    smaller: not greater), else spelled out column by column; ``key <= bound`` is
    ``(key > bound) IS NOT 1``, with an index-friendly term that bounds the scan added
    where one holds."""
    keys = table.key_sql()
    where: list[str] = []
    params: list[Any] = []
    first_not_null = not table.key_nulls[0]  # no row of the range has a NULL first column
    if after_key is not None:
        sql, values = _greater(keys, after_key)
        where.append(sql)
        params.extend(values)
        first_not_null = first_not_null or after_key[0] is not None
    if until_key is not None:
        sql, values = _greater(keys, until_key)
        where.append(f"({sql}) IS NOT 1")
        params.extend(values)
        if until_key[0] is None:
            where.append(f"{keys[0]} IS NULL")
        elif first_not_null:
            where.append(f"{keys[0]} <= ?")
            params.append(until_key[0])
    return where, params


def _greater(keys: Sequence[str], bound: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(keys) > (bound)`` with NULLs sorting first: true, or false or NULL."""
    if None not in bound:
        return f"({', '.join(keys)}) > ({', '.join('?' * len(keys))})", list(bound)
    alternatives: list[str] = []
    params: list[Any] = []
    for i, value in enumerate(bound):
        terms = [f"{k} IS ?" for k in keys[:i]]
        params.extend(bound[:i])
        if value is None:
            terms.append(f"{keys[i]} IS NOT NULL")
        else:
            terms.append(f"{keys[i]} > ?")
            params.append(value)
        alternatives.append(" AND ".join(terms))
    if len(alternatives) == 1:
        return alternatives[0], params
    return "(" + " OR ".join(f"({a})" for a in alternatives) + ")", params


def rows_query(
    table: SourceTable,
    after_key: Sequence[Any] | None,
    until_key: Sequence[Any] | None,
    limit: int,
) -> tuple[str, list[Any]]:
    """A chunk as one SELECT for a reader that converts types on its own (ADBC), to run
    in the same read transaction as ``HEAD_CID_SQL``.

    Rows holding a value such a reader would get wrong (``_mismatch_check``) are marked
    so that ``page_from_arrow`` leaves the chunk to ``read_rows``: the first INTEGER
    column (the rowid, when there is one) carries a blob instead of its value there,
    which ADBC refuses or types as binary (either way not the column's int64). Each
    extra result column costs ADBC about a fifth of a clean chunk's read time, so the
    mark only gets a column of its own when the table has no INTEGER column.
    """
    where, params = _key_bounds(table, after_key, until_key)
    select = [*(table.key_sql() if table.rowid_key else []), *map(_quote, table.stored_columns)]
    checks = [
        f"({check})"
        for name, declared, arrow, _ in table.columns
        if (check := _mismatch_check(name, declared, arrow)) is not None
    ]
    if checks:
        marked = " OR ".join(checks)
        carrier = next((i for i, c in enumerate(table.columns) if c[2] == "int64"), None)
        if carrier is None:
            select.append(marked)
        else:  # select[i] reads table.columns[i]
            select[carrier] = f"CASE WHEN {marked} THEN x'' ELSE {select[carrier]} END"
    sql = (
        f"SELECT {', '.join(select)} FROM {_quote(table.name)}"
        + (f" WHERE {' AND '.join(where)}" if where else "")
        + f" ORDER BY {table.order_sql()} LIMIT ?"
    )
    return sql, [*params, limit]


def page_from_arrow(table: SourceTable, data: pa.Table, cid: int, limit: int) -> RowsPage | None:
    """The chunk ``rows_query`` read into Arrow by another reader at ``cid``, checked:
    None when it held no row, a value that needs ``read_rows``' care, or a full page
    whose last key holds a NULL (``read_rows`` adds the other rows of that key)."""
    if data.num_rows == 0:
        return None
    marks = data.column(data.num_columns - 1)
    if data.num_columns > len(table.columns) and pa.compute.max(marks).as_py():
        return None  # a marked row (the mark has a column of its own)
    schema = table.row_schema()
    arrays = []
    for index, field in enumerate(schema):
        if index == len(table.columns):  # the cid column: the same value in every row
            arrays.append(pa.repeat(pa.scalar(cid, pa.int64()), data.num_rows))
            continue
        column = data.column(index)
        if column.type != field.type:  # a marked row, or a column of NULLs only
            if column.null_count != len(column):
                return None
            column = pa.nulls(len(column), field.type)
        arrays.append(column)
    key_positions = [table.column_names.index(k) for k in table.key]
    last = data.slice(data.num_rows - 1, 1)
    last_key = [last.column(i)[0].as_py() for i in key_positions]
    done = data.num_rows < limit
    if not done and None in last_key:
        return None
    meta = {
        b"litecdc.cid": str(cid).encode(),
        b"litecdc.last_key": encode_key(last_key).encode(),
        b"litecdc.done": b"true" if done else b"false",
    }
    rows = pa.Table.from_arrays(arrays, schema=table.row_schema(meta))
    return RowsPage(rows, cid, last_key, done)


@dataclass(frozen=True)
class ChangesPage:
    events: pa.Table
    end_cid: int  # read again after this cid
    last_cid: int  # the node's head in this read
    count: int


_CHANGE_COLUMNS = "cid, seq, op, old_rowid, new_rowid, before, after"


def _moves_key(table: SourceTable, row: tuple[Any, ...]) -> bool:
    """Whether a change-log row is an update that changes the key (served as a delete of
    the old key, then an upsert of the new one)."""
    _, _, op, old_rowid, new_rowid, before, after = row
    if op != "update":
        return False
    if table.rowid_key:
        return bool(old_rowid != new_rowid)
    return _key_differs(table, _decode_image(before), _decode_image(after))


def _key_differs(table: SourceTable, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether an update's images hold another key, as a mirror keys it: by type and value
    (QA: Python's 1 == 1.0 and 0.0 == -0.0 hid `SET k = 1.0` in an untyped key column,
    whose mirror keys by the text "1" and "1.0": the old row stayed at the sink)."""
    return not all(_same_value(before.get(k), after.get(k)) for k in table.key)


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b) or a != b:
        return False
    return not isinstance(a, float) or math.copysign(1.0, a) == math.copysign(1.0, b)


#: rows of one transaction a position walk reads out before it has SQLite count the rest
COUNT_IN_SQL_AFTER = 1_000


class _ChangeWalk:
    """This table's change-log rows after ``after``, read as they are iterated (a
    transaction can hold millions: scale QA): whole transactions, stopping at the first
    cid boundary once ``max_events`` events (as served: a key change counts two) are in.
    Once iterated, ``events`` holds their number and ``end`` the cid read again after."""

    def __init__(
        self,
        conn: apsw.Connection,
        table: SourceTable,
        after: int,
        until: int | None,
        max_events: int,
    ) -> None:
        if max_events < 1:
            raise RequestError(f"limit must be at least 1, got {max_events}")
        self.head = head_cid(conn)
        pruned = pruned_cid(conn)
        if after < pruned:
            raise PositionUnavailableError(
                f"changes after cid {after} are no longer available: the change log was "
                f"pruned through cid {pruned} (retention); register again and re-snapshot",
                pruned_cid=pruned,
            )
        self._conn, self._table, self._max_events = conn, table, max_events
        self._stop = self.head if until is None else min(until, self.head)
        self._after = after
        self.events = 0
        self.end = max(after, 0)

    def __iter__(self) -> Generator[tuple[Any, ...]]:
        if self._stop <= self._after:
            return
        cursor = self._conn.execute(
            f"SELECT {_CHANGE_COLUMNS} FROM {CHANGES_TABLE} WHERE id > ? AND id <= ? "
            "AND tbl = ? ORDER BY id",
            (last_change_id(self._after), last_change_id(self._stop), self._table.name),
        )
        last_cid: int | None = None
        try:
            for row in cursor:
                if self.events >= self._max_events and row[0] != last_cid:
                    assert last_cid is not None
                    self.end = last_cid
                    return
                yield row
                last_cid = row[0]
                self.events += 2 if _moves_key(self._table, row) else 1
            self.end = self._stop
        finally:
            # (a read left before its end — refused at a misfit — must not leave an open
            # statement behind its transaction's COMMIT: it would hold that snapshot)
            cursor.close()

    def count(self) -> int | None:
        """Walk without reading the rows out: sets ``events`` and ``end`` as iterating
        would, and returns the first cid (None: no events). Past its first
        COUNT_IN_SQL_AFTER rows a transaction's rest is counted by SQLite (scale QA: a
        position behind a 1.5M-row transaction took 2.5 s, and `pipeline status`, asking
        one per subscription, called the node unreachable)."""
        if self._stop <= self._after:
            return None
        table, name = self._table, self._table.name
        by_rowid = table.rowid_key or table.key_is_rowid
        # the images only where they tell a key change: updates of a table not keyed by rowid
        images = (
            "NULL, NULL"
            if by_rowid
            else "CASE WHEN op = 'update' THEN before END, CASE WHEN op = 'update' THEN after END"
        )
        sql = (
            f"SELECT cid, seq, op, old_rowid, new_rowid, {images} FROM {CHANGES_TABLE} "
            "WHERE id > ? AND id <= ? AND tbl = ? ORDER BY id"
        )
        low, high = last_change_id(self._after), last_change_id(self._stop)
        first: int | None = None
        current: int | None = None
        rows_of_current = 0
        while True:
            skipped = False
            cursor = self._conn.execute(sql, (low, high, name))
            try:
                for row in cursor:
                    cid = int(row[0])
                    if cid != current:
                        if self.events >= self._max_events:
                            assert current is not None
                            self.end = current
                            return first
                        current, rows_of_current = cid, 0
                        first = cid if first is None else first
                    if by_rowid:
                        moves = row[2] == "update" and row[3] != row[4]
                    else:
                        moves = _moves_key(table, row)
                    self.events += 2 if moves else 1
                    rows_of_current += 1
                    if rows_of_current == COUNT_IN_SQL_AFTER:
                        self.events += self._events_after(cid, int(row[1]))
                        low, skipped = last_change_id(cid), True
                        break
            finally:
                cursor.close()
            if not skipped:
                self.end = self._stop
                return first

    def _events_after(self, cid: int, seq: int) -> int:
        """The events of transaction ``cid``'s changes of this table after its ``seq``."""
        table = self._table
        bounds = ((cid << SEQ_BITS) | seq, last_change_id(cid), table.name)
        where = "WHERE id > ? AND id <= ? AND tbl = ?"
        if table.rowid_key or table.key_is_rowid:
            ((rows, moved),) = _rows(
                self._conn,
                "SELECT count(*), total(op = 'update' AND old_rowid IS NOT new_rowid) "
                f"FROM {CHANGES_TABLE} {where}",
                bounds,
            )
            return int(rows) + int(moved)
        rows = _rows(self._conn, f"SELECT count(*) FROM {CHANGES_TABLE} {where}", bounds)[0][0]
        updates = self._conn.execute(
            f"SELECT {_CHANGE_COLUMNS} FROM {CHANGES_TABLE} {where} AND op = 'update'", bounds
        )
        return int(rows) + sum(1 for row in updates if _moves_key(table, row))


@dataclass(frozen=True)
class ChangePosition:
    end_cid: int  # where the next batch of at most max_events events ends
    events: int
    last_cid: int  # the head
    first_cid: int | None  # the cid of the batch's first event (None: no events)
    after_mark: str | None  # commit_mark of ``after`` and of end_cid (None: not journaled)
    end_mark: str | None
    reshaped_cid: int = 0  # the table's (SourceTable.reshaped_cid)
    #: the first cid after ``after`` that changed the table's rows without row changes
    #: (db/reshape.py): a batch must end before it. 0: none
    unlogged_cid: int = 0


def change_position(
    conn: apsw.Connection, table: SourceTable, after: int, max_events: int
) -> ChangePosition:
    """The next batch of at most ``max_events`` events after ``after``, and the marks of
    the commits it starts after and ends at."""
    walk = _ChangeWalk(conn, table, after, None, max_events)
    first_cid = walk.count()
    return ChangePosition(
        walk.end,
        walk.events,
        walk.head,
        first_cid,
        commit_mark(conn, after),
        commit_mark(conn, walk.end),
        table.reshaped_cid,
        unlogged_cid(conn, table.name, after=after),
    )


def commit_mark(conn: apsw.Connection, cid: int) -> str | None:
    """What tells commit ``cid`` of this history from the commit ``cid`` of another (a
    database restored from an older backup numbers its new commits from the backup's
    head again): the leader's clock and the random seed the commit was made with. None
    when the journal no longer (or never) holds it."""
    found = conn.execute(f"SELECT ts, seed FROM {JOURNAL_TABLE} WHERE cid = ?", (cid,)).fetchall()
    return f"{found[0][0]}:{found[0][1]}" if found else None


#: change-log rows turned into Arrow at a time: a page holds whole transactions, and one
#: of 1.5M rows built as Python values at once took the node 1.2 GB per reader (scale QA)
CHANGE_BATCH_ROWS = 20_000


def read_table_changes(
    conn: apsw.Connection, table: SourceTable, after: int, until: int | None, max_events: int
) -> ChangesPage:
    """The table's events with ``after < cid <= until`` (whole transactions)."""
    walk = _ChangeWalk(conn, table, after, until, max_events)
    with contextlib.closing(iter(walk)) as rows:
        batches = _change_batches(conn, table, rows)
    at = unlogged_cid(conn, table.name, after=after) if table.unlogged_cid > after else 0
    if 0 < at <= walk.end:
        # (QA: across a DROP TABLE and CREATE again with no events between, only the new
        # table's inserts were served — the old rows never deleted; likewise the rows a
        # CREATE … AS SELECT or RENAME TO brought, and the values ADD COLUMN … DEFAULT gave;
        # and across the first of two such commits, the last being the one recorded)
        before = f"read them up to cid {at - 1} at most, and " if after < at - 1 else ""
        raise UnloggedChangesError(
            f"table {table.name}: commit {at} changed the rows under this name without "
            "change events (the table dropped or renamed, created from a query or renamed "
            "to this name, a column dropped or renamed, or a column with a DEFAULT added: "
            f"its journal entry, GET /journal?after={at - 1}&limit=1, says which): its "
            f"changes after cid {after} cannot bring a copy past it; {before}take a new copy "
            f"of the table (a snapshot) at cid {at} or later"
        )
    meta = {
        b"litecdc.end_cid": str(walk.end).encode(),
        b"litecdc.last_cid": str(walk.head).encode(),
    }
    events = pa.Table.from_batches(batches).replace_schema_metadata(meta)
    return ChangesPage(events, walk.end, walk.head, events.num_rows)


def _change_batches(
    conn: apsw.Connection, table: SourceTable, rows: Iterator[tuple[Any, ...]]
) -> list[pa.RecordBatch]:
    """Change-log ``rows`` as event batches of about CHANGE_BATCH_ROWS rows each."""
    batches: list[pa.RecordBatch] = []
    chunk: list[tuple[Any, ...]] = []
    # the first cid a read may start after: not before the reshape's commit (whose own
    # events are of the new shape), nor across a change of rows without events
    since = max(table.reshaped_cid - 1, table.unlogged_cid)
    for row in rows:
        if not batches and not chunk and row[0] < table.reshaped_cid:
            # (schema QA: images of before the reshape were served under today's columns
            # by name — a renamed column NULL, a dropped and re-added one holding the old
            # values, a re-created table's rows as the new one's)
            raise TableReshapedError(
                f"table {table.name} was reshaped at cid {table.reshaped_cid} (created "
                "again, renamed to its name, or changed other than by adding a column): its "
                f"changes before that, from cid {row[0]} on, have another shape than its "
                f"description; read its changes after cid {since}, from a copy of the table "
                "made since"
            )
        chunk.append(row)
        if len(chunk) >= CHANGE_BATCH_ROWS:
            batches.append(_change_batch(conn, table, chunk))
            chunk = []
    if chunk or not batches:
        batches.append(_change_batch(conn, table, chunk))
    return batches


def _change_batch(
    conn: apsw.Connection, table: SourceTable, rows: Sequence[tuple[Any, ...]]
) -> pa.RecordBatch:
    """Change-log rows as events: an update that changes the key is a delete of the old
    key, then an upsert of the new one."""
    names = table.stored_columns
    cids: list[int] = []
    seqs: list[int] = []
    ops: list[str] = []
    images: list[tuple[Any, ...]] = []

    def emit(cid: int, seq: int, op: str, rowid: int | None, image: dict[str, Any]) -> None:
        values = tuple(image.get(n) for n in names)
        cids.append(cid)
        seqs.append(seq)
        ops.append(op)
        images.append((rowid, *values) if table.rowid_key else values)

    for cid, seq, op, old_rowid, new_rowid, before_blob, after_blob in rows:
        before = _decode_image(before_blob) if before_blob is not None else None
        after_image = _decode_image(after_blob) if after_blob is not None else None
        if op == "insert":
            assert after_image is not None
            emit(cid, seq, "upsert", new_rowid, after_image)
        elif op == "delete":
            assert before is not None
            emit(cid, seq, "delete", old_rowid, before)
        else:
            assert before is not None and after_image is not None
            moved = (
                old_rowid != new_rowid
                if table.rowid_key
                else _key_differs(table, before, after_image)
            )
            if moved:
                emit(cid, seq, "delete", old_rowid, before)
            emit(cid, seq, "upsert", new_rowid, after_image)
    key_positions = [table.column_names.index(k) for k in table.key]
    try:
        columns = _columns(table, images, key_positions)
    except DataTypeError:
        keep = _settle_misfits(conn, table, ops, images, key_positions)
        cids, seqs, ops = [cids[n] for n in keep], [seqs[n] for n in keep], [ops[n] for n in keep]
        images = [images[n] for n in keep]
        columns = _columns(table, images, key_positions)  # raises for a misfit still current
    arrays: list[pa.Array] = [
        pa.array(cids, pa.int64()),
        pa.array(seqs, pa.int64()),
        pa.array(ops, pa.string()),
        *columns,
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=table.change_schema())


def _settle_misfits(
    conn: apsw.Connection,
    table: SourceTable,
    ops: list[str],
    images: list[tuple[Any, ...]],
    key_positions: Sequence[int],
) -> list[int]:
    """The events of a change page to serve when some hold a value that does not fit its
    column, by index. A version of a row the source no longer has (fixed, deleted, or
    its key changed since: QA, a subscription stayed stopped after the row was fixed as
    the error advises) is left out: a later event brings what replaced it. A delete
    needs only its key: a value that does not fit elsewhere in it becomes null (the
    mirror deletes by key; a log sink's 'row' shows null there), and a delete of a key
    that does not fit is left out (no sink ever held that key). A misfit the source still
    has stays, and is refused."""
    keep: list[int] = []
    arrows = [c[2] for c in table.columns]
    for n, values in enumerate(images):
        misfits = [i for i, v in enumerate(values) if not _fits_mirror(arrows[i], v)]
        if not misfits:
            keep.append(n)
        elif ops[n] == "delete":
            if not any(i in key_positions for i in misfits):
                images[n] = tuple(None if i in misfits else v for i, v in enumerate(values))
                keep.append(n)
        elif _is_current(conn, table, values, key_positions):
            keep.append(n)
    return keep


def _fits_mirror(arrow: str, value: Any) -> bool:
    """Whether a column mirrored as ``arrow`` takes ``value`` (``_coerced`` converts a
    number for a float or text column)."""
    if value is None:
        return True
    if arrow == "float64" and isinstance(value, int):
        # exactly as a double, or not at all (sinks QA: 2**60 was refused with the rest
        # of what passes 2**53, though a double holds it)
        return abs(value) < 2**1023 and int(float(value)) == value
    if arrow == "string" and isinstance(value, int | float):
        return True
    return _fits(arrow, value)


def _is_current(
    conn: apsw.Connection, table: SourceTable, values: tuple[Any, ...], key_positions: Sequence[int]
) -> bool:
    """Whether the table holds a row of exactly these values (of every stored column)."""
    keys = table.key_sql()
    where = " AND ".join(f"{k} IS ?" for k in keys)
    stored = table.stored_columns
    rows = _rows(
        conn,
        f"SELECT {', '.join(map(_quote, stored))} FROM {_quote(table.name)} WHERE {where}",
        [values[i] for i in key_positions],
    )
    own = values[1:] if table.rowid_key else values
    return any(all(map(_same_value, row, own)) for row in rows)


def _columns(
    table: SourceTable, rows: Sequence[Sequence[Any]], key_positions: Sequence[int]
) -> list[pa.Array]:
    """Column arrays of ``rows`` (one value per table column), typed as the spec says."""
    if not rows:
        return [pa.array([], ARROW_TYPES[c[2]]) for c in table.columns]
    arrays = []
    for i, column in enumerate(zip(*rows, strict=True)):
        name, declared, arrow, _ = table.columns[i]
        # pyarrow would take UTF-8 bytes as text and text as its bytes: look first
        other = _TAKEN_AS.get(arrow)
        if other is not None and any(isinstance(v, other) for v in column):
            arrays.append(_coerced(table, name, declared, arrow, column, rows, key_positions))
            continue
        try:
            arrays.append(pa.array(column, ARROW_TYPES[arrow]))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            arrays.append(_coerced(table, name, declared, arrow, column, rows, key_positions))
    return arrays


#: values pyarrow converts to an Arrow type without a word: a blob to text (when its
#: bytes are UTF-8), text to a blob (its UTF-8 bytes), a float to an integer (cut: 2.5
#: in an INTEGER column became 2, QA). None is the value stored.
_TAKEN_AS: dict[str, type] = {"string": bytes, "binary": str, "int64": float}


def _coerced(
    table: SourceTable,
    name: str,
    declared: str,
    arrow: str,
    column: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    key_positions: Sequence[int],
) -> pa.Array:
    values: list[Any] = []
    for n, value in enumerate(column):
        if not _fits_mirror(arrow, value):
            key = [rows[n][k] for k in key_positions]
            raise DataTypeError(
                f"table {table.name} column {name}: {_article(_storage_class(value))} value at key "
                f"{jsonable(key)} does not fit the column's mirrored type {arrow} (declared "
                f"{declared or 'no type'!r}); give the column a type that matches its values, "
                "or fix the row"
            )
        if arrow == "float64" and isinstance(value, int):
            values.append(float(value))  # (exact: _fits_mirror)
        elif arrow == "string" and isinstance(value, int):
            values.append(str(value))
        elif arrow == "string" and isinstance(value, float):
            values.append(repr(value))
        else:
            values.append(value)
    return pa.array(values, ARROW_TYPES[arrow])


def _article(word: str) -> str:
    """``word`` after "a" or "an" (an INTEGER, a BLOB)."""
    return f"{'an' if word[:1].upper() in 'AEIOU' else 'a'} {word}"


def _fits(arrow: str, value: Any) -> bool:
    if arrow == "int64":
        return isinstance(value, int) and -(2**63) <= value < 2**63
    if arrow == "float64":
        return isinstance(value, float)
    if arrow == "string":
        return isinstance(value, str)
    return isinstance(value, bytes)


def _storage_class(value: Any) -> str:
    return {int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"}.get(type(value), "?")


def _is_hidden(name: str) -> bool:
    return name.startswith(("sqlite_", INTERNAL_PREFIX))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


__all__ = [
    "ROWID_COLUMN",
    "SEQ_BITS",
    "ChangesPage",
    "RowsPage",
    "SourceTable",
    "arrow_type_name",
    "change_position",
    "describe",
    "read_rows",
    "read_table_changes",
    "reshaped_cid",
    "splits",
    "unlogged_cid",
    "user_tables",
]
