"""PostgreSQL mirror through psycopg 3.

The table (``?table=``, default the source table's name, in ``?schema=``, default
``public``) is created if missing, and its schema too: the source columns typed BIGINT /
DOUBLE PRECISION / TEXT / BYTEA, ``_litecdc_cid BIGINT NOT NULL`` and a PRIMARY KEY on
the key columns.
``litecdc_sink_state(subscription, table_name, applied_cid)`` in the same schema records
the last change batch applied to that table (keyed by table too, like Delta's record
that lives in the table itself: a table dropped and created again starts from 0).

A write copies the rows (binary COPY: floats, blobs and text round-trip exactly) into
session-private staging tables, then, in the same transaction::

    INSERT INTO t SELECT … FROM staging ON CONFLICT (key) DO UPDATE SET …
        WHERE excluded._litecdc_cid > t._litecdc_cid
    DELETE FROM t USING staging_deletes d WHERE key = d.key AND t._litecdc_cid < d._litecdc_cid
    UPDATE litecdc_sink_state SET applied_cid = <end cid>

(COPY + one INSERT … SELECT measured ~3x faster than executemany.) The state row is
read FOR UPDATE first, so two writers of one subscription cannot both apply a batch.

A statement that names a table or column carries its values as ``sql.Literal`` and is
executed without parameters: with parameters psycopg reads every ``%`` of the query as
a placeholder, those inside a quoted identifier too (a table named ``x%`` failed with
"only '%s', '%b', '%t' are allowed as placeholders").

The primary key is a btree index, whose entry holds at most 2,704 bytes (8 kB pages) of
a key *after compression* (pglz or lz4): 2,692 bytes of a one-column text or bytea key
that does not compress, while 100,000 times one letter fits. A row whose entry is
longer fails the INSERT with program_limit_exceeded (SQLSTATE 54000), naming no row; the
sink then asks PostgreSQL which rows it refuses (``_refused_keys``: each row whose key
might be too long, inserted alone in a transaction rolled back) and raises an
``UnstorableKeyError`` naming them, the tables, the column, its size and the limit —
nothing of the write is committed. A delete of such a key needs no entry (the staging
tables have no index; the lookup compares the value) and finds no row, so the
subscription goes on once the row is deleted at the source.

Example::

    sink = PostgresSink("postgresql://app:pw@127.0.0.1:5432/app?table=orders", spec, "orders-pg")
    sink.prepare()
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Generator, Iterable, Sequence
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from litecdc.errors import SchemaMismatchError, SinkError, SinkUnreachableError
from litecdc.pipeline.events import net_changes
from litecdc.pipeline.sinks.base import (
    PROBE_GRACE,
    READ_BATCH_ROWS,
    ChangeBatch,
    Sink,
    UnstorableKeyError,
    check_mirror_columns,
    short_value,
)
from litecdc.pipeline.sinks.registry import SqlOptions, mask_url, parse_sink_url, scrub_password
from litecdc.pipeline.tables import CID_COLUMN, Column, TableSpec
from litecdc.sockets import shut_down_socket

log = logging.getLogger("litecdc.pipeline")

#: Column type created for each Arrow type, and the COPY (binary) type name.
PG_TYPES = {"int64": "BIGINT", "float64": "DOUBLE PRECISION", "string": "TEXT", "binary": "BYTEA"}
COPY_TYPES = {"int64": "int8", "float64": "float8", "string": "text", "binary": "bytea"}
#: information_schema.columns.data_type values an existing column may have.
ACCEPTED_TYPES = {
    "int64": {"bigint"},
    "float64": {"double precision"},
    "string": {"text", "character varying"},
    "binary": {"bytea"},
}
STATE_TABLE = "litecdc_sink_state"
#: the advisory lock key ``prepare`` holds for its transaction
PREPARE_LOCK = 7262012
#: PostgreSQL's NAMEDATALEN - 1: the bytes of an identifier it keeps
MAX_IDENTIFIER_BYTES = 63
#: PostgreSQL's message when a btree entry is too long ('index row size 2712 exceeds btree
#: version 4 maximum 2704 for index "t_pkey"'); over 8,191 bytes, any index says 'index
#: row requires 10016 bytes, maximum size is 8191'
_BTREE_MAXIMUM = re.compile(r"exceeds btree version \d+ maximum (\d+)")
_STAGE_UP = "litecdc_stage_upserts"
_STAGE_DEL = "litecdc_stage_deletes"


class PostgresSink(Sink):
    kind = "mirror"
    label = "postgresql sink"
    probes = True

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, SqlOptions) or options.dialect != "postgresql":
            raise SinkError(f"postgresql sink: {mask_url(url)} is not a postgresql:// URL")
        self.options = options
        self.table_name = options.table or spec.name
        self.schema_name = options.schema or "public"
        self._where = f"{self.schema_name}.{self.table_name} at {mask_url(url)}"
        self._conn: psycopg.Connection[Any] | None = None
        self._staged_for: TableSpec | None = None  # spec the staging tables were made for
        self._btree_max_entry = 2704  # bytes, with 8 kB pages (read from the server)
        self.probe_timeout = max(1, math.ceil(options.connect_timeout)) + PROBE_GRACE

    # -- connection -------------------------------------------------------------------

    def _params(self) -> dict[str, Any]:
        o = self.options
        params: dict[str, Any] = {
            "host": o.host,
            "port": o.port,
            "dbname": o.database,
            "connect_timeout": max(1, math.ceil(o.connect_timeout)),
            "application_name": f"litecdc-{self.subscription}"[:63],
            "autocommit": True,  # transactions are explicit (conn.transaction())
        }
        if o.user is not None:
            params["user"] = o.user
        if o.password is not None:
            params["password"] = o.password
        if o.sslmode is not None:
            params["sslmode"] = o.sslmode
        return params

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        try:
            self._conn = psycopg.connect(**self._params())
        except psycopg.Error as exc:
            if _answered(exc):  # refused by the server itself: its message says why
                raise SinkError(
                    f"postgresql sink: cannot connect to {mask_url(self.url)}: {self._scrub(exc)}"
                ) from exc
            raise SinkUnreachableError(
                f"postgresql sink: cannot connect to {mask_url(self.url)}: "
                f"{self._scrub(exc)}: check the server is up and the URL's credentials"
            ) from exc
        self._staged_for = None
        return self._conn

    def probe(self) -> None:
        try:
            with psycopg.connect(**self._params()) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            if _answered(exc):
                # refusing (too many connections, a password changed, shutting down): it is
                # alive, the write it serves only waits (QA: a write waiting on a lock was
                # broken when the role's one connection was in use)
                return
            raise SinkUnreachableError(
                f"postgresql sink: the server of {mask_url(self.url)} does not answer: "
                f"{self._scrub(exc)}"
            ) from exc

    def abort(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed:
            shut_down_socket(conn.pgconn.socket)

    def _scrub(self, exc: BaseException) -> str:
        # one line: libpq's messages span several ("…Connection refused\n\tIs the server…")
        text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
        return scrub_password(text, self.options.password, self.options.user)

    def _fail(self, doing: str, exc: psycopg.Error) -> SinkError:
        if isinstance(exc, psycopg.errors.DataError):
            return SchemaMismatchError(
                f"postgresql sink: {doing} {self._where}: a value the column cannot take: "
                f"{self._scrub(exc)}"
            )
        return SinkError(f"postgresql sink: {doing} {self._where} failed: {self._scrub(exc)}")

    def check_names(self) -> None:
        """PostgreSQL cuts a longer identifier to its first 63 bytes, with a notice only:
        two columns alike in those became one (QA: a column added later was skipped by ADD
        COLUMN IF NOT EXISTS, then every write failed with 'specified more than once')."""
        names = [
            ("schema", self.schema_name, "choose another (?schema=NAME)"),
            ("table", self.table_name, "choose another (?table=NAME)"),
            *(("column", c.name, "rename it at the source") for c in self.spec.columns),
        ]
        for kind, name, remedy in names:
            length = len(name.encode())
            if length > MAX_IDENTIFIER_BYTES:
                raise SchemaMismatchError(
                    f"postgresql sink: {self._where}: {kind} name {name!r} is {length} bytes, "
                    f"more than PostgreSQL keeps of a name ({MAX_IDENTIFIER_BYTES}: it would "
                    f"cut it): {remedy}"
                )
        if self.table_name == STATE_TABLE:
            raise SchemaMismatchError(
                f"postgresql sink: {self._where}: table name {self.table_name!r} is the "
                "sink's own (it keeps its progress there): choose another (?table=NAME)"
            )

    def _ident(self, name: str) -> sql.Composable:
        return sql.Identifier(name)

    def _target(self) -> sql.Composable:
        return sql.Identifier(self.schema_name, self.table_name)

    def _state(self) -> sql.Composable:
        return sql.Identifier(self.schema_name, STATE_TABLE)

    def _mine(self) -> sql.Composable:
        """This subscription's row of the state table, as a condition."""
        return sql.SQL("subscription = {} AND table_name = {}").format(
            sql.Literal(self.subscription), sql.Literal(self.table_name)
        )

    # -- set-up -----------------------------------------------------------------------

    def prepare(self) -> None:
        self.check_names()
        conn = self._connect()
        try:
            with conn.transaction():
                # one sink at a time creates the shared schema and state table: CREATE …
                # IF NOT EXISTS at once from two connections fails one of them (QA: with
                # subscriptions prepared in parallel, "duplicate key … pg_type")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (PREPARE_LOCK,))
                self._ensure_schema(conn)
                existing = self._existing_columns(conn)
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (subscription TEXT NOT NULL, "
                        "table_name TEXT NOT NULL, applied_cid BIGINT NOT NULL, "
                        "PRIMARY KEY (subscription, table_name))"
                    ).format(self._state())
                )
                if not existing:
                    self._create_table(conn)
                    # a record left by a dropped table of that name is not this table's
                    conn.execute(
                        sql.SQL("DELETE FROM {} WHERE {}").format(self._state(), self._mine())
                    )
                else:
                    self._check_and_extend(conn, existing)
        except psycopg.Error as exc:
            raise self._fail("preparing", exc) from exc
        self._staged_for = None

    def forget_progress(self) -> None:
        """Drop the record an earlier subscription of this name left for this table (the
        mirror table was kept, so prepare() did not): with it, the new subscription's
        batches at or below its cid — from another source, say — were skipped."""
        conn = self._connect()
        try:
            with conn.transaction():
                conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(self._state(), self._mine()))
        except psycopg.Error as exc:
            raise self._fail("forgetting an earlier subscription's progress in", exc) from exc

    def _ensure_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Create ``?schema=`` when it does not exist, as the table is: a subscription
        accepted a missing schema and every run then failed on it. Checked first, since
        CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the database even when
        the schema is there."""
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema_name,)
        ).fetchone()
        if found is None:
            conn.execute(
                sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema_name))
            )
            log.info("postgresql sink: created schema %s", self.schema_name)

    def _existing_columns(self, conn: psycopg.Connection[Any]) -> dict[str, str]:
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s",
            (self.schema_name, self.table_name),
        ).fetchall()
        return {str(name): str(kind) for name, kind in rows}

    def _column_def(self, column: Column) -> sql.Composable:
        return sql.SQL("{} {}").format(self._ident(column.name), sql.SQL(PG_TYPES[column.arrow]))

    def _create_table(self, conn: psycopg.Connection[Any]) -> None:
        defs = [self._column_def(c) for c in self.spec.columns]
        defs.append(sql.SQL("{} BIGINT NOT NULL").format(self._ident(CID_COLUMN)))
        defs.append(
            sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(self._ident(k) for k in self.spec.key)
            )
        )
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                self._target(), sql.SQL(", ").join(defs)
            )
        )
        log.info("postgresql sink: created table %s.%s", self.schema_name, self.table_name)

    def _check_and_extend(self, conn: psycopg.Connection[Any], existing: dict[str, str]) -> None:
        required = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = %s AND is_nullable = 'NO' AND column_default IS NULL AND "
            "is_identity = 'NO' AND is_generated = 'NEVER'",
            (self.schema_name, self.table_name),
        ).fetchall()
        added = check_mirror_columns(
            "postgresql", self._where, existing, self.spec, ACCEPTED_TYPES, PG_TYPES,
            required=[str(r[0]) for r in required],
        )  # fmt: skip
        key = conn.execute(
            "SELECT a.attname FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = %s::regclass AND i.indisprimary",
            (self._target().as_string(conn),),
        ).fetchall()
        if sorted(str(r[0]) for r in key) != sorted(self.spec.key):
            raise SchemaMismatchError(
                f"postgresql sink: the primary key of {self._where} is "
                f"({', '.join(sorted(str(r[0]) for r in key)) or 'none'}), the source key is "
                f"({', '.join(self.spec.key)}): choose another table (?table=NAME)"
            )
        text_keys = [k for k in self.spec.key if self.spec.column(k).arrow == "string"]
        if text_keys:
            # a nondeterministic collation (ICU, deterministic = false) takes keys that
            # differ in letter case or accents for one (types QA: the snapshot failed with
            # "ON CONFLICT DO UPDATE command cannot affect row a second time"); SQLite
            # compares text keys byte for byte, as every deterministic collation does
            folding = conn.execute(
                "SELECT a.attname, c.collname FROM pg_attribute a "
                "JOIN pg_collation c ON c.oid = a.attcollation "
                "WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s) "
                "AND NOT c.collisdeterministic",
                (self._target().as_string(conn), text_keys),
            ).fetchall()
            if folding:
                name, collation = folding[0]
                raise SchemaMismatchError(
                    f"postgresql sink: key column {name} of {self._where} has the "
                    f"nondeterministic collation {collation}, which takes keys that differ "
                    "in letter case or accents for one row; SQLite compares text keys byte "
                    "for byte: give the column a deterministic collation (as litecdc creates "
                    "it), or choose another table (?table=NAME)"
                )
        for column in added:
            conn.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}").format(
                    self._target(), self._column_def(column)
                )
            )
        if added:
            log.info(
                "postgresql sink: added columns %s to %s.%s",
                [c.name for c in added],
                self.schema_name,
                self.table_name,
            )

    def _ensure_staging(self, conn: psycopg.Connection[Any]) -> None:
        """Session-private staging tables, emptied at every commit."""
        if self._staged_for is self.spec:
            return
        cols = [self._column_def(c) for c in self.spec.columns]
        cid = sql.SQL("{} BIGINT NOT NULL").format(self._ident(CID_COLUMN))
        keys = [self._column_def(self.spec.column(k)) for k in self.spec.key]
        for name, defs in ((_STAGE_UP, [*cols, cid]), (_STAGE_DEL, [*keys, cid])):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS pg_temp.{}").format(self._ident(name)))
            conn.execute(
                sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DELETE ROWS").format(
                    self._ident(name), sql.SQL(", ").join(defs)
                )
            )
        self._staged_for = self.spec

    # -- writes -----------------------------------------------------------------------

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        conn = self._connect()
        try:
            self._ensure_staging(conn)
            with conn.transaction():
                self._upsert(conn, rows)
        except psycopg.errors.ProgramLimitExceeded as exc:
            raise self._unstorable("writing a snapshot chunk to", exc, rows) from exc
        except psycopg.Error as exc:
            raise self._fail("writing a snapshot chunk to", exc) from exc

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        conn = self._connect()
        doing = f"applying changes up to cid {batch.end_cid} to"
        upserts: pa.Table | None = None
        try:
            self._ensure_staging(conn)
            with conn.transaction():
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (subscription, table_name, applied_cid) "
                        "VALUES ({}, {}, 0) ON CONFLICT (subscription, table_name) DO NOTHING"
                    ).format(
                        self._state(), sql.Literal(self.subscription), sql.Literal(self.table_name)
                    )
                )
                # the row lock makes check-and-apply atomic against another writer
                row = conn.execute(
                    sql.SQL("SELECT applied_cid FROM {} WHERE {} FOR UPDATE").format(
                        self._state(), self._mine()
                    )
                ).fetchone()
                applied = int(row[0]) if row else 0
                if batch.end_cid <= applied:
                    log.debug("postgresql sink: batch up to cid %d already applied", batch.end_cid)
                    return False
                if applied > 0 and events.num_rows:
                    events = events.filter(pc.greater(events[CID_COLUMN], applied))
                net = net_changes(events, self.spec)
                upserts = net.upserts
                self._upsert(conn, upserts)
                # a key too long for the index can be deleted: its lookup forms no entry
                self._delete(conn, net.deletes)
                conn.execute(
                    sql.SQL("UPDATE {} SET applied_cid = {} WHERE {}").format(
                        self._state(), sql.Literal(batch.end_cid), self._mine()
                    )
                )
        except psycopg.errors.ProgramLimitExceeded as exc:
            raise self._unstorable(doing, exc, upserts) from exc
        except psycopg.Error as exc:
            raise self._fail(doing, exc) from exc
        return True

    # -- keys the primary key's index cannot hold -------------------------------------

    def _unstorable(self, doing: str, exc: psycopg.Error, rows: pa.Table | None) -> SinkError:
        """A write failed with program_limit_exceeded (SQLSTATE 54000; the transaction is
        rolled back): an UnstorableKeyError naming the rows whose key no entry of the
        mirror's primary key index holds, when those are what PostgreSQL refused, else
        the failure as it is."""
        try:
            refused = self._refused_keys(rows) if rows is not None else []
        except psycopg.Error as probing:
            log.debug("postgresql sink: could not tell which keys were refused: %s", probing)
            refused = []
        if not refused:
            return self._fail(doing, exc)
        assert rows is not None
        first, detail = refused[0]
        sizes = [
            (k, len(v.encode()) if isinstance(v, str) else len(v))
            for k in self.spec.key
            if isinstance(v := rows[k][first].as_py(), str | bytes)
        ]
        if len(sizes) == 1:
            what = f"key column {sizes[0][0]!r} holds {sizes[0][1]} bytes"
        else:
            each = ", ".join(f"{k!r} {n} bytes" for k, n in sizes)
            what = f"key columns ({each}) hold {sum(n for _, n in sizes)} bytes"
        limit = _BTREE_MAXIMUM.search(detail)
        most = int(limit.group(1)) if limit else self._btree_max_entry
        shown = {k: short_value(rows[k][first].as_py()) for k in self.spec.key}
        more = f" (and {len(refused) - 1} more row(s))" if len(refused) > 1 else ""
        return UnstorableKeyError(
            f"postgresql sink: {self._where}: the row of table {self.spec.name} with key "
            f"{shown} cannot be mirrored: {what}, more than an entry of the mirror's primary "
            f"key index holds (at most {most} bytes, after compression; PostgreSQL: "
            f"{detail}){more}: delete the row or shorten its key at the source (the "
            "subscription goes on once that change comes)",
            [tuple(rows[k][i].as_py() for k in self.spec.key) for i, _ in refused],
        )

    def _refused_keys(self, rows: pa.Table) -> list[tuple[int, str]]:
        """The rows of ``rows`` whose index entry PostgreSQL refuses (program_limit_exceeded),
        with its message, in row order.

        Whether a key fits depends on how PostgreSQL compresses it (pglz or lz4, as this
        session's default_toast_compression says) — 100,000 times one letter fits in an
        entry, 2,693 random bytes do not — so PostgreSQL is asked: each row whose key might
        not fit is inserted alone into an empty copy of the mirror, in a savepoint of a
        transaction that is rolled back.
        A key of fewer bytes than an entry holds, less its headers, always fits and is not
        tried.
        """
        variable = [k for k in self.spec.key if self.spec.column(k).arrow in ("string", "binary")]
        if not variable:
            return []  # numbers only: a few dozen bytes
        conn = self._connect()
        row = conn.execute("SHOW block_size").fetchone()
        block = int(row[0]) if row else 8192
        # BTMaxItemSize: a third of a page less the page's headers, less an item pointer
        self._btree_max_entry = (block - 56) // 3 // 8 * 8 - 8
        # an entry is its key's bytes and at most 8 of header, 4 of length and 7 of
        # alignment per column (any index entry holds at most 8,191 bytes)
        fits = min(self._btree_max_entry, 8191) - 8 - 11 * len(self.spec.key)
        fits -= 8 * (len(self.spec.key) - len(variable))  # the numbers' bytes
        total = pc.binary_length(rows[variable[0]])  # text: its UTF-8 bytes
        for name in variable[1:]:
            total = pc.add(total, pc.binary_length(rows[name]))
        tried = pc.indices_nonzero(pc.fill_null(pc.greater(total, fits), False)).to_pylist()
        names = [*self.spec.column_names, CID_COLUMN]
        # tried on an empty copy of the mirror (its columns, compression and indexes), not
        # on the mirror: a user's trigger there would fire, and a non-transactional effect
        # (a sequence's nextval) outlive the rollback
        probe = sql.Identifier("litecdc_key_probe")
        insert = sql.SQL("INSERT INTO {} ({}) VALUES ").format(
            probe, sql.SQL(", ").join(self._ident(n) for n in names)
        )
        conflict = sql.SQL(" ON CONFLICT ({}) DO NOTHING").format(
            sql.SQL(", ").join(self._ident(k) for k in self.spec.key)
        )
        refused: list[tuple[int, str]] = []
        with conn.transaction(force_rollback=True):
            conn.execute(
                sql.SQL("CREATE TEMP TABLE {} (LIKE {} INCLUDING ALL) ON COMMIT DROP").format(
                    probe, self._target()
                )
            )
            for index in tried:
                values = sql.SQL(", ").join(sql.Literal(rows[n][index].as_py()) for n in names)
                try:
                    with conn.transaction():
                        conn.execute(insert + sql.SQL("(") + values + sql.SQL(")") + conflict)
                except psycopg.errors.ProgramLimitExceeded as exc:
                    refused.append((index, exc.diag.message_primary or str(exc)))
        return refused

    def _copy(
        self, conn: psycopg.Connection[Any], stage: str, rows: pa.Table, columns: Sequence[Column]
    ) -> None:
        names = [c.name for c in columns] + [CID_COLUMN]
        types = [COPY_TYPES[c.arrow] for c in columns] + ["int8"]
        statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self._ident(stage), sql.SQL(", ").join(self._ident(n) for n in names)
        )
        data = _columns_as_python(rows, names)
        with conn.cursor() as cur, cur.copy(statement) as copy:
            copy.set_types(types)
            for record in zip(*data, strict=True):
                copy.write_row(record)

    def _nul_rows(self, rows: pa.Table, columns: Iterable[Column]) -> dict[str, pa.Array]:
        """Per text column of ``columns``: which rows hold a NUL character, where any do."""
        found = {}
        for column in columns:
            if column.arrow != "string":
                continue
            nul = pc.fill_null(pc.match_substring(rows[column.name], "\x00"), False)
            if pc.any(nul).as_py():
                found[column.name] = nul
        return found

    def _check_text(self, rows: pa.Table) -> None:
        """SchemaMismatchError naming the table, column and key of a text value holding a
        NUL character, before anything is written: PostgreSQL's text cannot store one
        (COPY failed with 'invalid byte sequence for encoding "UTF8": 0x00', naming
        neither the column nor the row)."""
        found = self._nul_rows(rows, self.spec.columns)
        if not found:
            return
        name, nul = next(iter(found.items()))
        index = pc.index(nul, True).as_py()
        key = {k: short_value(rows[k][index].as_py()) for k in self.spec.key}
        count = pc.sum(nul).as_py()
        more = f" (and {count - 1} more row(s))" if count > 1 else ""
        raise SchemaMismatchError(
            f"postgresql sink: {self._where}: column {name!r} of the row of table "
            f"{self.spec.name} with key {key} holds a NUL character (\\x00), which "
            f"PostgreSQL's text cannot store{more}: remove it at the source (the "
            "subscription goes on once that change comes), or keep such values in a BLOB "
            "column"
        )

    def _upsert(self, conn: psycopg.Connection[Any], rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self._check_text(rows)
        self._copy(conn, _STAGE_UP, rows, self.spec.columns)
        names = [*self.spec.column_names, CID_COLUMN]
        cols = sql.SQL(", ").join(self._ident(n) for n in names)
        keyset = set(self.spec.key)
        # the cid is assigned last so the WHERE guard compares against the stored one
        updates = sql.SQL(", ").join(
            sql.SQL("{0} = EXCLUDED.{0}").format(self._ident(n)) for n in names if n not in keyset
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {target} AS t ({cols}) SELECT {cols} FROM {stage} "
                "ON CONFLICT ({key}) DO UPDATE SET {updates} "
                "WHERE EXCLUDED.{cid} > t.{cid}"
            ).format(
                target=self._target(),
                cols=cols,
                stage=self._ident(_STAGE_UP),
                key=sql.SQL(", ").join(self._ident(k) for k in self.spec.key),
                updates=updates,
                cid=self._ident(CID_COLUMN),
            )
        )

    def _delete(self, conn: psycopg.Connection[Any], keys: pa.Table) -> None:
        key_columns = [self.spec.column(k) for k in self.spec.key]
        nul = self._nul_rows(keys, key_columns)
        if nul:  # no such key can be in the mirror (its upsert was refused): nothing to do
            keys = keys.filter(pc.invert(_either(nul.values())))
        if keys.num_rows == 0:
            return
        self._copy(conn, _STAGE_DEL, keys, key_columns)
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{0} = d.{0}").format(self._ident(k)) for k in self.spec.key
        )
        conn.execute(
            sql.SQL(
                "DELETE FROM {target} AS t USING {stage} AS d WHERE {match} AND t.{cid} < d.{cid}"
            ).format(
                target=self._target(),
                stage=self._ident(_STAGE_DEL),
                match=match,
                cid=self._ident(CID_COLUMN),
            )
        )

    def _rows_changed(self, statement: sql.Composed, doing: str) -> int:
        """Run one statement on the mirror in a transaction of its own; the rows it
        changed."""
        conn = self._connect()
        try:
            with conn.transaction():
                return int(conn.execute(statement).rowcount)
        except psycopg.Error as exc:
            raise self._fail(doing, exc) from exc

    def disown_rows(self, init_cid: int) -> int:
        cid, init = self._ident(CID_COLUMN), sql.Literal(int(init_cid))
        return self._rows_changed(
            sql.SQL("UPDATE {} SET {cid} = 0 WHERE {cid} >= {init}").format(
                self._target(), cid=cid, init=init
            ),
            "taking over the rows of an earlier subscription in",
        )

    def finish_snapshot(self, init_cid: int) -> int:
        deleted = self._rows_changed(
            sql.SQL("DELETE FROM {} WHERE {} < {}").format(
                self._target(), self._ident(CID_COLUMN), sql.Literal(int(init_cid))
            ),
            "sweeping",
        )
        if deleted:
            log.info("postgresql sink: removed %d rows the snapshot did not see", deleted)
        return deleted

    # -- reads ------------------------------------------------------------------------

    def applied_cid(self) -> int:
        conn = self._connect()
        try:
            row = conn.execute(
                sql.SQL("SELECT applied_cid FROM {} WHERE {}").format(self._state(), self._mine())
            ).fetchone()
        except psycopg.errors.UndefinedTable:
            return 0  # prepare() has not run yet: nothing applied
        except psycopg.Error as exc:
            raise self._fail("reading the state of", exc) from exc
        return int(row[0]) if row else 0

    def read_row_batches(self, batch_rows: int = READ_BATCH_ROWS) -> Generator[pa.Table]:
        conn = self._connect()
        names = self.spec.column_names
        statement = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(self._ident(n) for n in names), self._target()
        )
        schema = pa.schema([pa.field(c.name, c.arrow_type) for c in self.spec.columns])
        try:
            # a server-side cursor (in a transaction: it lives in one), fetched in parts:
            # fetchall held the whole mirror as Python tuples; binary: floats as stored
            with (
                conn.transaction(),
                conn.cursor(name="litecdc_verify", binary=True) as cur,
            ):
                cur.execute(statement)
                while records := cur.fetchmany(batch_rows):
                    columns = list(zip(*records, strict=True))
                    yield pa.table(
                        [pa.array(_plain(c), f.type) for c, f in zip(columns, schema, strict=True)],
                        schema=schema,
                    )
        except psycopg.errors.UndefinedTable as exc:
            raise SinkError(
                f"postgresql sink: there is no table {self._where} yet: has `litecdc "
                "pipeline run` copied this subscription?"
            ) from exc
        except psycopg.Error as exc:
            if conn.broken or conn.closed:
                # (scale QA: a server stopped mid-read said only "received 2 results
                # from command 'FETCH FORWARD …'")
                raise SinkUnreachableError(
                    f"postgresql sink: the server of {mask_url(self.url)} went away while "
                    f"verify read {self._where}: {self._scrub(exc)}"
                ) from exc
            raise self._fail("reading", exc) from exc

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _answered(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt got the server's own answer (libpq gives its
    FATAL message: credentials, too many connections…), not silence or a reset."""
    return "FATAL" in str(exc)


def _either(masks: Iterable[pa.Array]) -> pa.Array:
    """The rows any of the masks marks."""
    found = iter(masks)
    out = next(found)
    for mask in found:
        out = pc.or_(out, mask)
    return out


def _columns_as_python(rows: pa.Table, names: Iterable[str]) -> list[list[Any]]:
    return [rows[name].to_pylist() for name in names]


def _plain(values: Iterable[Any]) -> list[Any]:
    """Driver values as Arrow takes them (bytea may come back as memoryview)."""
    return [bytes(v) if isinstance(v, memoryview) else v for v in values]
