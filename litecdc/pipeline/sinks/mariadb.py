"""MariaDB / MySQL mirror through PyMySQL.

The table (``?table=``, default the source table's name) is created if missing (InnoDB,
utf8mb4): int64 → BIGINT, float64 → DOUBLE, string → LONGTEXT, binary → LONGBLOB, plus
``_litecdc_cid BIGINT NOT NULL`` and a PRIMARY KEY on the key columns.

Key columns of type string or binary are VARBINARY: InnoDB cannot index LONGTEXT whole,
and a text key as VARBINARY compares byte for byte like SQLite's BINARY collation
(utf8mb4 collations would fold case or ignore trailing spaces: 'a' and 'A', or 'a' and
'a ', would collide). The key columns share InnoDB's 3072-byte index limit
(``KEY_BYTES``): VARBINARY(3072) for one text or blob key column, 3072 minus 8 bytes per
numeric key column, split evenly between several text/blob ones. A longer key value is
never truncated: an upsert of it is an ``UnstorableKeyError`` naming the table, column
and limit (checked before anything of the write), and a delete of it is skipped — such
a row cannot be in the mirror — so the subscription goes on once the row is deleted at
the source.

DOUBLE keeps every other float bit for bit (subnormals, 1e308), but MariaDB stores
-0.0 as 0.0 (SQLite REAL columns do the same; only untyped columns can hold -0.0) and
cannot hold ±infinity: such a value stops the subscription with a SchemaMismatchError
naming the column and key.

Writes: multi-row ``INSERT … ON DUPLICATE KEY UPDATE col = IF(VALUES(cid) > cid,
VALUES(col), col)`` with ``_litecdc_cid`` assigned last (MariaDB evaluates the
assignments in order, so earlier ones still compare against the stored cid); deletes
through a temporary staging table (``DELETE t FROM t JOIN staging``). A change batch and
its ``litecdc_sink_state`` record (per subscription and table) commit together. A
statement that names the mirror or its columns runs without driver arguments (values
escaped into it): PyMySQL %-formats a query given arguments, its names too.

Example::

    sink = MariaDBSink("mysql://root@127.0.0.1:3306/app?table=orders", spec, "orders-my")
    sink.prepare()
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pymysql

from litecdc.errors import SchemaMismatchError, SinkError, SinkUnreachableError
from litecdc.pipeline.events import net_changes
from litecdc.pipeline.sinks.base import (
    PROBE_GRACE,
    READ_BATCH_ROWS,
    ChangeBatch,
    Sink,
    UnstorableKeyError,
    check_case_blind_names,
    check_mirror_columns,
    short_value,
)
from litecdc.pipeline.sinks.registry import SqlOptions, mask_url, parse_sink_url, scrub_password
from litecdc.pipeline.tables import CID_COLUMN, Column, TableSpec
from litecdc.sockets import shut_down_socket
from litecdc.wire import by_letter_fold

log = logging.getLogger("litecdc.pipeline")

MY_TYPES = {"int64": "BIGINT", "float64": "DOUBLE", "string": "LONGTEXT", "binary": "LONGBLOB"}
#: information_schema DATA_TYPE values an existing column may have.
ACCEPTED_TYPES = {
    "int64": {"bigint"},
    "float64": {"double"},
    "string": {"longtext", "mediumtext", "text", "varchar", "varbinary"},
    "binary": {"longblob", "mediumblob", "blob", "varbinary"},
}
KEY_BYTES = 3072  # InnoDB's limit on an index key (DYNAMIC rows, the default)
MAX_IDENTIFIER_CHARS = 64  # MariaDB's longest table or column name
#: collation names that compare byte for byte without padding (MariaDB's, MySQL 8's)
_NO_PAD_BINARY = ("_nopad_bin", "_0900_bin")
#: error codes from here on are the client's (CR_*: could not connect, lost the
#: connection, timed out); below, the server answered with them (ER_*)
_CLIENT_ERRORS = 2000
STATE_TABLE = "litecdc_sink_state"
_STAGE_DEL = "litecdc_stage_deletes"
_ROWS_PER_STATEMENT = 1000  # multi-row INSERT size (also bounded by max_allowed_packet)
#: bytes of a statement left under max_allowed_packet (the packet's own header and more)
_PACKET_HEADROOM = 1024
#: the client's own cap on a statement (PyMySQL's default is 16 MiB): the server's
#: max_allowed_packet decides, up to MariaDB's largest (1 GiB)
_CLIENT_MAX_PACKET = 1 << 30
_DATA_ERRORS = {1264, 1265, 1366, 1406, 1048, 1367}  # out of range, truncated, bad string…


def _most_bytes(rows: pa.Table, names: Sequence[str]) -> list[int]:
    """Per row, at least as many bytes as it takes as SQL values: text twice its bytes
    (escapes), a blob twice its bytes (PyMySQL writes it in hex), their quotes and
    _binary X prefix, anything else 32, and the separators — from Arrow's lengths,
    without looking at each value in Python."""
    total = pa.array([4 + 2 * len(names)] * rows.num_rows, pa.int64())
    for name in names:
        column = rows[name]
        if pa.types.is_string(column.type) or pa.types.is_binary(column.type):
            length = pc.fill_null(pc.binary_length(column), 0)
            total = pc.add(total, pc.add(pc.multiply(length.cast(pa.int64()), 2), 12))
        else:
            total = pc.add(total, 32)
    return list(total.to_pylist())


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class _KeyLimit:
    """How long a value a text or blob key column of the mirror holds."""

    column_type: str  # as the server reports it: 'varbinary(3064)', 'varchar(100)'
    length: int  # its maximum length, in ...
    chars: bool  # ... characters (VARCHAR/CHAR), else bytes
    octets: int  # that maximum in bytes (utf8mb4: 4 per character)

    @property
    def unit(self) -> str:
        return "characters" if self.chars else "bytes"


class MariaDBSink(Sink):
    kind = "mirror"
    label = "mariadb sink"
    probes = True

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, SqlOptions) or options.dialect != "mysql":
            raise SinkError(f"mariadb sink: {mask_url(url)} is not a mysql:// URL")
        self.options = options
        self.table_name = options.table or spec.name
        self._where = f"{self.table_name} at {mask_url(url)}"
        self._conn: Any = None
        self._staged_for: TableSpec | None = None
        self._packet_limit: int | None = None  # the server's max_allowed_packet
        #: text/blob key columns → what they hold (read from the table by ``prepare``)
        self._key_limits: dict[str, _KeyLimit] = self._created_key_limits()
        self.probe_timeout = max(1, math.ceil(options.connect_timeout)) + PROBE_GRACE

    # -- connection -------------------------------------------------------------------

    def _params(self) -> dict[str, Any]:
        o = self.options
        return {
            "host": o.host,
            "port": o.port,
            "user": o.user or "root",
            "password": o.password or "",
            "database": o.database,
            "charset": "utf8mb4",
            "connect_timeout": max(1, math.ceil(o.connect_timeout)),
        }

    def _connect(self) -> Any:
        if self._conn is not None and self._conn.open:
            return self._conn
        handshake = self._params()["connect_timeout"]
        try:
            # PyMySQL's connect_timeout bounds the TCP connect only: the read and write
            # timeouts bound the handshake (a frozen server accepts, then never answers),
            # and are lifted once connected — a statement may take its time
            conn = pymysql.connect(
                **self._params(),
                autocommit=False,
                binary_prefix=True,  # blobs sent as _binary'…': no charset conversion
                max_allowed_packet=_CLIENT_MAX_PACKET,
                # strict: a value that does not fit is an error, never silently cut
                init_command="SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",
                read_timeout=handshake,
                write_timeout=handshake,
            )
            conn._read_timeout = conn._write_timeout = None  # PyMySQL applies it per packet
            self._conn = conn
        except pymysql.err.MySQLError as exc:
            why = self._scrub(exc)
            if _answered(exc):  # refused by the server itself: its message says why
                raise SinkError(
                    f"mariadb sink: cannot connect to {mask_url(self.url)}: {why}"
                ) from exc
            if "timed out" in why:  # PyMySQL: "Lost connection … during query (timed out)"
                why = (
                    "the server took the connection and did not answer within "
                    f"connect_timeout ({handshake} s)"
                )
            raise SinkUnreachableError(
                f"mariadb sink: cannot connect to {mask_url(self.url)}: {why}: "
                "check the server is up and the URL's credentials"
            ) from exc
        self._staged_for = None
        self._packet_limit = None
        return self._conn

    def probe(self) -> None:
        try:
            conn = pymysql.connect(**self._params(), read_timeout=PROBE_GRACE)
            try:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
            finally:
                conn.close()
        except pymysql.err.MySQLError as exc:
            if _answered(exc):
                return  # refusing (too many connections…): alive
            raise SinkUnreachableError(
                f"mariadb sink: the server of {mask_url(self.url)} does not answer: "
                f"{self._scrub(exc)}"
            ) from exc

    def abort(self) -> None:
        sock = getattr(self._conn, "_sock", None)  # PyMySQL's socket (None once closed)
        if sock is not None:
            shut_down_socket(sock.fileno())

    def _scrub(self, exc: BaseException) -> str:
        text = str(exc.args[-1] if exc.args else exc)
        return scrub_password(text, self.options.password, self.options.user or "root")

    def _fail(self, doing: str, exc: Exception) -> SinkError:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        if isinstance(exc, pymysql.err.DataError) or code in _DATA_ERRORS:
            return SchemaMismatchError(
                f"mariadb sink: {doing} {self._where}: a value the column cannot take: "
                f"{self._scrub(exc)}"
            )
        return SinkError(f"mariadb sink: {doing} {self._where} failed: {self._scrub(exc)}")

    def _rollback(self) -> None:
        try:
            if self._conn is not None and self._conn.open:
                self._conn.rollback()
        except pymysql.err.MySQLError:
            self._conn.close()
            self._conn = None

    # -- set-up -----------------------------------------------------------------------

    def _key_type(self, column: Column) -> str:
        if column.arrow in ("int64", "float64"):
            return MY_TYPES[column.arrow]
        fixed = sum(8 for k in self.spec.key if self.spec.column(k).arrow in ("int64", "float64"))
        variable = sum(
            1 for k in self.spec.key if self.spec.column(k).arrow in ("string", "binary")
        )
        return f"VARBINARY({(KEY_BYTES - fixed) // max(1, variable)})"

    def _column_def(self, column: Column) -> str:
        kind = self._key_type(column) if column.name in self.spec.key else MY_TYPES[column.arrow]
        return f"{_q(column.name)} {kind}"

    def _created_key_limits(self) -> dict[str, _KeyLimit]:
        """The limits of the key columns of a table this sink creates."""
        limits = {}
        for name in self.spec.key:
            column = self.spec.column(name)
            if column.arrow in ("string", "binary"):
                kind = self._key_type(column)
                n = int(kind[kind.index("(") + 1 : -1])
                limits[name] = _KeyLimit(kind.lower(), n, chars=False, octets=n)
        return limits

    def _read_key_limits(self, cur: Any) -> dict[str, _KeyLimit]:
        """The limits of the mirror's text/blob key columns, as the table has them (it
        may have been created by hand, or with other lengths)."""
        cur.execute(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, CHARACTER_MAXIMUM_LENGTH, "
            "CHARACTER_OCTET_LENGTH FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (self.table_name,),
        )
        limits = {}
        for name, data_type, column_type, max_length, octets in cur.fetchall():
            name = str(name)
            if name not in self.spec.key or max_length is None:
                continue
            if self.spec.column(name).arrow not in ("string", "binary"):
                continue
            chars = str(data_type).lower() in ("varchar", "char")
            limits[name] = _KeyLimit(
                str(column_type).lower(), int(max_length), chars, int(octets or max_length)
            )
        return limits

    def check_names(self) -> None:
        """What MariaDB cannot name (types QA: a character beyond U+FFFF failed every
        retry with 'Illegal mix of collations …'): its identifiers are utf8mb3 — at most
        64 characters of the Basic Multilingual Plane, none ending in a space."""
        names = [
            ("table", self.table_name, "choose another (?table=NAME)"),
            *(("column", c.name, "rename it at the source") for c in self.spec.columns),
        ]
        for kind, name, remedy in names:
            problem = None
            astral = next((ch for ch in name if ord(ch) > 0xFFFF), None)
            if astral is not None:
                problem = f"holds {astral!r} (U+{ord(astral):X}), beyond the characters it takes"
            elif len(name) > MAX_IDENTIFIER_CHARS:
                problem = (
                    f"is {len(name)} characters, more than the {MAX_IDENTIFIER_CHARS} it takes"
                )
            elif name.endswith(" "):
                problem = "ends with a space, which it does not take"
            if problem is not None:
                raise SchemaMismatchError(
                    f"mariadb sink: {self._where}: {kind} name {name!r} {problem} in a name: "
                    f"{remedy}"
                )
        if self.table_name.lower() in (STATE_TABLE, _STAGE_DEL):
            # idents QA: named as the staging table, the mirror was hidden by it (a
            # temporary table takes its name in the session): every change was lost
            raise SchemaMismatchError(
                f"mariadb sink: {self._where}: table name {self.table_name!r} is the sink's "
                "own (it keeps its progress or stages deletes under it): choose another "
                "(?table=NAME)"
            )
        check_case_blind_names(
            "mariadb",
            "MariaDB",
            self._where,
            [*self.spec.column_names, CID_COLUMN],
            by_letter_fold,
        )

    def prepare(self) -> None:
        self.check_names()
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                # DDL commits implicitly in MariaDB: none of it is inside a batch
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {_q(STATE_TABLE)} ("
                    "subscription VARCHAR(255) NOT NULL, table_name VARCHAR(255) NOT NULL, "
                    "applied_cid BIGINT NOT NULL, PRIMARY KEY (subscription, table_name)) "
                    "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
                )
                cur.execute(
                    "SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                    (self.table_name,),
                )
                existing = {str(n): str(t).lower() for n, t in cur.fetchall()}
                if not existing:
                    self._create_table(cur)
                    cur.execute(
                        f"DELETE FROM {_q(STATE_TABLE)} WHERE subscription = %s "
                        "AND table_name = %s",
                        (self.subscription, self.table_name),
                    )
                else:
                    self._check_and_extend(cur, existing)
                self._key_limits = self._read_key_limits(cur)
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail("preparing", exc) from exc
        self._staged_for = None

    def forget_progress(self) -> None:
        """Drop the record an earlier subscription of this name left for this table (the
        mirror table was kept, so prepare() did not): with it, the new subscription's
        batches at or below its cid — from another source, say — were skipped."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"DELETE FROM {_q(STATE_TABLE)} WHERE subscription = %s AND table_name = %s",
                    (self.subscription, self.table_name),
                )
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail("forgetting an earlier subscription's progress in", exc) from exc

    def _create_table(self, cur: Any) -> None:
        defs = [self._column_def(c) for c in self.spec.columns]
        defs.append(f"{_q(CID_COLUMN)} BIGINT NOT NULL")
        defs.append(f"PRIMARY KEY ({', '.join(_q(k) for k in self.spec.key)})")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {_q(self.table_name)} ({', '.join(defs)}) "
            "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        )
        log.info("mariadb sink: created table %s", self.table_name)

    def _check_and_extend(self, cur: Any, existing: dict[str, str]) -> None:
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
            "DATABASE() AND TABLE_NAME = %s AND IS_NULLABLE = 'NO' AND COLUMN_DEFAULT IS NULL "
            # (GENERATION_EXPRESSION: MariaDB and MySQL both have it, NULL or '' for a
            # column that is not generated; IS_GENERATED is MariaDB's only — review)
            "AND EXTRA NOT LIKE '%%auto_increment%%' AND COALESCE(GENERATION_EXPRESSION, '') = ''",
            (self.table_name,),
        )
        required = [str(r[0]) for r in cur.fetchall()]
        added = check_mirror_columns(
            "mariadb", self._where, existing, self.spec, ACCEPTED_TYPES, MY_TYPES,
            required=required,
        )  # fmt: skip
        cur.execute(
            "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE WHERE "
            "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND CONSTRAINT_NAME = 'PRIMARY'",
            (self.table_name,),
        )
        key = sorted(str(r[0]) for r in cur.fetchall())
        if key != sorted(self.spec.key):
            raise SchemaMismatchError(
                f"mariadb sink: the primary key of {self._where} is ({', '.join(key) or 'none'}), "
                f"the source key is ({', '.join(self.spec.key)}): choose another table "
                "(?table=NAME)"
            )
        self._check_key_collations(cur)
        if added:
            columns = ", ".join(f"ADD COLUMN {self._column_def(c)}" for c in added)
            cur.execute(f"ALTER TABLE {_q(self.table_name)} {columns}")
            log.info(
                "mariadb sink: added columns %s to %s", [c.name for c in added], self.table_name
            )

    def _check_key_collations(self, cur: Any) -> None:
        """A text key column of an existing mirror must compare byte for byte, as SQLite's
        BINARY collation does (types QA: a VARCHAR key in utf8mb4_general_ci merged 'A',
        'a ' and 'a  ' into one row, silently): VARBINARY, or a NO PAD binary collation.
        (The _bin collations are PAD SPACE: 'a' and 'a ' are one key there.)"""
        cur.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            (self.table_name,),
        )
        for name, column_type, collation in cur.fetchall():
            name = str(name)
            if name not in self.spec.key or self.spec.column(name).arrow != "string":
                continue
            kind = str(column_type).lower()
            if collation is None and kind.startswith("varbinary"):
                continue
            if collation is not None and str(collation).lower().endswith(_NO_PAD_BINARY):
                continue
            compares = f"collation {collation}" if collation is not None else "zero padding"
            raise SchemaMismatchError(
                f"mariadb sink: key column {name} of {self._where} is {kind} with {compares}, "
                "which takes keys that differ in letter case or trailing spaces (or "
                "trailing zero bytes) for one row; SQLite compares text keys byte for byte: "
                "make the column VARBINARY (as litecdc creates it) or give it a NO PAD binary "
                "collation (utf8mb4_nopad_bin; MySQL: utf8mb4_0900_bin), or choose another "
                "table (?table=NAME)"
            )
        # a key on a prefix of a column takes keys alike in that prefix for one (review)
        cur.execute(
            "SELECT COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS WHERE "
            "TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME = 'PRIMARY' "
            "AND SUB_PART IS NOT NULL",
            (self.table_name,),
        )
        prefixed = cur.fetchall()
        if prefixed:
            name, length = prefixed[0]
            raise SchemaMismatchError(
                f"mariadb sink: the primary key of {self._where} holds only the first "
                f"{length} characters or bytes of column {name}: keys alike in those would "
                "be one row; key the whole column, or choose another table (?table=NAME)"
            )

    def _ensure_staging(self, cur: Any) -> None:
        if self._staged_for is self.spec:
            return
        # the keys of deletes, as long as the mirror's key columns hold (longer ones are
        # not staged: they cannot be in the mirror); bytes, compared like the mirror's
        keys = [
            f"{_q(k)} VARBINARY({self._key_limits[k].octets})"
            if k in self._key_limits
            else self._column_def(self.spec.column(k))
            for k in self.spec.key
        ]
        cur.execute(f"DROP TEMPORARY TABLE IF EXISTS {_q(_STAGE_DEL)}")
        cur.execute(
            f"CREATE TEMPORARY TABLE {_q(_STAGE_DEL)} ({', '.join(keys)}, "
            f"{_q(CID_COLUMN)} BIGINT NOT NULL) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )
        self._staged_for = self.spec

    # -- writes -----------------------------------------------------------------------

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._upsert(cur, rows)
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail("writing a snapshot chunk to", exc) from exc
        except SinkError:  # ours: a value it cannot take, a row too large…
            self._rollback()
            raise

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                self._ensure_staging(cur)
                conn.begin()
                cur.execute(
                    f"INSERT IGNORE INTO {_q(STATE_TABLE)} (subscription, table_name, "
                    "applied_cid) VALUES (%s, %s, 0)",
                    (self.subscription, self.table_name),
                )
                # the row lock makes check-and-apply atomic against another writer
                cur.execute(
                    f"SELECT applied_cid FROM {_q(STATE_TABLE)} WHERE subscription = %s "
                    "AND table_name = %s FOR UPDATE",
                    (self.subscription, self.table_name),
                )
                row = cur.fetchone()
                applied = int(row[0]) if row else 0
                if batch.end_cid <= applied:
                    conn.rollback()
                    log.debug("mariadb sink: batch up to cid %d already applied", batch.end_cid)
                    return False
                if applied > 0 and events.num_rows:
                    events = events.filter(pc.greater(events[CID_COLUMN], applied))
                net = net_changes(events, self.spec)
                self._upsert(cur, net.upserts)
                self._delete(cur, self._storable(net.deletes))
                cur.execute(
                    f"UPDATE {_q(STATE_TABLE)} SET applied_cid = %s WHERE subscription = %s "
                    "AND table_name = %s",
                    (batch.end_cid, self.subscription, self.table_name),
                )
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail(f"applying changes up to cid {batch.end_cid} to", exc) from exc
        except SinkError:  # ours: a value it cannot take, a row too large…
            self._rollback()
            raise
        return True

    def _insert_rows(
        self, cur: Any, head: str, tail: str, names: Sequence[str], table: pa.Table
    ) -> None:
        """Multi-row INSERTs of at most ``_ROWS_PER_STATEMENT`` rows, each statement
        smaller than the server's ``max_allowed_packet`` (QA: 1,500 rows of 20 KB, or 20
        of 1 MB, made one statement the server refused, or dropped the connection over,
        on every retry).

        The values are escaped by the driver (``mogrify``) on their own and the statement
        runs without arguments: with arguments PyMySQL %-formats the whole query, the
        quoted table and column names too (a table named ``x%`` failed, and one named
        ``x%s`` would have taken a value).
        """
        rows = list(zip(*(table[n].to_pylist() for n in names), strict=True))
        most_bytes = _most_bytes(table, names)
        one = "(" + ", ".join(["%s"] * len(names)) + ")"
        limit = self._max_packet(cur)
        budget = limit - len(f"{head} VALUES {tail}".encode()) - _PACKET_HEADROOM
        rest = 0
        while rest < len(rows):  # the common case: a whole statement's rows surely fit
            part = rows[rest : rest + _ROWS_PER_STATEMENT]
            if sum(most_bytes[rest : rest + _ROWS_PER_STATEMENT]) > budget:
                break
            values = cur.mogrify(", ".join([one] * len(part)), [v for r in part for v in r])
            cur.execute(f"{head} VALUES {values}{tail}")
            rest += len(part)
        parts: list[str] = []
        size = 0
        for row in rows[rest:]:
            text = cur.mogrify(one, row)
            # as the driver sends it: UTF-8 (a blob is written in hex already)
            length = len(text.encode("utf-8", "surrogateescape")) + 2  # and ", "
            if length > budget:
                key = {k: short_value(row[names.index(k)]) for k in self.spec.key}
                raise SinkError(
                    f"mariadb sink: {self._where}: the row of table {self.spec.name} with key "
                    f"{key} takes {length:,} bytes as SQL, more than the server's "
                    f"max_allowed_packet ({limit:,} bytes) allows in one statement: raise it "
                    "on the server (SET GLOBAL max_allowed_packet = 1073741824; MariaDB "
                    "takes up to 1 GiB)"
                )
            if parts and (size + length > budget or len(parts) >= _ROWS_PER_STATEMENT):
                cur.execute(f"{head} VALUES {', '.join(parts)}{tail}")
                parts, size = [], 0
            parts.append(text)
            size += length
        if parts:
            cur.execute(f"{head} VALUES {', '.join(parts)}{tail}")

    def _max_packet(self, cur: Any) -> int:
        """The server's max_allowed_packet, read once per connection."""
        if self._packet_limit is None:
            cur.execute("SELECT @@max_allowed_packet")
            self._packet_limit = int(cur.fetchone()[0])
        return self._packet_limit

    def _check_finite(self, rows: pa.Table) -> None:
        """SchemaMismatchError naming the column and key of a ±infinity: MariaDB's DOUBLE
        cannot hold it (the driver failed with '-inf can not be used with MySQL')."""
        for column in self.spec.columns:
            if column.arrow_type != pa.float64():
                continue
            values = rows[column.name]
            finite = pc.fill_null(pc.is_finite(values), True)
            if pc.all(finite).as_py():
                continue
            index = pc.index(finite, False).as_py()
            key = {k: rows[k][index].as_py() for k in self.spec.key}
            raise SchemaMismatchError(
                f"mariadb sink: {self._where}: column {column.name!r} of the row with key "
                f"{key} holds {values[index].as_py()}, which MariaDB's DOUBLE cannot store"
            )

    def _too_long(self, rows: pa.Table) -> dict[str, pa.Array]:
        """Per text/blob key column with a limit: which rows' value is longer."""
        found = {}
        for name, limit in self._key_limits.items():
            values = rows[name]
            if limit.chars and pa.types.is_string(values.type):
                lengths = pc.utf8_length(values)
            else:
                lengths = pc.binary_length(values)  # UTF-8 bytes of text
            too_long = pc.fill_null(pc.greater(lengths, limit.length), False)
            if pc.any(too_long).as_py():
                found[name] = too_long
        return found

    def _storable(self, deletes: pa.Table) -> pa.Table:
        """Deletes without the keys longer than the mirror's key columns hold: no such
        row can be in the mirror (its upsert was refused), so there is nothing to delete —
        and once the row is deleted at the source, the subscription goes on."""
        too_long = self._too_long(deletes)
        if not too_long:
            return deletes
        refused = _either(too_long.values())
        log.info(
            "mariadb sink: %s: skipped %d delete(s) of keys longer than its key columns hold",
            self.table_name, pc.sum(refused).as_py(),
        )  # fmt: skip
        return deletes.filter(pc.invert(refused))

    def _check_keys(self, rows: pa.Table) -> None:
        """UnstorableKeyError naming the table, column and limit when a row's key is
        longer than the mirror's key column holds (before anything is written: the
        server's strict mode would refuse it with 'Data too long', naming neither)."""
        too_long = self._too_long(rows)
        if not too_long:
            return
        name, mask = next(iter(too_long.items()))
        indices = pc.indices_nonzero(_either(too_long.values())).to_pylist()
        keys = [tuple(rows[k][i].as_py() for k in self.spec.key) for i in indices]
        first = pc.index(mask, True).as_py()
        value = rows[name][first].as_py()
        limit = self._key_limits[name]
        size = len(value) if limit.chars or isinstance(value, bytes) else len(value.encode())
        shown = {k: short_value(rows[k][first].as_py()) for k in self.spec.key}
        more = f" (and {len(keys) - 1} more row(s))" if len(keys) > 1 else ""
        raise UnstorableKeyError(
            f"mariadb sink: {self._where}: the row of table {self.spec.name} with key {shown} "
            f"cannot be mirrored: key column {name!r} is {limit.column_type}, at most "
            f"{limit.length} {limit.unit} (InnoDB indexes at most {KEY_BYTES} bytes of a "
            f"key), and its value is {size} {limit.unit}{more}: delete the row or shorten "
            "its key at the source (the subscription goes on once that change comes), or "
            "mirror the table into PostgreSQL",
            keys,
        )

    def _upsert(self, cur: Any, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        self._check_keys(rows)
        self._check_finite(rows)
        names = [*self.spec.column_names, CID_COLUMN]
        cid = _q(CID_COLUMN)
        newer = f"VALUES({cid}) > {cid}"
        keyset = set(self.spec.key)
        # _litecdc_cid is assigned LAST: the IF()s before it compare with the stored cid
        updates = [
            f"{_q(n)} = IF({newer}, VALUES({_q(n)}), {_q(n)})"
            for n in self.spec.column_names
            if n not in keyset
        ]
        updates.append(f"{cid} = IF({newer}, VALUES({cid}), {cid})")
        head = f"INSERT INTO {_q(self.table_name)} ({', '.join(_q(n) for n in names)})"
        tail = f" ON DUPLICATE KEY UPDATE {', '.join(updates)}"
        self._insert_rows(cur, head, tail, names, rows)

    def _delete(self, cur: Any, keys: pa.Table) -> None:
        if keys.num_rows == 0:
            return
        names = [*self.spec.key, CID_COLUMN]
        stage = _q(_STAGE_DEL)
        cur.execute(f"DELETE FROM {stage}")
        head = f"INSERT INTO {stage} ({', '.join(_q(n) for n in names)})"
        self._insert_rows(cur, head, "", names, keys)
        match = " AND ".join(f"t.{_q(k)} = d.{_q(k)}" for k in self.spec.key)
        cid = _q(CID_COLUMN)
        cur.execute(
            f"DELETE t FROM {_q(self.table_name)} AS t JOIN {stage} AS d ON {match} "
            f"WHERE t.{cid} < d.{cid}"
        )
        cur.execute(f"DELETE FROM {stage}")

    def _rows_changed(self, statement: str, doing: str) -> int:
        """Run one statement on the mirror in a transaction of its own; the rows it
        changed."""
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                changed = int(cur.execute(statement))  # no arguments: see _insert_rows
            conn.commit()
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail(doing, exc) from exc
        return changed

    def disown_rows(self, init_cid: int) -> int:
        cid = _q(CID_COLUMN)
        return self._rows_changed(
            f"UPDATE {_q(self.table_name)} SET {cid} = 0 WHERE {cid} >= {int(init_cid)}",
            "taking over the rows of an earlier subscription in",
        )

    def finish_snapshot(self, init_cid: int) -> int:
        deleted = self._rows_changed(
            f"DELETE FROM {_q(self.table_name)} WHERE {_q(CID_COLUMN)} < {int(init_cid)}",
            "sweeping",
        )
        if deleted:
            log.info("mariadb sink: removed %d rows the snapshot did not see", deleted)
        return deleted

    # -- reads ------------------------------------------------------------------------

    def applied_cid(self) -> int:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"SELECT applied_cid FROM {_q(STATE_TABLE)} WHERE subscription = %s "
                    "AND table_name = %s",
                    (self.subscription, self.table_name),
                )
                row = cur.fetchone()
            conn.commit()  # end the read snapshot: the next read sees new commits
        except pymysql.err.ProgrammingError as exc:
            self._rollback()
            if exc.args and exc.args[0] == 1146:  # no state table: prepare() has not run
                return 0
            raise self._fail("reading the state of", exc) from exc
        except pymysql.err.MySQLError as exc:
            self._rollback()
            raise self._fail("reading the state of", exc) from exc
        return int(row[0]) if row else 0

    def read_row_batches(self, batch_rows: int = READ_BATCH_ROWS) -> Generator[pa.Table]:
        self.check_names()  # (no such mirror can exist: say why, not MariaDB's words)
        conn = self._connect()
        names = self.spec.column_names
        schema = pa.schema([pa.field(c.name, c.arrow_type) for c in self.spec.columns])
        # unbuffered, fetched in parts: fetchall held the whole mirror as Python tuples
        cur = conn.cursor(pymysql.cursors.SSCursor)
        try:
            cur.execute(f"SELECT {', '.join(_q(n) for n in names)} FROM {_q(self.table_name)}")
            while records := cur.fetchmany(batch_rows):
                columns = list(zip(*records, strict=True))
                arrays = [
                    pa.array(_as_arrow(values, c), c.arrow_type)
                    for values, c in zip(columns, self.spec.columns, strict=True)
                ]
                yield pa.Table.from_arrays(arrays, schema=schema)
            cur.close()
            conn.commit()
        except GeneratorExit:
            # stopped before the end (verify failed): closing an unbuffered result reads
            # the rest of it first, and one left open to be collected after the connection
            # closed printed tracebacks (scale QA) — the connection is dropped instead
            result = getattr(cur, "_result", None)
            if result is not None:
                result.unbuffered_active = False
            self.close()
            raise
        except pymysql.err.MySQLError as exc:
            self._rollback()
            if exc.args and exc.args[0] == 1146:  # no such table
                raise SinkError(
                    f"mariadb sink: there is no table {self._where} yet: has `litecdc "
                    "pipeline run` copied this subscription?"
                ) from exc
            raise self._fail("reading", exc) from exc

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(pymysql.err.MySQLError):
                self._conn.close()
            self._conn = None


def _answered(exc: pymysql.err.MySQLError) -> bool:
    """Whether a failed connection attempt got the server's own answer (an ER_* code:
    credentials, too many connections…), not a client error (no connection, timed out)."""
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    return 0 < code < _CLIENT_ERRORS


def _either(masks: Iterable[pa.Array]) -> pa.Array:
    """The rows any of the masks marks."""
    found = iter(masks)
    out = next(found)
    for mask in found:
        out = pc.or_(out, mask)
    return out


def _as_arrow(values: Sequence[Any], column: Column) -> list[Any]:
    if column.arrow == "string":  # VARBINARY keys come back as bytes
        return [v.decode("utf-8") if isinstance(v, bytes | bytearray) else v for v in values]
    if column.arrow == "binary":
        return [bytes(v) if isinstance(v, bytearray) else v for v in values]
    if column.arrow == "float64":
        return [float(v) if v is not None else None for v in values]
    return list(values)
