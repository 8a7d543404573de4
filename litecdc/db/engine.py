"""The SQLite engine: one writer connection, per-thread readers, capture and determinism.

Only this package touches SQLite. A write transaction runs as one SQLite
transaction that also appends its journal entry and its captured row changes,
so data, journal and changes commit or roll back together.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

import apsw

from litecdc.db.access import (
    ATTACH_REFUSED_IN_QUERIES,
    Access,
    AccessCache,
    ReadAuthorizer,
    WriteAuthorizer,
)
from litecdc.db.capture import (
    CHANGE_COLUMNS,
    ChangeBuffer,
    TableShape,
    decode_change,
    has_real_affinity,
)
from litecdc.db.checkpoint import BackgroundCheckpointer, InlineCheckpointer
from litecdc.db.datafile import (
    SQLITE_HEADER,
    check_existing,
    check_paths,
    layout_problem,
    mark_rollback_journal,
    stamp_format,
    unusable,
)
from litecdc.db.determinism import DeterministicRandom, FixedClockVFS, pin_process_timezone
from litecdc.db.dump import dump_statements
from litecdc.db.load import children_first
from litecdc.db.load import load_statements as sql_text_statements
from litecdc.db.read_limit import QUERY_TIMEOUT, READ_CHECK_STEPS, ReadLimit
from litecdc.db.reshape import ReshapeWatch
from litecdc.db.schema import (
    CDC_STATE_TABLE,
    CHANGES_TABLE,
    CREATE_INTERNAL,
    INTERNAL_PREFIX,
    INTERNAL_TABLES,
    JOURNAL_TABLE,
    NODE_STATE_TABLE,
    RESHAPES_TABLE,
    SCHEMA_OBJECT,
    SEQ_BITS,
    TABLE_CIDS_TABLE,
    UNLOGGED_TABLE,
    USER_OBJECTS,
    last_change_id,
)
from litecdc.db.sqltext import named_values, parse_template, render, render_many, sql_literal
from litecdc.errors import DataTypeError, LoadError, StatementError
from litecdc.results import JournalEntry, RowChange, SQLValue, Statement, StatementResult

log = logging.getLogger("litecdc.db")

T = TypeVar("T")

BUSY_TIMEOUT_MS = 5000
#: bytes the WAL file is cut back to when it starts over (SQLite's journal_size_limit):
#: else it keeps the size of the largest transaction it ever held (soak QA: 48 MB after
#: one bulk insert, for good); far above the ~16 MB a steady writer keeps it at
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024
#: SQLite errors that come from this node's environment, not from the SQL: a write that
#: meets one fails as a whole (and is retried), it is never recorded as a failed statement
ENVIRONMENTAL_ERRORS: tuple[type[BaseException], ...] = (
    apsw.FullError,
    apsw.IOError,
    apsw.NoMemError,
    apsw.BusyError,
    apsw.LockedError,
    apsw.InterruptError,
    apsw.CorruptError,
    apsw.CantOpenError,
    apsw.NotADBError,
    apsw.ProtocolError,
)
MAX_ROWID = 2**63 - 1
#: how close to 2**63-1 an AUTOINCREMENT table's rowids must be for SQLITE_FULL from a
#: statement writing it to be taken as the table's (no rowid left), not the disk's: no
#: statement inserts 2**32 rows, and no table gets this close but on purpose
AUTOINCREMENT_NEAR_END = 2**32
_NO_SUCH_TABLE = re.compile(r"no such table: (?:\w+\.)?(\S+)")
#: the results of a request that a statement's ON CONFLICT ROLLBACK / RAISE(ROLLBACK) ended:
#: the statements before it ran and were undone, those after it never ran
_ROLLED_BACK_BY_LATER = "rolled back by a later statement in this request"
_TRANSACTION_CONTROL = "not committed: this request has a transaction control statement"
#: what the statements after the one that ended the request are told: they never ran
_NOT_RUN = {
    _ROLLED_BACK_BY_LATER: "not run: an earlier statement rolled back this request",
    _TRANSACTION_CONTROL: "not run: this request has a transaction control statement",
}

#: the error a SQLite file's load meets (in "bad JSON path: '…'") when the database's
#: objects changed between the making of its statements and their run (Store.load retries)
LOAD_RACED = "litecdc: the tables of the database changed while this load was prepared"


@dataclass(slots=True)
class Decision:
    """What the journal decided for a transaction that ran: its cid and dependency."""

    cid: int
    snapshot: int


@dataclass(slots=True)
class WriteRun:
    """A write transaction as it ran: results, and what was committed (if anything)."""

    results: list[StatementResult]
    entry: JournalEntry | None
    access: Access


#: APSW's words for too few values: "supplied" counts every value given to a text of
#: several statements, "only N left" those its earlier statements did not take
_BINDING_COUNTS = re.compile(
    r"statement uses (?P<uses>\d+) and there are (?:(?P<supplied>\d+) supplied|only "
    r"(?P<left>\d+) left)\.\s+Current offset is (?P<offset>\d+)"
)


def _statement_error(exc: BaseException, refused: str | None, *, read: bool = False) -> str:
    if refused is not None:
        return refused
    if isinstance(exc, UnicodeDecodeError):  # a row change or a result holding such text
        return (
            f"text that is not valid UTF-8 ({exc.reason} at byte {exc.start}): litecdc keeps "
            "text as UTF-8; store such bytes as a BLOB (X'…' without CAST … AS TEXT)"
        )
    if isinstance(exc, apsw.BindingsError):
        counts = _BINDING_COUNTS.search(str(exc))
        if counts is not None:
            offset = int(counts["offset"])
            if counts["left"] is not None:
                left = int(counts["left"])
                supplied = offset + left
            else:
                supplied = int(counts["supplied"])
                left = supplied - offset
            if left < int(counts["uses"]):
                # rqlite's (go-sqlite3's) words: "want" is what the failing statement of
                # a text of several uses, "got" every value given in a write (its exec)
                # and the values its earlier statements left in a read (its query); more
                # values than parameters are let through, as rqlite ignores the rest
                got = left if read else supplied
                return f"not enough args to execute query: want {counts['uses']} got {got}"
    if isinstance(exc, apsw.BindingsError) and "has no name, but you supplied a dict" in str(exc):
        # APSW's wording names a binding number and its own API
        return (
            "the statement uses positional parameters (?), but the values were sent as an "
            'object; send them as an array: ["SQL", value, ...]'
        )
    return str(exc)


def _bindable(sql: str, params: Any) -> Any:
    """Parameters as APSW binds them: a named value's key may carry the parameter's
    prefix (``:a``, ``@a``, ``$a``, ``#a``), as rqlite's clients send them."""
    if type(params) is tuple or type(params) is list:
        return params  # the common case, without the (slow) ABC check below
    if isinstance(params, Mapping):
        return named_values(params, parse_template(sql).names)
    if isinstance(params, (str, bytes, bytearray, memoryview)) or not isinstance(params, Sequence):
        # (engine QA: APSW bound a str as its characters, a bytes as its byte values)
        raise StatementError(
            "parameters must be a list or tuple of values, or a mapping of names to values; "
            f"got {type(params).__name__}"
        )
    return params


#: SQLite's words for a VACUUM inside a transaction, which every write is
_VACUUM_IN_TRANSACTION = "cannot VACUUM from within a transaction"
VACUUM_REFUSED = (
    "VACUUM is not supported: it may renumber the rowids of tables without an INTEGER "
    "PRIMARY KEY, by which captured changes and replicas know those rows (and VACUUM INTO "
    "would write a file on the node: GET /db/backup gives a copy)"
)

#: what marks a statement to run as its journal text (``_runs_as_text``)
_LITERAL_SENSITIVE = re.compile(r"random|\bcreate\b", re.IGNORECASE)


@lru_cache(maxsize=4096)
def _runs_as_text(sql: str, random_views: frozenset[str] = frozenset()) -> bool:
    """Whether the node runs ``sql`` as its journal text (its parameters as literals)
    rather than with bound values, so that it does exactly what a replica replaying the
    journal does. A literal is not a bound value to SQLite in two ways that matter (QA):
    it folds constants — ``? OR random()`` calls random() once fewer with 1, and every
    later random() of the write then differs — and CREATE TABLE … AS SELECT names a
    column after its expression's text (``?`` vs ``5``) and types it by its affinity.
    A view is expanded into the statement that reads it, so naming one of
    ``random_views`` (views that call random(), lower case) counts as calling it (QA:
    ``? OR r FROM v`` with ``r`` a view's random() drew differently on replicas).
    Other statements keep bound values (and the statement cache, and the bulk path)."""
    if not parse_template(sql).placeholders:
        return False
    if _LITERAL_SENSITIVE.search(sql):
        return True
    lowered = sql.lower()
    return any(view in lowered for view in random_views)


#: the SQL function a cluster's log entry calls in place of a statement the leader could
#: not write out (its parameters did not fit it): on every node it fails with the reason
FAILED_STATEMENT_FUNCTION = "litecdc_statement_failed"


#: SQLite steps (virtual-machine instructions) one client statement of a write may run:
#: about 100 s of work on the project's machine (~100 M steps/s; an UPDATE costs about 10
#: steps a row, so a billion rows). A statement that never ends (a recursive CTE without
#: a bound) held the write lock for good and, in a cluster, stopped every node's apply
#: loop at that log entry, restarts included (security QA). Steps, not seconds: every
#: replica stops the statement at the same step, so they agree that it failed: the check
#: runs every WRITE_CHECK_STEPS steps, counted from the statement's first run since it was
#: prepared — so statements replicas run (no parameters) are never taken from SQLite's
#: statement cache (_run_statement).
WRITE_STEP_LIMIT = 10_000_000_000
WRITE_CHECK_STEPS = 10_000
_WRITE_LIMIT_CHECKS = WRITE_STEP_LIMIT // WRITE_CHECK_STEPS
WRITE_LIMIT_ERROR = (
    f"statement stopped: it ran {WRITE_STEP_LIMIT:,} SQLite steps, the most one statement "
    "of a write may run (it would hold every other write back); bound it (LIMIT, WHERE) "
    "or split it"
)


#: how many texts of statements returning rows the writer remembers (never cached)
_RETURNS_ROWS_KEPT = 10_000

#: seconds close() waits for an interrupted reader to stop before leaving it open
CLOSE_WAIT_S = 5.0


def _close_when_idle(conn: apsw.Connection) -> None:
    """Close a connection that another thread may still be stepping (just interrupted):
    APSW refuses to close one in use; leave it open (the process is ending) if it stays
    busy."""
    deadline = time.monotonic() + CLOSE_WAIT_S
    while True:
        try:
            conn.close()
            return
        except apsw.ThreadingViolationError:
            if time.monotonic() >= deadline:
                log.warning("a reader connection stayed busy after interrupt(); left open")
                return
            time.sleep(0.02)


class _ReaderGuard:
    """Kept in a read thread's slot (``threading.local``) next to its connection: when
    the thread ends, its slot goes and the guard with it, whose finalizer closes the
    connection (soak QA: the HTTP layer's worker threads end after 10 s idle, and each
    new one opened a connection that the reader list kept open — files and memory grew
    with every quiet spell until reads failed with "unable to open database file")."""

    __slots__ = ("__weakref__",)


def _forget_reader(
    lock: threading.Lock, readers: list[apsw.Connection], conn: apsw.Connection
) -> None:
    with lock:  # (close() interrupts the listed connections under it: never a closed one)
        with contextlib.suppress(ValueError):
            readers.remove(conn)
        with contextlib.suppress(apsw.Error):
            conn.close()  # (its thread is gone: nothing steps it; closed already is fine)


def _virtual_column_error(table: str, column: str) -> str:
    return (
        f"table {table} has VIRTUAL generated column {column}, whose values cannot be "
        "captured; declare it STORED"
    )


def _fail_statement(*reason: SQLValue) -> SQLValue:
    raise StatementError(str(reason[0]) if reason else "statement failed")


def failed_statement_text(reason: str) -> str:
    """SQL that fails with ``reason`` on any litecdc node, as a statement of its own."""
    return f"SELECT {FAILED_STATEMENT_FUNCTION}({sql_literal(reason)});"


def _autoincrement_exhausted(tables: Sequence[str]) -> str:
    names = ", ".join(tables)
    return (
        f"database or disk is full: AUTOINCREMENT table {names} has no rowid left (its "
        f"rowids reached {MAX_ROWID}); give rowids explicitly, or delete the row holding "
        "the largest and reset its sqlite_sequence entry"
    )


class _BatchRolledBack(Exception):
    """A statement rolled back the whole transaction of in_one_transaction."""


def _breaks_a_constraint(problem: str) -> bool:
    """Whether a line of SQLite's quick_check is a row its table's CHECK or NOT NULL
    constraint refuses (the rest is damage)."""
    return problem.startswith(("CHECK constraint failed in ", "NULL value in "))


class _LastResult:
    """An exec tracer that keeps the result of the *last* SQL statement run.

    It notes each statement's columns before the statement runs (an empty result still
    has columns) and, for a string of several statements, drops the rows of earlier ones
    — the result rqlite (go-sqlite3) reports.
    """

    __slots__ = ("description", "prepared", "rows")

    def __init__(self, prepared: Callable[[], str | None] | None = None) -> None:
        self.description: list[tuple[str, str | None]] | None = None
        self.rows: list[tuple[Any, ...]] = []
        #: called once each statement is prepared, before it runs: a reason not to run it
        self.prepared = prepared

    def __call__(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if self.prepared is not None and self.prepared() is not None:
            return False  # APSW aborts the statement (ExecTraceAbort): refused
        try:
            self.description = list(cursor.get_description())
        except apsw.ExecutionCompleteError:
            self.description = None
        self.rows = []
        return True

    def run(self, cursor: apsw.Cursor, sql: str, params: Any, *, can_cache: bool = True) -> None:
        cursor.exec_trace = self
        try:
            executing = cursor.execute(sql, params, can_cache=can_cache)
            if parse_template(sql).statements > 1:
                for row in executing:
                    self.rows.append(row)
            else:
                self.rows = executing.fetchall()
        except BaseException:
            # a row that fails to convert (text that is not UTF-8 from RETURNING) leaves
            # the statement running until the cursor is collected: the savepoint's
            # ROLLBACK TO then failed with "SQL statements in progress", a 500, and so
            # did the next writes (SQL-surface QA). Closing it ends the statement now.
            cursor.close(True)
            raise


def _close_quietly(connection: apsw.Connection) -> None:
    """Close a connection that failed to open; its own error is not the one to report
    (config QA: an immutable db.sqlite's 'disk I/O error' at close hid 'attempt to write
    a readonly database', in a traceback)."""
    with contextlib.suppress(apsw.Error):
        connection.close(True)


class Engine:
    """One SQLite database file with litecdc's journal and change tables."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "full",
        foreign_keys: bool = False,
        background_checkpoints: bool = True,
    ) -> None:
        self.path = str(path)
        pin_process_timezone()
        self._foreign_keys = foreign_keys
        self._vfs = FixedClockVFS.get()
        self._write_lock = threading.RLock()
        check_paths(self.path)
        try:
            self._writer = apsw.Connection(self.path, vfs=self._vfs.name)
        except apsw.Error as exc:
            raise unusable(self.path, exc) from exc
        try:
            self._writer.set_busy_timeout(BUSY_TIMEOUT_MS)
            check_existing(self._writer, self.path)  # first: a refused file stays as it was
            mode = self._writer.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]
            self._writer.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self._writer.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            with self._writer:  # the tables and the format stamp, together
                self._writer.execute(CREATE_INTERNAL)
                stamp_format(self._writer)
        except apsw.Error as exc:
            _close_quietly(self._writer)
            raise unusable(self.path, exc) from exc
        except BaseException:
            _close_quietly(self._writer)
            raise
        # (off: the writer checkpoints after the COMMIT that passes 1000 WAL pages, as
        # SQLite's autocheckpoint would inside it)
        self._checkpointer: BackgroundCheckpointer | InlineCheckpointer | None = None
        if str(mode).lower() == "wal":
            self._checkpointer = (
                BackgroundCheckpointer(self._writer, self.path, synchronous=synchronous)
                if background_checkpoints
                else InlineCheckpointer(self._writer)
            )
        if foreign_keys:
            self._writer.execute("PRAGMA foreign_keys=ON")
        self._random = DeterministicRandom()
        self._random.install(self._writer)
        #: progress checks (every WRITE_CHECK_STEPS steps) of the client statement that
        #: runs; None while none does (litecdc's own statements have no limit)
        self._write_checks: int | None = None
        #: how many executions of the last batch that failed and was undone had succeeded
        #: before the failing one (0 when it failed before running any)
        self._batch_ran_before_failure = 0
        #: close() was called: no client statement starts any more
        self._closing = False
        #: interrupt_writes() was called during the write in progress (depth > 0)
        self._abort_write = False
        self._write_depth = 0
        self._depth_lock = threading.Lock()
        self._writer.set_progress_handler(self._past_write_limit, WRITE_CHECK_STEPS)
        self._writer.create_scalar_function(FAILED_STATEMENT_FUNCTION, _fail_statement, 1)
        self._access_cache = AccessCache()
        #: whether sqlite_sequence exists (some table has AUTOINCREMENT); None: not known
        self._has_sequence: bool | None = None
        #: counts schema changes; a reader connection prepared under an older count is
        #: replaced (_reader): APSW keeps a cached statement's columns as first prepared,
        #: so a SELECT * after ALTER TABLE named the old columns (cluster QA: a 500 too)
        self._schema_generation = 0
        #: True while a COMMIT that changes the schema runs (its count not yet taken)
        self._schema_commit_in_flight = False
        self._committed_schema_version: int | None = None  # (read once the file is open)
        #: hashes of the texts of writes' statements (with parameters: the others are
        #: never cached) that return rows: the writer never caches them
        self._returns_rows: set[int] = set()
        #: _random_views' answer until the schema changes; None: not known
        self._random_views_cache: frozenset[str] | None = None
        #: a statement of the open transaction ran ANALYZE: a rollback must reload the
        #: planner's statistics, which SQLite keeps in memory (see _reload_statistics)
        self._analyzed = False
        self._buffer = ChangeBuffer(self._table_shape)
        self._authorizer = WriteAuthorizer(
            on_schema_change=self._buffer.shapes.clear, is_table=self._is_table
        )
        self._writer.authorizer = self._authorizer
        self._writer.preupdate_hook(self._buffer.hook)
        self._readers = threading.local()
        self._reader_list: list[apsw.Connection] = []
        self._reader_lock = threading.Lock()
        self._closed = False
        #: True while in_one_transaction runs: writes become savepoints of its transaction
        self._nested = False
        self.sqlite_version = apsw.sqlite_lib_version()
        # objects named in litecdc's prefix from before it was reserved in any case
        for name in sorted(self._names_in_litecdcs_prefix()):
            log.warning(
                "%s: names starting with %s (in any case) are reserved for litecdc's "
                "internal tables; rename it (an index or trigger: drop it) — a dump of "
                "this database will not load",
                name,
                INTERNAL_PREFIX,
            )

    # -- connections ------------------------------------------------------------------
    def _reader(self) -> apsw.Connection:
        conn: apsw.Connection | None = getattr(self._readers, "conn", None)
        generation = self._schema_generation
        if (
            conn is not None
            and self._readers.generation != generation
            and not conn.in_transaction
            and not self._closing
        ):
            # its cached statements may describe columns the schema no longer has
            self._readers.conn = None
            with self._reader_lock, contextlib.suppress(ValueError):
                self._reader_list.remove(conn)
            with contextlib.suppress(apsw.Error):
                conn.close()
            conn = None
        if conn is None:
            self._readers.generation = generation
            conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READONLY)
            conn.set_busy_timeout(BUSY_TIMEOUT_MS)
            if self._foreign_keys:
                conn.execute("PRAGMA foreign_keys=ON")
            authorizer = ReadAuthorizer()
            conn.authorizer = authorizer
            self._readers.authorizer = authorizer
            self._readers.conn = conn
            with self._reader_lock:
                self._reader_list.append(conn)
            # (outside the lock: replacing a guard runs its finalizer, which takes it)
            guard = _ReaderGuard()
            finalizer = weakref.finalize(
                guard, _forget_reader, self._reader_lock, self._reader_list, conn
            )
            finalizer.atexit = False  # (at exit, a daemon thread may still be reading)
            self._readers.guard = guard
        return conn

    def close(self) -> None:
        """Close every connection. A read or write still running on another thread (its
        request cancelled at shutdown; a read nobody bounded) is interrupted first: the
        node closed nothing after the first busy reader raised, and stayed up (QA)."""
        self._closing = True
        with self._reader_lock:
            readers = list(self._reader_list)
            # (under the lock: a thread ending now closes its connection under it too, and
            # interrupting a closed one raises — review)
            for conn in readers:
                conn.interrupt()  # (SQLite's own way to stop a statement from another thread)
        if not self._write_lock.acquire(blocking=False):
            self._writer.interrupt()  # a write interrupted so rolls back, journaling nothing
            self._write_lock.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            for conn in readers:
                _close_when_idle(conn)
            if self._checkpointer is not None:
                self._checkpointer.close()
            try:
                self._writer.close()
            except (apsw.FullError, apsw.IOError) as exc:
                # SQLite checkpoints the WAL into the file as its last connection closes;
                # on a full disk that fails (retain QA: the node exited 1 with a traceback
                # at SIGTERM). Every commit is in the WAL: the next start checkpoints it.
                log.warning("the database was closed without checkpointing its WAL: %s", exc)
                self._writer.close(True)
        finally:
            self._write_lock.release()

    # -- internal statements ----------------------------------------------------------
    def _read(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Rows of a read on this thread's reader connection."""
        return self._reader().execute(sql, params).fetchall()

    def _internal(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        was_internal, self._authorizer.internal = self._authorizer.internal, True
        try:
            return self._writer.execute(sql, params).fetchall()
        finally:
            self._authorizer.internal = was_internal

    def _is_table(self, name: str) -> bool:
        """Whether a table or view called ``name`` exists (names are case-insensitive)."""
        return bool(
            self._internal(
                "SELECT 1 FROM sqlite_schema WHERE type IN ('table', 'view') "
                "AND name = ? COLLATE NOCASE",
                (name,),
            )
        )

    def _table_shape(self, table: str) -> TableShape:
        """Columns and key of ``table``, read from the schema (called from the capture hook)."""
        rows = self._internal(
            "SELECT name, type, pk, hidden, dflt_value FROM pragma_table_xinfo(?)", (table,)
        )
        virtual = [r[0] for r in rows if r[3] == 2]
        if virtual:
            # (an adopted SQLite file can hold one: writes failed with "column index out
            # of range" from the hook — QA)
            raise StatementError(
                _virtual_column_error(table, str(virtual[0])) + " (recreate the table)"
            )
        columns = tuple(r[0] for r in rows)
        pk = sorted((r[2], i) for i, r in enumerate(rows) if r[2])
        pk_positions = tuple(i for _, i in pk)
        without_rowid = bool(
            self._internal(
                "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (table,)
            )[0][0]
        )
        rowid_key = not without_rowid and (
            not pk_positions
            or (len(pk_positions) == 1 and str(rows[pk_positions[0]][1]).upper() == "INTEGER")
        )
        real_defaults = tuple(
            i for i, r in enumerate(rows) if r[4] is not None and has_real_affinity(str(r[1]))
        )
        return TableShape(table, columns, pk_positions, rowid_key, not without_rowid, real_defaults)

    def _deferred_violations(self) -> bool:
        """Whether the open transaction holds deferred foreign-key violations."""
        if not self._foreign_keys:
            return False
        return bool(self._writer.status(apsw.SQLITE_DBSTATUS_DEFERRED_FKS)[0])

    def _check_rowid_space(self, mark: int) -> str | None:
        """Refuse inserts into a table whose largest rowid is 2**63-1: SQLite then picks
        random rowids, from a generator litecdc cannot seed, so replicas would differ.
        Checked after the statement: the largest rowid then, or a row at 2**63-1 that the
        statement itself removed (``INSERT OR REPLACE`` replacing it, a trigger deleting
        it — QA: the rowid was random on every replica), which SQLite may have removed
        after choosing the new row's rowid."""
        events = self._buffer.events[mark:]
        inserted = {
            e[1].table for e in events if e[0] == "INSERT" and e[1].has_rowid and e[3] != MAX_ROWID
        }
        if not inserted:
            return None
        removed = {
            e[1].table
            for e in events
            if e[0] != "INSERT" and e[2] == MAX_ROWID and (e[0] == "DELETE" or e[3] != MAX_ROWID)
        }
        for table in inserted:
            quoted = '"' + table.replace('"', '""') + '"'
            top = self._internal(f"SELECT max(rowid) FROM {quoted}")[0][0]
            if top == MAX_ROWID or table in removed:
                return (
                    f"table {table} holds rowid {MAX_ROWID} (or did until this statement "
                    "removed it): SQLite chooses random rowids for "
                    "new rows then, which replicas cannot reproduce; delete or renumber that "
                    "row first"
                )
        return None

    def _past_write_limit(self) -> bool:
        """The writer's progress handler: True (interrupt) once the client statement that
        runs has taken WRITE_STEP_LIMIT steps, or when the write must stop now."""
        checks = self._write_checks
        if checks is None:
            return False
        self._write_checks = checks + 1
        return checks >= _WRITE_LIMIT_CHECKS or self._closing or self._abort_write

    @contextlib.contextmanager
    def _write_in_progress(self) -> Iterator[None]:
        """Hold the write lock for a write (run_write, in_one_transaction; nested too)."""
        with self._write_lock:
            with self._depth_lock:
                if self._write_depth == 0:
                    self._abort_write = False
                self._write_depth += 1
            try:
                yield
            finally:
                with self._depth_lock:
                    self._write_depth -= 1
                    if self._write_depth == 0:
                        self._abort_write = False

    def interrupt_writes(self) -> None:
        """Abort the write in progress, if any (a cluster node leaving stops its apply):
        its running statement is interrupted and no further one starts; it rolls back,
        journaling nothing, and its caller gets apsw.InterruptError. (Under the depth lock:
        a write ending meanwhile left the flag set for the next one — review QA.)"""
        with self._depth_lock:
            if self._write_depth > 0:
                self._abort_write = True
                self._writer.interrupt()

    def _check_not_stopping(self) -> None:
        # SQLite's interrupt ends the statement that runs, not the next one: a write of
        # many statements went on, and committed, after close() (QA: a /db/load at SIGTERM)
        if self._closing or self._abort_write:
            raise apsw.InterruptError("litecdc is stopping: the write did not finish")

    def _write_limit_reached(self) -> bool:
        return self._write_checks is not None and self._write_checks > _WRITE_LIMIT_CHECKS

    def _schema_changed(self) -> None:
        self._buffer.shapes.clear()
        self._access_cache.clear()
        self._has_sequence = None
        self._random_views_cache = None

    def _random_views(self) -> frozenset[str]:
        """Names (lower case) of the views whose definition calls random() or
        randomblob(), directly or through another such view (see _runs_as_text)."""
        if self._random_views_cache is None:
            views = {
                str(name).lower(): str(sql or "").lower()
                for name, sql in self._internal(
                    "SELECT name, sql FROM sqlite_schema WHERE type = 'view'"
                )
            }
            found = {name for name, sql in views.items() if "random" in sql}
            grew = True
            while grew:  # a view reading a random view calls it too
                more = {
                    n for n, sql in views.items() if n not in found and any(f in sql for f in found)
                }
                found |= more
                grew = bool(more)
            self._random_views_cache = frozenset(found)
        return self._random_views_cache

    def _autoincrement_near_end(self, tables: set[str]) -> list[str]:
        """The AUTOINCREMENT tables among ``tables`` whose next rowid is within
        ``AUTOINCREMENT_NEAR_END`` of 2**63-1 (SQLite then fails an insert with SQLITE_FULL,
        as if the disk were full). Nothing to read while no table has AUTOINCREMENT."""
        if self._has_sequence is None:
            self._has_sequence = bool(
                self._internal("SELECT 1 FROM sqlite_schema WHERE name = 'sqlite_sequence'")
            )
        if not self._has_sequence or not tables:
            return []
        wanted = {t.lower() for t in tables}
        near = []
        for name, seq in self._internal("SELECT name, seq FROM sqlite_sequence"):
            if not isinstance(name, str) or name.lower() not in wanted:
                continue
            quoted = '"' + name.replace('"', '""') + '"'
            top = self._internal(f"SELECT max(rowid) FROM {quoted}")[0][0]
            highest = max(v for v in (seq, top, 0) if isinstance(v, int))
            if highest > MAX_ROWID - AUTOINCREMENT_NEAR_END:
                near.append(name)
        return near

    def _check_capturable(self, tables: set[str]) -> str | None:
        for table in tables:
            # tables only: a view's columns are its SELECT's, which may name a view not
            # created yet (a dump's order) — reading them failed the CREATE VIEW (QA)
            rows = self._internal(
                "SELECT x.name FROM sqlite_schema AS s, pragma_table_xinfo(s.name) AS x "
                "WHERE s.name = ? AND s.type = 'table' AND x.hidden = 2",
                (table,),
            )
            if rows:
                return _virtual_column_error(table, str(rows[0][0]))
        return None

    def _check_foreign_keys(self, tables: set[str]) -> str | None:
        """A foreign key to an internal table (CREATE TABLE … REFERENCES _litecdc_journal,
        or ADD COLUMN …): with --fk, the node's own journal trim and change-log pruning
        failed on it, or cascaded into the client's rows with no change event and
        differently on each replica (QA)."""
        for table in sorted(tables):
            rows = self._internal(
                'SELECT f."table" FROM sqlite_schema AS s, pragma_foreign_key_list(s.name) AS f '
                "WHERE s.name = ? AND s.type = 'table' "
                f"AND lower(substr(f.\"table\", 1, {len(INTERNAL_PREFIX)})) = '{INTERNAL_PREFIX}'",
                (table,),
            )
            if rows:
                return (
                    f"{table}: a foreign key to {rows[0][0]}, one of litecdc's internal "
                    "tables, is not allowed (their rows are trimmed and pruned by the node)"
                )
        return None

    def _names_in_litecdcs_prefix(self) -> set[str]:
        """Objects named in litecdc's prefix (in any case) that are not its tables."""
        known = ", ".join(f"'{name}'" for name in sorted(INTERNAL_TABLES))
        rows = self._internal(
            "SELECT name FROM sqlite_schema "
            f"WHERE lower(substr(name, 1, {len(INTERNAL_PREFIX)})) = '{INTERNAL_PREFIX}' "
            f"AND lower(name) NOT IN ({known})"
        )
        return {str(row[0]) for row in rows}

    def _check_internal_names(self, before: set[str] | None) -> str | None:
        """A client object renamed into litecdc's prefix (ALTER TABLE t RENAME TO
        _litecdc_t: the authorizer sees only the old name) could never be written, renamed
        back or dropped again, and dumps would leave it out. Only what the statement itself
        brought into the prefix counts (``before``: the names there when its DDL was
        prepared): objects so named before the prefix was reserved in any case are warned
        of at start and let be — two of them made every DDL fail, the rename of one refused
        for the other (QA) — and every replica judges a statement alike."""
        if before is None:
            return None
        rows = sorted(self._names_in_litecdcs_prefix() - before)
        if rows:
            return (
                f"{rows[0]}: names starting with {INTERNAL_PREFIX} (in any case: SQLite "
                "compares names without it) are reserved for litecdc's internal tables; "
                "rename it (an index or trigger: drop it)"
            )
        return None

    def _check_triggers(self, access: Access) -> str | None:
        """Refuse a statement after which a trigger's body would be refused by every write
        that fires it (it writes an internal table, reads the file layout…).

        SQLite compiles a trigger body only when a statement that fires it is prepared,
        so the authorizer never sees it at CREATE TRIGGER: the triggers concerned are
        compiled here by preparing — not running — an INSERT, an UPDATE of every column
        and a DELETE of their table, which the authorizer judges as any write. Concerned
        are the triggers the statement creates, and older ones whose SQL names a table or
        view it creates (SQLite's sqlite_stat1 included, which the first ANALYZE creates):
        SQLite cannot compile a body that names a missing table, so such a body is judged
        when that table appears (failing that, when it fires). Each trigger is judged
        alone (see _judge_trigger): another trigger — on its table, or on a table its body
        writes — that names a missing table would stop the compilation, and an older bad
        one would take the blame. (A bad trigger on a table the body writes was refused
        when it was created.)
        """
        if not access.created:
            return None
        triggers = [
            (str(name), str(table), str(sql or ""))
            for name, table, sql in self._internal(
                "SELECT name, tbl_name, sql FROM sqlite_schema WHERE type = 'trigger'"
            )
        ]
        if not triggers:
            return None
        created = {name.lower() for name in access.created}
        tables = sorted(created - {name.lower() for name, _, _ in triggers}, key=len, reverse=True)
        mentions = (
            re.compile(rf"(?<![\w$])(?:{'|'.join(map(re.escape, tables))})(?![\w$])", re.IGNORECASE)
            if tables
            else None
        )
        for name, table, sql in triggers:
            if name.lower() in created or (mentions is not None and mentions.search(sql)):
                others = [n for n, _, _ in triggers if n != name]
                problem = self._judge_trigger(name, table, others)
                if problem is not None:
                    return problem
        return None

    def _judge_trigger(self, name: str, table: str, others: Sequence[str]) -> str | None:
        """Why every write that fires trigger ``name`` on ``table`` would be refused, or
        None. The ``others`` triggers (every other one) are dropped for the test, inside a
        savepoint that is rolled back: they neither hide this one nor get blamed for it."""
        self._internal("SAVEPOINT litecdc_trigger_check")
        try:
            for other in others:
                self._internal(f"DROP TRIGGER {_quote(other)}")
            try:
                statements = self._firing_statements(table)
            except apsw.SQLError:
                return None  # a view SQLite cannot describe any more (its table was dropped)
            for op, sql in statements:
                reason, where, missing = self._dry_prepare(sql)
                if reason is None and missing and missing.lower().startswith(INTERNAL_PREFIX):
                    reason = f"table {missing} is internal to litecdc and cannot be used in a write"
                if reason is not None:
                    # (the reason may sit in a view the body reads)
                    inside = f" (in {where})" if where and where.lower() != name.lower() else ""
                    return f"trigger {name} would make every {op} on {table} fail: {reason}{inside}"
            return None
        finally:
            if self._writer.in_transaction:  # (an interrupt rolls the whole one back)
                self._internal("ROLLBACK TO litecdc_trigger_check; RELEASE litecdc_trigger_check")

    def _firing_statements(self, table: str) -> list[tuple[str, str]]:
        """Statements that fire every trigger on ``table`` (UPDATE OF any column too)."""
        quoted = _quote(table)
        columns = [
            _quote(str(name))
            for name, hidden in self._internal(
                "SELECT name, hidden FROM pragma_table_xinfo(?)", (table,)
            )
            if hidden == 0  # generated columns cannot be SET
        ]
        statements = [("INSERT", f"INSERT INTO {quoted} DEFAULT VALUES")]
        if columns:
            assignments = ", ".join(f"{c} = {c}" for c in columns)
            statements.append(("UPDATE", f"UPDATE {quoted} SET {assignments}"))
        statements.append(("DELETE", f"DELETE FROM {quoted}"))
        return statements

    def _dry_prepare(self, sql: str) -> tuple[str | None, str | None, str | None]:
        """Prepare ``sql`` on the writer, judged by the authorizer, without running it:
        (why it would be refused, the trigger or view that holds the reason, the table
        SQLite could not find when it cannot compile it)."""
        authorizer = self._authorizer
        probe = Access()
        saved, authorizer.recording = authorizer.recording, probe
        authorizer.reset()

        def stop(cursor: apsw.Cursor, text: str, bindings: Any) -> bool:
            authorizer.prepared()  # what is judged on the whole statement (into probe)
            return False  # never run it

        cursor = self._writer.cursor()
        cursor.exec_trace = stop
        missing = None
        try:
            cursor.execute(sql, can_cache=False)
        except (apsw.ExecTraceAbort, apsw.AuthError):
            pass  # prepared (or refused: the reason is in probe)
        except apsw.SQLError as exc:  # cannot compile: a view without INSTEAD OF, a missing table…
            found = _NO_SUCH_TABLE.search(str(exc))
            missing = found.group(1) if found else None
        finally:
            authorizer.recording = saved
            authorizer.reset()
        return probe.refused, probe.refused_in, missing

    # -- writes -----------------------------------------------------------------------
    def run_write(
        self,
        statements: Sequence[Statement],
        *,
        transaction: bool,
        timestamp_ms: int,
        seed: int,
        decide: Callable[[Access], Decision],
        state: Mapping[str, int] | None = None,
    ) -> WriteRun:
        """Run client statements as one transaction; journal and capture them on success.

        ``decide`` is called once the statements have run, with their combined
        read/write sets, and returns the cid and snapshot to record. Nothing is
        committed when every statement failed, or when ``transaction`` is set and
        one failed.
        """
        with self._write_in_progress():
            writer = self._writer
            self._vfs.pin(timestamp_ms)
            self._random.start(seed)
            self._begin()
            writer.set_last_insert_rowid(0)
            buffer = self._buffer
            buffer.clear()
            combined = Access()
            results: list[StatementResult] = []
            rendered: list[str] = []
            failed = aborts = False
            try:
                index, count = 0, len(statements)
                # a run of statements whose batch failed runs singly up to here (scale QA:
                # batched again from the next statement, the run failed again at the same
                # one, over and over: one failure among 100k INSERTs took over 10 minutes)
                singly_until = 0
                while index < count:
                    statement = statements[index]
                    if transaction and statement.params and index >= singly_until:
                        # (runs of one statement WITH parameters only: a text without
                        # them — every log entry's, a replay's — runs singly, prepared
                        # afresh, so the step limit's checks fall alike on every replica;
                        # one executemany carries their phase from run to run: review)
                        end = index + 1
                        while end < count and statements[end].sql == statement.sql:
                            end += 1
                        if end - index > 1 and self._batchable(statement.sql):
                            batched = self._run_batch(
                                statements[index:end], results, rendered, combined
                            )
                            if not batched:
                                singly_until = end
                                # the executions before the failing one, as a batch again
                                before = self._batch_ran_before_failure
                                if before > 1:
                                    end = index + before
                                    batched = self._run_batch(
                                        statements[index:end], results, rendered, combined
                                    )
                            if batched:
                                index = end
                                if results[-1].error is not None:
                                    failed = True  # (it ended the transaction: see _run_batch)
                                    break
                                continue
                    result, text, aborts = self._run_statement(statement, transaction, combined)
                    results.append(result)
                    index += 1
                    if result.error is not None:
                        failed = True
                        if transaction or aborts or not writer.in_transaction:
                            break
                    elif text is not None:
                        rendered.append(text)
                undone = None
                ran = len(results)  # (the statements after these did not run)
                if failed and aborts:
                    # BEGIN/COMMIT/ROLLBACK/SAVEPOINT: the client meant a transaction that
                    # litecdc cannot run as asked, so none of the request is committed
                    undone = _TRANSACTION_CONTROL
                elif failed and not transaction and not writer.in_transaction:
                    # A statement (ON CONFLICT ROLLBACK, RAISE(ROLLBACK)) rolled back the
                    # whole transaction, taking earlier statements with it.
                    undone = _ROLLED_BACK_BY_LATER
                if undone and not transaction:
                    # one result per statement, as rqlite answers without `transaction`:
                    # the statements after the one that stopped the request did not run
                    results.extend(StatementResult() for _ in statements[len(results) :])
                wrote = combined.wrote
                if not undone and wrote and self._deferred_violations():
                    # checked here, not left to COMMIT: a savepoint's RELEASE inside a batch
                    # does not check them, so batched and single applies would disagree, and
                    # a failing COMMIT must not look like an environmental error
                    undone = "FOREIGN KEY constraint failed"
                    failed = True
                if (failed and transaction) or undone or not wrote or not writer.in_transaction:
                    # nothing committed, or nothing to commit (reads, blanks, comments):
                    # no journal entry, no cid used
                    for position, result in enumerate(results):
                        if undone and result.error is None:
                            result.error = (
                                _NOT_RUN.get(undone, undone) if position >= ran else undone
                            )
                            result.last_insert_id = result.rows_affected = None
                    self._rollback()
                    return WriteRun(results, None, combined)
                decision = decide(combined)
                entry = JournalEntry(
                    decision.cid, "\n".join(rendered), decision.snapshot, timestamp_ms, seed
                )
                self._append(entry, combined, state)
                self._commit()
            except BaseException:
                self._rollback()
                self._schema_changed()  # (whatever schema the rolled-back statements made)
                raise
            finally:
                buffer.clear()
                self._vfs.pin(None)
                if combined.schema:
                    self._schema_changed()
            return WriteRun(results, entry, combined)

    def _batchable(self, sql: str) -> bool:
        """Whether a run of this statement can go through one executemany."""
        access = self._access_cache.get(sql)
        return (
            access is not None
            and bool(access.writes)
            and not access.schema
            and parse_template(sql).statements == 1
            and "returning" not in sql.lower()
            and not _runs_as_text(sql, self._random_views())
        )

    def _run_batch(
        self,
        group: Sequence[Statement],
        results: list[StatementResult],
        rendered: list[str],
        combined: Access,
    ) -> bool:
        """Run consecutive executions of one write statement with a single executemany.

        Inside an explicit transaction only: if anything fails, the batch is undone
        and False returned, and the caller runs the statements one by one to report
        exactly which one failed (the transaction is rolled back either way) — unless
        the failure ended the SQLite transaction itself: then the results end with the
        failing execution's error, and the request fails there.
        """
        self._check_not_stopping()
        self._batch_ran_before_failure = 0
        writer = self._writer
        sql = group[0].sql
        access = self._access_cache.get(sql)
        assert access is not None  # (_batchable)
        buffer_mark, random_mark = self._buffer.mark(), self._random.calls
        last_ids: list[int] = []
        counts: list[int] = []
        last_insert_rowid, changes = writer.last_insert_rowid, writer.changes

        def before_each(cursor: apsw.Cursor, text: str, bindings: Any) -> bool:
            # what the previous execution left: its last rowid and its changes() count
            # (fresh for each: a batch is one INSERT/UPDATE/DELETE, which always sets it)
            last_ids.append(last_insert_rowid())
            counts.append(changes())
            self._write_checks = 0  # (each execution has the limit of a statement)
            return True

        try:
            params = [_bindable(sql, s.params) for s in group]
        except StatementError:
            return False  # one by one, each reports its own
        if self._autoincrement_near_end(access.writes):
            # SQLITE_FULL there rolls back the whole transaction, savepoint and all: one by
            # one, each statement's failure is told apart from a full disk
            return False
        self._internal("SAVEPOINT litecdc_batch")
        started = time.perf_counter()
        limited = False
        try:
            cursor = writer.cursor()
            cursor.exec_trace = before_each
            try:
                cursor.executemany(sql, params).fetchall()
            finally:
                limited = self._write_limit_reached()
                self._write_checks = None  # (over the limit: run singly, which says so)
            if self._check_rowid_space(buffer_mark) is not None:
                raise StatementError("rowid space")  # re-run singly to report it
            texts = render_many(sql, params)
        except (apsw.Error, StatementError, OverflowError, TypeError, KeyError, ValueError) as exc:
            self._buffer.cut(buffer_mark)
            self._random.calls = random_mark
            if writer.in_transaction:
                self._internal("ROLLBACK TO litecdc_batch; RELEASE litecdc_batch")
                # (before_each ran for each execution begun; all of them when what failed
                # came after executemany)
                self._batch_ran_before_failure = max(len(last_ids) - 1, 0)
                return False
            # The execution that failed ended the whole transaction (ON CONFLICT ROLLBACK,
            # RAISE(ROLLBACK), the step limit): there is nothing to run singly in (review:
            # "no such savepoint" stopped the request — and a cluster's apply loop, for
            # good). The request fails at that execution, as it would singly.
            if self._closing or self._abort_write:
                raise apsw.InterruptError(f"the write did not finish: {exc}") from exc
            if isinstance(exc, apsw.InterruptError) and limited:
                message = WRITE_LIMIT_ERROR
            elif isinstance(exc, ENVIRONMENTAL_ERRORS):
                raise  # this node's disk or memory, not the statement (see _run_statement)
            else:
                message = _statement_error(exc, None)
            failing = len(last_ids) - 1  # (before_each ran for each execution begun)
            results.extend(
                StatementResult(last_insert_id=last_ids[k + 1], rows_affected=counts[k + 1])
                for k in range(failing)
            )
            results.append(StatementResult(error=message, seconds=time.perf_counter() - started))
            return True
        self._internal("RELEASE litecdc_batch")
        last_ids.append(last_insert_rowid())
        counts.append(changes())
        seconds = (time.perf_counter() - started) / len(group)
        results.extend(
            StatementResult(
                last_insert_id=last_ids[k + 1],
                rows_affected=counts[k + 1],
                seconds=seconds,
            )
            for k in range(len(group))
        )
        suffix = parse_template(sql).terminator
        rendered.extend(text + suffix for text in texts)
        combined.merge(access)
        return True

    # A write runs as its own SQLite transaction, or — inside in_one_transaction — as a
    # savepoint of the batch's transaction.
    def _begin(self) -> None:
        if self._nested and not self._writer.in_transaction:
            # the batch's transaction is gone: a SAVEPOINT now would start (and commit) one
            raise _BatchRolledBack
        self._internal("SAVEPOINT litecdc_entry" if self._nested else "BEGIN IMMEDIATE")

    # (a batch's entries share one SQLite transaction: PRAGMA defer_foreign_keys, which a
    # COMMIT or ROLLBACK resets, is reset after each entry, as on a replica running it alone;
    # without foreign keys enforced it changes nothing, and the apply loop skips it)
    def _entry_end(self, sql: str) -> str:
        return f"{sql}; PRAGMA defer_foreign_keys=OFF" if self._foreign_keys else sql

    def _commit(self) -> None:
        self._analyzed = False
        if self._nested:
            self._internal(self._entry_end("RELEASE litecdc_entry"))
        else:
            self._commit_transaction()

    def _commit_transaction(self) -> None:
        """COMMIT the writer's transaction. One that changes the schema is flagged while it
        commits and counted once committed, so that readers drop their prepared statements
        (see _reader, _read_one); then the background checkpointer may take its turn."""
        version = self._internal("PRAGMA schema_version")[0][0]
        changing = version != self._committed_schema_version
        if changing:
            self._schema_commit_in_flight = True
        try:
            self._internal("COMMIT")
            if changing:
                self._committed_schema_version = version
        finally:
            if changing:
                self._schema_generation += 1
                self._schema_commit_in_flight = False
        if self._checkpointer is not None:
            self._checkpointer.after_commit()

    def _rollback(self) -> None:
        analyzed, self._analyzed = self._analyzed, False
        if self._writer.in_transaction:  # (else a statement's OR ROLLBACK already ended it)
            if self._nested:
                self._internal(self._entry_end("ROLLBACK TO litecdc_entry; RELEASE litecdc_entry"))
            else:
                self._internal("ROLLBACK")
        if analyzed:
            self._reload_statistics()

    def _reload_statistics(self) -> None:
        """Reload the planner's statistics from the sqlite_stat tables as they now are. An
        ANALYZE loads what it computed into the connection's memory, and a rollback of its
        rows leaves them there: this node then planned queries with statistics no replica
        had (QA: an INSERT … SELECT numbered its rows in another order).

        ``ANALYZE sqlite_schema`` reloads them, and writes nothing while the sqlite_stat
        tables exist; it would create missing ones — but then the rolled-back ANALYZE had
        created them, a schema change, and SQLite reloaded the schema itself."""
        present = {
            str(row[0])
            for row in self._internal(
                "SELECT name FROM sqlite_schema WHERE name IN ('sqlite_stat1', 'sqlite_stat4')"
            )
        }
        if present == {"sqlite_stat1", "sqlite_stat4"}:
            self._internal("ANALYZE sqlite_schema")

    @property
    def batch_ended(self) -> bool:
        """True inside in_one_transaction once a statement has ended its SQLite
        transaction (ON CONFLICT ROLLBACK, RAISE(ROLLBACK), the write step limit)."""
        return self._nested and not self._writer.in_transaction

    def in_one_transaction(
        self, steps: Sequence[Callable[[], T]], state: Mapping[str, int] | None = None
    ) -> list[T] | None:
        """Run several writes (each a savepoint) and ``state`` in ONE SQLite transaction.

        Returns their results, or None with nothing committed when a statement rolled
        the whole transaction back (ON CONFLICT ROLLBACK) and no step said which — the
        caller runs them one by one instead. (A step may raise instead, as the journal's
        do to name the entry: nothing is committed then either.)
        """
        with self._write_in_progress():
            self._internal("BEGIN IMMEDIATE")
            self._nested = True
            try:
                done = []
                for step in steps:
                    done.append(step())
                    if not self._writer.in_transaction:
                        self._schema_changed()  # (the steps' schema changes are undone)
                        return None
                if state:
                    was, self._authorizer.internal = self._authorizer.internal, True
                    try:
                        self._write_state(state)
                    finally:
                        self._authorizer.internal = was
                        self._buffer.clear()
                self._nested = False
                self._commit_transaction()
                return done
            except _BatchRolledBack:
                self._schema_changed()
                return None
            except BaseException:
                self._nested = False
                self._rollback()
                self._schema_changed()
                raise
            finally:
                self._nested = False

    def _run_statement(
        self, statement: Statement, transaction: bool, combined: Access
    ) -> tuple[StatementResult, str | None, bool]:
        """Run one client statement; returns its result, its journal text (None when it
        failed) and whether its failure must fail the whole request."""
        self._check_not_stopping()
        writer = self._writer
        buffer_mark = self._buffer.mark()
        random_mark = self._random.calls
        # Outside an explicit transaction each statement stands alone: a savepoint
        # undoes exactly its effects when it fails (OR FAIL keeps partial changes
        # otherwise), so what is committed matches what is journaled.
        savepoint = not transaction
        if savepoint:
            self._internal("SAVEPOINT litecdc_statement")
        access = self._access_cache.get(statement.sql)
        recording = access is None
        if recording:
            access = self._authorizer.recording = Access()
        started = time.perf_counter()
        changes_before = writer.total_changes()
        self._authorizer.reset()  # forget anything left from an earlier statement
        watch = self._reshape_watch()

        near_end: list[str] = []  # AUTOINCREMENT tables it writes that are nearly full

        prefix_names: list[set[str]] = []  # in litecdc's prefix before the first DDL ran

        def prepared() -> str | None:
            watch.statement()  # first: judging the statement resets what was noted of it
            if not prefix_names and self._authorizer.ddl_prepared:
                prefix_names.append(self._names_in_litecdcs_prefix())
            refused = self._authorizer.prepared()
            if refused is None and access is not None:
                near_end[:] = self._autoincrement_near_end(access.writes)
            return refused

        lowered = statement.sql.lower()
        if "analyze" in lowered:
            self._analyzed = True
        # PRAGMA defer_foreign_keys is the connection's, not undone with the statement: a
        # failed statement that set it left it set for the rest of the request on this
        # node only (QA: a replica replaying the journal failed the next statement)
        defer_before = (
            self._internal("PRAGMA defer_foreign_keys")[0][0]
            if self._foreign_keys and "defer_foreign_keys" in lowered
            else None
        )

        def failed(exc: BaseException) -> tuple[StatementResult, None, bool]:
            refused = access.refused if access is not None else None
            self._authorizer.recording = None
            if savepoint and writer.in_transaction:
                self._internal("ROLLBACK TO litecdc_statement; RELEASE litecdc_statement")
                if defer_before is not None:
                    self._internal(f"PRAGMA defer_foreign_keys={int(defer_before)}")
                if "analyze" in lowered:
                    self._reload_statistics()
            self._buffer.cut(buffer_mark)
            self._random.calls = random_mark
            if access is not None and access.schema:
                # its schema change is undone too: shapes captured after it (a string's
                # "ALTER …; UPDATE …; <fails>") would mislabel every later image (QA)
                self._schema_changed()
            message = _statement_error(exc, refused)
            if isinstance(exc, KeyError):
                message = f"no value for parameter :{exc.args[0]}"
            elif message == _VACUUM_IN_TRANSACTION:
                message = VACUUM_REFUSED
            aborts = access is not None and access.refused_transaction_control
            return (
                StatementResult(error=message, seconds=time.perf_counter() - started),
                None,
                aborts,
            )

        limited = False  # the statement ran past WRITE_STEP_LIMIT
        try:
            last = _LastResult(prepared)
            params = _bindable(statement.sql, statement.params)
            text: str | None = None
            self._write_checks = 0
            try:
                if _runs_as_text(statement.sql, self._random_views()):
                    text = render(statement.sql, params).rstrip()
                    text += parse_template(statement.sql).terminator
                    last.run(writer.cursor(), text, None, can_cache=False)
                else:
                    # Only a statement with parameters is cached: one without (every
                    # cluster log entry's, a journal replay's) is prepared afresh, so that
                    # SQLite's progress checks fall on the same steps on every replica
                    # (a cached statement's phase follows its earlier runs; see
                    # WRITE_STEP_LIMIT)
                    # (nor one that returns rows: a cached statement is described as
                    # first prepared until it runs again — its columns before an ALTER)
                    # (nor, once it has learnt as many as it keeps, any text it does not
                    # know: a known one might be cached again)
                    known = hash(statement.sql)
                    cache = (
                        not recording
                        and bool(statement.params)
                        and known not in self._returns_rows
                        and len(self._returns_rows) < _RETURNS_ROWS_KEPT
                    )
                    last.run(writer.cursor(), statement.sql, params, can_cache=cache)
                    full = len(self._returns_rows) >= _RETURNS_ROWS_KEPT
                    if last.description and statement.params and not full:
                        self._returns_rows.add(known)  # (a hash: texts can be large)
            finally:
                limited = self._write_limit_reached()
                self._write_checks = None
            watch.finish()
            description, rows = last.description, last.rows
            assert access is not None
            if access.refused is not None:
                raise StatementError(access.refused)
            if access.schema:
                problem = (
                    self._check_capturable(access.writes)
                    or self._check_foreign_keys(access.writes)
                    or self._check_internal_names(prefix_names[0] if prefix_names else None)
                    or self._check_triggers(access)
                )
                if problem is not None:
                    raise StatementError(problem)
            problem = self._check_rowid_space(buffer_mark)
            if problem is not None:
                raise StatementError(problem)
            if savepoint and self._deferred_violations():
                # outside a transaction each statement stands alone, as rqlite commits it:
                # one leaving a deferred foreign-key violation fails as its COMMIT would,
                # not the whole request at the end (QA: the valid statements were lost)
                raise StatementError("FOREIGN KEY constraint failed")
            if text is None:
                text = (
                    render(statement.sql, params).rstrip()
                    + parse_template(statement.sql).terminator
                )
        except ENVIRONMENTAL_ERRORS as exc:
            if isinstance(exc, apsw.InterruptError) and limited:
                return failed(StatementError(WRITE_LIMIT_ERROR))  # the statement's fault
            if isinstance(exc, apsw.FullError) and near_end:
                # SQLite says "database or disk is full" when an AUTOINCREMENT table has no
                # rowid left: the statement's fault, the same on every replica (QA: taken
                # for a full disk, the entry was retried forever and the cluster stopped)
                return failed(StatementError(_autoincrement_exhausted(near_end)))
            # this node's disk, memory or file — not the statement: the same SQL succeeds on
            # other replicas, so recording a failed statement would make them differ. The
            # whole write aborts (run_write rolls back and re-raises; the apply loop retries).
            self._authorizer.recording = None
            raise
        except (apsw.Error, StatementError, OverflowError, TypeError, KeyError, ValueError) as exc:
            if self._closing or self._abort_write:
                # stopped from outside: whatever error that left is this node's, not the
                # statement's — recording it as the statement's failure would make this
                # replica differ (review QA: an interrupted trigger check surfaced as "no
                # such savepoint")
                self._authorizer.recording = None
                raise apsw.InterruptError(f"the write did not finish: {exc}") from exc
            return failed(exc)
        self._authorizer.recording = None
        if savepoint:
            self._internal("RELEASE litecdc_statement")
        if recording:
            self._access_cache.put(statement.sql, access)
        combined.merge(access)
        combined.reshaped.update(watch.reshaped)  # (what this run did: not in the cache)
        combined.unlogged |= watch.unlogged
        if access.schema:
            self._schema_changed()
        result = StatementResult(seconds=time.perf_counter() - started)
        if description:
            result.columns = [d[0] for d in description]
            result.decltypes = [d[1] for d in description]
            result.rows = rows
        if not description or access.writes:
            result.last_insert_id = writer.last_insert_rowid()
            # SQLite's changes() (what rqlite reports): rows the statement itself changed,
            # not those its triggers or foreign-key actions changed; it keeps the last DML
            # statement's count through DDL, so a statement that changed nothing says 0
            changed = writer.total_changes() != changes_before
            result.rows_affected = writer.changes() if changed else 0
        return result, text, False

    def _append(
        self, entry: JournalEntry, access: Access, state: Mapping[str, int] | None = None
    ) -> None:
        """Write the journal entry, captured changes, table cids and node state (inside the
        transaction, so a crash can neither skip nor repeat an entry)."""
        self._authorizer.internal = True
        writer = self._writer
        writer.preupdate_hook(None)
        try:
            writer.execute(
                f"INSERT INTO {JOURNAL_TABLE}(cid, query, snapshot, ts, seed, internal) "
                "VALUES (?,?,?,?,?,?)",
                (
                    entry.cid,
                    entry.query,
                    entry.snapshot,
                    entry.timestamp_ms,
                    entry.seed,
                    int(entry.internal),
                ),
            )
            if self._buffer.events:
                writer.executemany(
                    f"INSERT INTO {CHANGES_TABLE} VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    self._buffer.rows(entry.cid, entry.timestamp_ms),
                )
            if access.barrier:
                # every later entry depends on this one, and it on everything before: no
                # other name's cids can decide a snapshot any more (Journal._record forgets
                # them too) — kept, every table or index name ever used stayed (soak QA)
                writer.execute(
                    f"DELETE FROM {TABLE_CIDS_TABLE} "
                    "WHERE name <> ? AND cid <= ? AND read_cid <= ?",
                    (SCHEMA_OBJECT, entry.cid, entry.cid),
                )
                writes, reads = {SCHEMA_OBJECT}, set()
            else:
                writes, reads = access.writes, access.reads
            if writes:
                writer.executemany(
                    f"INSERT INTO {TABLE_CIDS_TABLE}(name, cid) VALUES (?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET cid = max(cid, excluded.cid)",
                    [(name, entry.cid) for name in sorted(writes)],
                )
            if reads:
                writer.executemany(
                    f"INSERT INTO {TABLE_CIDS_TABLE}(name, cid, read_cid) VALUES (?, 0, ?) "
                    "ON CONFLICT(name) DO UPDATE SET read_cid = max(read_cid, excluded.read_cid)",
                    [(name, entry.cid) for name in sorted(reads)],
                )
            if access.reshaped:
                self._record_reshapes(entry.cid, access.reshaped)
            if access.unlogged:
                writer.executemany(
                    f"INSERT INTO {UNLOGGED_TABLE}(name, cid) VALUES (?, ?)",
                    [(key, entry.cid) for key in sorted(access.unlogged)],
                )
            if state:
                self._write_state(state)
        finally:
            writer.preupdate_hook(self._buffer.hook)
            self._authorizer.internal = False

    def _record_reshapes(self, cid: int, reshaped: Mapping[str, str | None]) -> None:
        """Record ``cid`` as the last reshape of the tables ``reshaped`` names, and forget
        those that are gone (db/reshape.py)."""
        gone = sorted(key for key, name in reshaped.items() if name is None)
        now = sorted(name for name in reshaped.values() if name is not None)
        if gone:
            self._writer.executemany(
                f"DELETE FROM {RESHAPES_TABLE} WHERE name = ?", [(key,) for key in gone]
            )
        if now:
            self._writer.executemany(
                f"INSERT INTO {RESHAPES_TABLE}(name, cid) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET name = excluded.name, cid = excluded.cid",
                [(name, cid) for name in now],
            )

    def reshaped_cids(self) -> dict[str, int]:
        """table -> the cid of its last reshape (db/reshape.py), for the tables that have
        one recorded."""
        with self._write_lock:
            rows = self._internal(f"SELECT name, cid FROM {RESHAPES_TABLE}")
            return {str(name): int(cid) for name, cid in rows}

    def unlogged_cids(self) -> dict[str, list[int]]:
        """table name (``reshape.fold``-ed; dropped ones too) -> the cids that changed its
        rows without row changes (db/reshape.py), in order."""
        with self._write_lock:
            found: dict[str, list[int]] = {}
            for name, cid in self._internal(f"SELECT name, cid FROM {UNLOGGED_TABLE}"):
                found.setdefault(str(name), []).append(int(cid))
            return found

    def _reshape_watch(self) -> ReshapeWatch:
        return ReshapeWatch(self._internal, self._authorizer.take_table_ddl)

    def _upgrade_layout(self) -> None:
        """Create the internal tables an older data format lacks, and stamp this one's."""
        with self._write_lock:
            self._internal("BEGIN IMMEDIATE")
            try:
                self._execute_internal_text(CREATE_INTERNAL)
                was, self._authorizer.internal = self._authorizer.internal, True
                try:
                    stamp_format(self._writer)
                finally:
                    self._authorizer.internal = was
                self._commit_transaction()
            except BaseException:
                self._rollback()
                raise
            self._schema_changed()

    def _write_state(self, state: Mapping[str, int]) -> None:
        self._writer.executemany(
            f"INSERT INTO {NODE_STATE_TABLE}(name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            sorted(state.items()),
        )

    def set_node_state(self, name: str, value: int) -> None:
        """Record a value of this node's own state, in a transaction of its own."""
        with self._write_lock:
            was, self._authorizer.internal = self._authorizer.internal, True
            try:
                self._internal("BEGIN IMMEDIATE")
                try:
                    self._write_state({name: value})
                    self._commit_transaction()
                except BaseException:
                    if self._writer.in_transaction:
                        self._internal("ROLLBACK")
                    raise
            finally:
                self._authorizer.internal = was

    def node_state(self, name: str) -> int | None:
        """A value of this node's own state (``_litecdc_node_state``), None if unset."""
        with self._write_lock:
            rows = self._internal(f"SELECT value FROM {NODE_STATE_TABLE} WHERE name = ?", (name,))
            return int(rows[0][0]) if rows else None

    def apply_entry(self, entry: JournalEntry) -> tuple[bool, Access]:
        """Re-execute a journal entry (follower apply / replay) and record it.

        Returns whether its SQL ran; on failure the entry is recorded as the
        empty entry for its cid (query NULL, snapshot 0), as on every replica.
        """
        with self._write_lock:
            access = Access()
            if entry.query is None:
                self.write_empty_entry(entry.cid, entry.timestamp_ms, entry.seed)
                return False, access
            self._vfs.pin(entry.timestamp_ms)
            self._random.start(entry.seed)
            self._buffer.clear()
            self._internal("BEGIN IMMEDIATE")
            self._writer.set_last_insert_rowid(0)
            try:
                if entry.internal:
                    self._execute_internal_text(entry.query)
                    access.schema = True  # a barrier, as in run_internal
                else:
                    self._authorizer.reset()
                    self._authorizer.recording = access
                    watch = self._reshape_watch()
                    cursor = self._writer.cursor()
                    cursor.exec_trace = watch.trace  # statement by statement, as on the leader
                    try:
                        cursor.execute(entry.query, can_cache=False).fetchall()
                        if access.refused is not None:
                            raise StatementError(access.refused)
                        watch.finish()
                        access.reshaped.update(watch.reshaped)
                        access.unlogged |= watch.unlogged
                    finally:
                        self._authorizer.recording = None
                        self._authorizer.reset()
                self._append(entry, access)
                self._commit_transaction()
                ok = True
            except ENVIRONMENTAL_ERRORS:
                # this node's disk, memory or file, not the entry: recording it empty would
                # make this replica differ; the caller gets the error and may try again
                self._rollback()
                raise
            except (apsw.Error, StatementError) as exc:
                log.warning(
                    "journal entry %d failed on apply and is recorded empty: %s", entry.cid, exc
                )
                self._rollback()
                ok = False
            finally:
                self._buffer.clear()
                self._vfs.pin(None)
                if access.schema:
                    self._schema_changed()
            if not ok:
                self.write_empty_entry(entry.cid, entry.timestamp_ms, entry.seed)
                return False, Access()
            return True, access

    def _execute_internal_text(self, query: str) -> None:
        """Run litecdc's own SQL: may write ``_litecdc_*`` tables, captures nothing."""
        self._writer.preupdate_hook(None)
        was_internal, self._authorizer.internal = self._authorizer.internal, True
        try:
            self._writer.execute(query, can_cache=False).fetchall()
        finally:
            self._authorizer.internal = was_internal
            self._writer.preupdate_hook(self._buffer.hook)

    def run_internal(
        self,
        query: str,
        *,
        timestamp_ms: int,
        seed: int,
        decide: Callable[[Access], Decision],
        state: Mapping[str, int] | None = None,
    ) -> JournalEntry:
        """Commit litecdc's own SQL (CDC state, pruning) as an internal journal entry.

        It goes through the journal like any write, so every replica applies it, but
        it produces no change events. ``decide`` sees an Access marked as a schema
        change, so the entry depends on everything before it.
        """
        with self._write_lock:
            self._vfs.pin(timestamp_ms)
            self._buffer.clear()  # an internal entry carries no change events
            self._begin()
            try:
                self._execute_internal_text(query)
                access = Access(schema=True)
                decision = decide(access)
                entry = JournalEntry(
                    decision.cid, query, decision.snapshot, timestamp_ms, seed, internal=True
                )
                # a barrier: later entries depend on it (pruning reads the journal's head,
                # which must be the same on every replica when it runs)
                self._append(entry, Access(schema=True), state)
                self._commit()
            except BaseException:
                self._rollback()
                raise
            finally:
                self._vfs.pin(None)
            self._schema_changed()
            return entry

    def write_empty_entry(
        self,
        cid: int,
        timestamp_ms: int = 0,
        seed: int = 0,
        state: Mapping[str, int] | None = None,
    ) -> None:
        """Record ``cid`` as an empty entry: it was allocated, but its transaction failed."""
        with self._write_lock:
            self._begin()
            try:
                self._internal(
                    f"INSERT INTO {JOURNAL_TABLE}(cid, query, snapshot, ts, seed) "
                    "VALUES (?, NULL, 0, ?, ?)",
                    (cid, timestamp_ms, seed),
                )
                if state:
                    was, self._authorizer.internal = self._authorizer.internal, True
                    try:
                        self._write_state(state)
                    finally:
                        self._authorizer.internal = was
                        self._buffer.clear()
                self._commit()
            except BaseException:
                self._rollback()
                raise

    # -- journal storage ----------------------------------------------------------------
    def journal_page(
        self, after: int, limit: int, max_bytes: int | None = None
    ) -> tuple[list[JournalEntry], bool, int]:
        """Entries with cid > ``after`` (see _journal_entries), whether a bound ended the
        page, and the smallest cid kept, from one read (a trim in between would hide that
        entries were missed)."""

        def read(conn: apsw.Connection) -> tuple[list[JournalEntry], bool, int]:
            oldest: Any = conn.execute(f"SELECT min(cid) FROM {JOURNAL_TABLE}").fetchall()[0][0]
            return (*_journal_entries(conn, after, limit, max_bytes), int(oldest))

        return self.read_consistent(read)

    def journal_batch_end(self, first: int, through: int, entries: int, size: int) -> int:
        """The last cid of a batch of journal rows from ``first`` (at most ``through``)
        holding at most ``entries`` rows and — past its first row — ``size`` bytes of SQL
        text: deleting a row reads its whole text, and a bulk write's entry may hold
        megabytes."""
        rows = self._read(
            f"SELECT cid, coalesce(octet_length(query), 0) FROM {JOURNAL_TABLE} "
            "WHERE cid BETWEEN ? AND ? ORDER BY cid LIMIT ?",
            (first, through, entries),
        )
        end, total = first, 0
        for index, (cid, length) in enumerate(rows):
            total += length
            if index and total > size:
                break
            end = cid
        return int(end)

    def journal_bounds(self) -> tuple[int, int, int]:
        """(smallest cid, largest cid, available snapshot) from the journal table."""
        with self._write_lock:
            low, high = self._internal(f"SELECT min(cid), max(cid) FROM {JOURNAL_TABLE}")[0]
            # available snapshot: the end of the unbroken run of cids from the smallest
            gap = self._internal(
                f"SELECT min(cid) FROM {JOURNAL_TABLE} j WHERE NOT EXISTS "
                f"(SELECT 1 FROM {JOURNAL_TABLE} k WHERE k.cid = j.cid + 1)"
            )[0][0]
            return int(low), int(high), int(gap)

    def journal_cids_above(self, cid: int) -> list[int]:
        with self._write_lock:
            return [
                r[0]
                for r in self._internal(
                    f"SELECT cid FROM {JOURNAL_TABLE} WHERE cid > ? ORDER BY cid", (cid,)
                )
            ]

    def has_cid(self, cid: int) -> bool:
        with self._write_lock:
            return bool(self._internal(f"SELECT 1 FROM {JOURNAL_TABLE} WHERE cid = ?", (cid,)))

    def table_cids(self) -> dict[str, tuple[int, int]]:
        """name -> (last cid that wrote it, last cid that read it)."""
        with self._write_lock:
            rows = self._internal(f"SELECT name, cid, read_cid FROM {TABLE_CIDS_TABLE}")
            return {name: (cid, read_cid) for name, cid, read_cid in rows}

    def delete_journal_through(self, cid: int) -> int:
        """Delete journal rows with cid <= ``cid`` (the caller checked the rules)."""
        with self._write_lock:
            # a transaction of its own, ended by _commit_transaction: the checkpoint that
            # follows commits (review: trims on a quiet cluster node grew the WAL to 54 MB)
            self._internal("BEGIN IMMEDIATE")
            try:
                self._internal(f"DELETE FROM {JOURNAL_TABLE} WHERE cid <= ?", (cid,))
                deleted = self._writer.changes()
                self._commit_transaction()
            except BaseException:
                if self._writer.in_transaction:
                    self._internal("ROLLBACK")
                raise
            return deleted

    # -- changes --------------------------------------------------------------------------
    def changes(
        self, after: int, limit: int, after_seq: int | None = None, max_bytes: int | None = None
    ) -> tuple[list[RowChange], bool]:
        """Changes after ``(after, after_seq)`` (after the whole transaction ``after`` when
        no seq is given), at most ``limit`` and — past the first — ``max_bytes`` of stored
        images; and whether a bound ended the page (more may follow)."""
        start = (after << SEQ_BITS | after_seq) if after_seq is not None else last_change_id(after)
        cursor = self._reader().execute(
            f"SELECT {CHANGE_COLUMNS}, octet_length(pk) + coalesce(octet_length(before), 0) "
            f"+ coalesce(octet_length(after), 0) FROM {CHANGES_TABLE} WHERE id > ? "
            "ORDER BY id LIMIT ?",
            (start, limit),
        )
        found: list[RowChange] = []
        size = 0
        try:
            for *row, row_size in cursor:
                size += row_size
                if found and max_bytes is not None and size > max_bytes:
                    return found, True
                found.append(decode_change(tuple(row)))
        finally:
            # (a page cut short must not leave its statement open: it would hold the snapshot)
            cursor.close()
        return found, len(found) == limit

    def changes_count(self) -> int:
        return int(self._read(f"SELECT count(*) FROM {CHANGES_TABLE}")[0][0])

    def read_transactions(
        self,
        after: int,
        max_transactions: int,
        max_events: int | None = None,
        *,
        oversize_first: bool = True,
    ) -> tuple[list[RowChange], bool]:
        """All changes of the next transactions after cid ``after``, in (cid, seq) order:
        at most ``max_transactions`` of them, and no more that would take the total past
        ``max_events`` — except that with ``oversize_first`` the first is taken whole
        however large (a transaction is never split). The flag says whether a limit
        stopped the read with another transaction waiting."""
        conn = self._reader()
        with self._readers.authorizer.trusted():
            conn.execute("BEGIN")  # one consistent view for the walk and the read
        try:
            last, count, events, limited = after, 0, 0, False
            while True:
                if count >= max_transactions:
                    limited = True
                    break
                # next cid with changes: one B-tree seek, since ids are cid << 24 | seq
                found: list[tuple[Any, ...]] = conn.execute(
                    f"SELECT id >> {SEQ_BITS} FROM {CHANGES_TABLE} WHERE id > ? ORDER BY id "
                    "LIMIT 1",
                    (last_change_id(last) if last >= 0 else -1,),
                ).fetchall()
                if not found:
                    break
                cid = found[0][0]
                if max_events is not None:
                    # its size: the seq of its last change (seqs run 1..n)
                    sized: list[tuple[Any, ...]] = conn.execute(
                        f"SELECT id & {(1 << SEQ_BITS) - 1} FROM {CHANGES_TABLE} WHERE id <= ? "
                        "ORDER BY id DESC LIMIT 1",
                        (last_change_id(cid),),
                    ).fetchall()
                    size = int(sized[0][0])
                    if events + size > max_events and (count or not oversize_first):
                        limited = True
                        break
                    events += size
                last, count = cid, count + 1
            if count == 0:
                return [], limited
            rows = conn.execute(
                f"SELECT {CHANGE_COLUMNS} FROM {CHANGES_TABLE} WHERE id > ? AND id <= ? "
                "ORDER BY id",
                (last_change_id(after) if after >= 0 else -1, last_change_id(last)),
            ).fetchall()
        finally:
            with self._readers.authorizer.trusted():
                conn.execute("COMMIT")
        return [decode_change(row) for row in rows], limited

    def next_transaction(self, after: int) -> tuple[int, int] | None:
        """The cid of the first transaction with changes after cid ``after``, and how many
        it has; None when there is none."""
        found = self._read(
            f"SELECT id FROM {CHANGES_TABLE} WHERE id > ? ORDER BY id LIMIT 1",
            (last_change_id(after) if after >= 0 else -1,),
        )
        if not found:
            return None
        cid = int(found[0][0]) >> SEQ_BITS
        last = self._read(  # seqs run 1..n
            f"SELECT id FROM {CHANGES_TABLE} WHERE id <= ? ORDER BY id DESC LIMIT 1",
            (last_change_id(cid),),
        )
        return cid, int(last[0][0]) & ((1 << SEQ_BITS) - 1)

    def transaction_changes(self, cid: int, after_seq: int, limit: int) -> list[RowChange]:
        """Up to ``limit`` changes of transaction ``cid`` after its change ``after_seq``."""
        rows = self._read(
            f"SELECT {CHANGE_COLUMNS} FROM {CHANGES_TABLE} WHERE id > ? AND id <= ? "
            "ORDER BY id LIMIT ?",
            (cid << SEQ_BITS | after_seq, last_change_id(cid), limit),
        )
        return [decode_change(row) for row in rows]

    def read_consistent(self, read: Callable[[apsw.Connection], T]) -> T:
        """Run ``read`` on this thread's reader connection inside one read transaction,
        with litecdc's own access (internal tables readable): the pull source's snapshot
        chunks and change ranges see one consistent state and the cid it includes."""
        conn = self._reader()
        authorizer: ReadAuthorizer = self._readers.authorizer
        with authorizer.trusted():
            conn.execute("BEGIN")
            try:
                return read(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def queue_stats(self, after: int = 0) -> tuple[int, int | None]:
        """(captured changes stored after cid ``after``, the oldest one's cid)."""
        count, oldest = self._read(
            f"SELECT count(*), min(cid) FROM {CHANGES_TABLE} WHERE id > ?",  # (cid, seq) order
            (last_change_id(after) if after > 0 else 0,),
        )[0]
        return int(count), oldest

    def cdc_high_watermark(self) -> int | None:
        """The high watermark persisted in the CDC state table; None before a webhook
        recorded one."""
        try:
            rows = self._read(f"SELECT value FROM {CDC_STATE_TABLE} WHERE name = 'hwm'")
        except apsw.SQLError:
            return None
        return int(rows[0][0]) if rows else None

    # -- reads ----------------------------------------------------------------------------
    def query(
        self,
        statements: Sequence[Statement],
        *,
        transaction: bool = False,
        limit: ReadLimit | None = None,
    ) -> list[StatementResult]:
        """Run read-only statements on this thread's reader connection.

        With ``limit``, a statement still running past its deadline (or once it is
        cancelled) is interrupted and its result is the error ``query timeout``; the
        statements after it are not run and get the same error (rqlite's db_timeout).
        """
        conn = self._reader()
        authorizer: ReadAuthorizer = self._readers.authorizer
        results: list[StatementResult] = []
        if limit is not None:
            conn.set_progress_handler(limit.stop_now, READ_CHECK_STEPS)
        if transaction:
            with authorizer.trusted():
                conn.execute("BEGIN")
        try:
            # every statement gets its result, an error too, as rqlite's queryWithConn
            # gives them (with `transaction` as well: reads have nothing to roll back)
            for statement in statements:
                stopped = limit.reason() if limit is not None else None
                if stopped is not None:
                    results.append(StatementResult(error=stopped))
                    continue
                results.append(self._read_one(conn, statement, limit))
        finally:
            if limit is not None:
                conn.set_progress_handler(None)  # (the COMMIT below must not be interrupted)
            if conn.in_transaction:  # ours, or anything a statement left open
                with authorizer.trusted():
                    conn.execute("COMMIT" if transaction else "ROLLBACK")
        return results

    def _read_one(
        self, conn: apsw.Connection, statement: Statement, limit: ReadLimit | None = None
    ) -> StatementResult:
        started = time.perf_counter()
        last = _LastResult()
        refusals = self._readers.authorizer
        refusals.reason = None
        try:
            params = _bindable(statement.sql, statement.params)
            in_flight = self._schema_commit_in_flight
            last.run(conn.cursor(), statement.sql, params)
            if (
                in_flight
                or self._schema_commit_in_flight
                or self._schema_generation != self._readers.generation
            ):
                # a schema change committed meanwhile: the statement, taken from the cache,
                # may have been described before SQLite prepared it again (see _reader)
                last = _LastResult()
                last.run(conn.cursor(), statement.sql, params, can_cache=False)
        except apsw.InterruptError:
            return StatementResult(
                error=(limit.reason() if limit is not None else None) or QUERY_TIMEOUT,
                seconds=time.perf_counter() - started,
            )
        except apsw.AuthError as exc:
            reason = refusals.reason or _statement_error(exc, None, read=True)
            # (one linear scan of the text: a pattern searched at each ";" took quadratic
            # time on a text of many "; /*", holding the whole process — review)
            if (
                reason == ATTACH_REFUSED_IN_QUERIES
                and "VACUUM" in parse_template(statement.sql).leading_words
            ):
                reason = VACUUM_REFUSED  # (VACUUM attaches its target)
            return StatementResult(error=reason, seconds=time.perf_counter() - started)
        except apsw.ReadOnlyError:
            return StatementResult(
                error="attempt to change database via query operation",
                seconds=time.perf_counter() - started,
            )
        except (apsw.Error, OverflowError, TypeError, ValueError) as exc:
            return StatementResult(
                error=_statement_error(exc, None, read=True),
                seconds=time.perf_counter() - started,
            )
        except KeyError as exc:
            return StatementResult(
                error=f"no value for parameter :{exc.args[0]}",
                seconds=time.perf_counter() - started,
            )
        except StatementError as exc:  # (parameters of a kind no statement binds)
            return StatementResult(error=str(exc), seconds=time.perf_counter() - started)
        result = StatementResult(seconds=time.perf_counter() - started)
        result.columns = [d[0] for d in last.description or []]
        result.decltypes = [d[1] for d in last.description or []]
        result.rows = last.rows
        return result

    def is_read_only(
        self, statement: Statement, limit: ReadLimit | None = None, *, run: bool = True
    ) -> bool:
        """Whether every SQL statement in ``statement`` only reads (without ``run``, a
        text of several counts as a write: finding out would run its reads).

        Each statement is prepared and bound on a reader connection and stopped
        before it runs; when the text holds several statements, the read-only ones
        before the last run (on the read-only connection) so the next can be
        prepared — under ``limit``, as the read itself would (QA: a runaway read before
        a second statement ran here unbounded, its client gone or not). One stopped so
        counts as a read: the read path then reports the limit. Anything that fails to
        prepare or bind counts as a write, so the write path reports the error.
        """
        read_only = True
        count = parse_template(statement.sql).statements
        several = count > 1
        if several and not run:
            return False
        seen = 0

        def check(cur: apsw.Cursor, text: str, bindings: Any) -> bool:
            nonlocal read_only, seen
            seen += 1
            if not cur.is_readonly:
                read_only = False
                return False
            return seen < count  # the last need not run: nothing comes after it (QA)

        conn = self._reader()
        cursor = conn.cursor()
        cursor.exec_trace = check
        if several and limit is not None:
            conn.set_progress_handler(limit.stop_now, READ_CHECK_STEPS)
        try:
            cursor.execute(statement.sql, _bindable(statement.sql, statement.params)).fetchall()
        except apsw.ExecTraceAbort:
            pass
        except apsw.InterruptError:
            return True
        except (apsw.Error, OverflowError, TypeError, KeyError, ValueError, StatementError):
            return False  # (a write then: it reports the error)
        finally:
            if several and limit is not None:
                conn.set_progress_handler(None)
        return read_only

    # -- backup, dump, load -------------------------------------------------------------------
    def backup(self, destination: str, *, rollback_journal: bool = False) -> None:
        """A consistent copy of the whole database file via SQLite's backup API: in WAL
        mode as the database is, or with ``rollback_journal`` in DELETE mode (rqlite's
        ``fmt=delete``).

        One step, in one read transaction: a backup copied in chunks starts again from the
        first page whenever another connection (the writer) commits between two chunks —
        under a steady trickle of writes a 90 MB database's backup never finished (backup
        QA), and neither would a follower's snapshot download. WAL lets the writer go on
        meanwhile."""
        dest = apsw.Connection(destination)
        try:
            with dest.backup("main", self._reader(), "main") as step:
                step.step(-1)
                assert step.done  # (one step, all pages: a read transaction sees no writes)
        finally:
            dest.close()
        if rollback_journal:
            mark_rollback_journal(destination)

    def restore_from(
        self, source: str, *, check: Callable[[dict[str, int], int], None] | None = None
    ) -> dict[str, int]:
        """Replace the whole database with ``source``, a SQLite file made by another node's
        :meth:`backup` (a snapshot), and return the node state it holds.

        The file is verified first — SQLite's header, ``PRAGMA quick_check``, litecdc's
        internal tables — and ``check(node_state, last_cid)`` may refuse it by raising. It is then
        copied *into* the live database with SQLite's backup API on the writer connection,
        under the write lock: one ordinary WAL transaction, so a crash leaves the old or
        the new database, never a mix, and readers move from the old contents to the new
        at once (a read in progress keeps its snapshot). Swapping files instead would leave
        reader connections on the old inode, and SQLite deletes a WAL *by name* when the
        last connection to a database closes. Raises LoadError for an unusable file.
        """
        try:
            with open(source, "rb") as file:
                header = file.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise LoadError(f"snapshot: cannot read {source}: {exc}") from exc
        if header != SQLITE_HEADER:
            raise LoadError("snapshot: the file is not a SQLite database")
        snapshot = apsw.Connection(source)
        try:
            try:
                check_result = snapshot.execute("PRAGMA quick_check").fetchall()
                tables = {
                    r[0] for r in snapshot.execute("SELECT name FROM sqlite_schema").fetchall()
                }
            except apsw.Error as exc:
                raise LoadError(f"snapshot: the file is unreadable: {exc}") from exc
            if check_result != [("ok",)]:
                raise LoadError(f"snapshot: integrity check failed: {check_result[0][0]}")
            missing = {JOURNAL_TABLE, CHANGES_TABLE, NODE_STATE_TABLE, TABLE_CIDS_TABLE} - tables
            if missing:
                raise LoadError(
                    f"snapshot: not a litecdc database (no {', '.join(sorted(missing))})"
                )
            problem = layout_problem(snapshot)
            if problem is not None:  # another litecdc version's node (one version per cluster)
                raise LoadError(f"snapshot: {problem}")
            state = {
                str(name): int(value)  # type: ignore[arg-type]
                for name, value in snapshot.execute(
                    f"SELECT name, value FROM {NODE_STATE_TABLE}"
                ).fetchall()
            }
            if check is not None:
                found = snapshot.execute(f"SELECT max(cid) FROM {JOURNAL_TABLE}").fetchall()
                check(state, int(found[0][0] or 0))
            with self._write_lock:
                if self._closed:
                    raise LoadError("snapshot: the database is closed")
                try:
                    with self._writer.backup("main", snapshot, "main") as copy:
                        copy.step(-1)  # every page in one step: one write transaction
                except apsw.Error as exc:
                    raise LoadError(f"snapshot: installing it failed: {exc}") from exc
                self._schema_changed()
                # another file's schema: counted by the next commit, the one just below
                self._committed_schema_version = None
                self._upgrade_layout()  # a peer of an older data format (see layout_problem)
            return state
        finally:
            snapshot.close()

    def dump_sql(self, tables: Sequence[str] | None = None) -> str:
        conn = self._reader()
        with self._readers.authorizer.trusted():  # the dump's own read transaction
            return "".join(s + "\n" for s in dump_statements(conn, transaction=True, tables=tables))

    def load_statements(self, data: bytes) -> list[Statement]:
        """The statements a load of ``data`` runs (as one transaction), as rqlite loads.

        A SQLite database file *replaces* every user object: it is opened as a scratch
        database and dumped to plain statements, after deletes of every existing row
        (captured as deletes) and drops of every user object. SQL text (e.g. a ``.dump``)
        runs on the database as it is, its statements as written, without the dump's
        ``BEGIN``/``COMMIT``/``PRAGMA foreign_keys`` wrapper (see db/load.py).
        """
        if not data.startswith(SQLITE_HEADER):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LoadError(
                    "load: body is neither a SQLite database file nor UTF-8 SQL text"
                ) from exc
            statements = [
                Statement(s)
                for s in sql_text_statements(text, defer_foreign_keys=self._foreign_keys)
            ]
            if not statements:
                raise LoadError("load: the SQL text holds no statement")
            return statements
        if data[18:20] == b"\x02\x02":
            # a WAL-mode file (every backup of litecdc's or rqlite's): an in-memory
            # database cannot open one, and a lone file has no WAL to read anyway,
            # so mark it as a rollback-journal file (header bytes 18-19, 1 = legacy)
            data = data[:18] + b"\x01\x01" + data[20:]
        scratch = apsw.Connection(":memory:")
        try:
            scratch.deserialize("main", data)
            try:
                problems = scratch.execute("PRAGMA quick_check(5)").fetchall()
            except apsw.Error as exc:
                raise LoadError(f"load: the uploaded SQLite file is unreadable: {exc}") from exc
            if problems != [("ok",)]:
                # (a damaged page can still read, without some of its rows: loading it
                # replaced the whole database and silently lost those rows — QA)
                found = "; ".join(str(row[0]) for row in problems)
                if all(_breaks_a_constraint(str(row[0])) for row in problems):
                    # sound pages, rows its constraints refuse (written with
                    # ignore_check_constraints, say): not damage (SQL-surface QA)
                    raise LoadError(
                        f"load: the uploaded SQLite file holds rows its tables' constraints "
                        f"refuse: {found}; fix or delete those rows, then load it again"
                    )
                raise LoadError(f"load: the uploaded SQLite file is damaged: {found}")
            # litecdc's own tables (a backup's) are left out; a client object in that
            # namespace would be left out too, without a word (QA): say so instead
            known = ", ".join(f"'{name}'" for name in sorted(INTERNAL_TABLES))
            foreign = scratch.execute(
                "SELECT type, name FROM sqlite_schema WHERE lower(substr(name, 1, "
                f"{len(INTERNAL_PREFIX)})) = '{INTERNAL_PREFIX}' AND name NOT IN ({known})"
            ).fetchall()
            if foreign:
                kind, name = foreign[0]
                article = "an" if str(kind)[:1] in "aeiou" else "a"
                raise LoadError(
                    f"load: the SQLite file has {article} {kind} named {name}: names starting with "
                    f"{INTERNAL_PREFIX} (in any case) are reserved for litecdc's internal "
                    "tables; rename it before loading"
                )
            try:
                new = [Statement(s) for s in dump_statements(scratch, transaction=False)]
            except DataTypeError as exc:
                raise LoadError(f"load: {exc}") from exc
        finally:
            scratch.close()
        return self._clear_statements() + new

    def _clear_statements(self) -> list[Statement]:
        """Delete every row (captured as deletes), then drop every user object.

        Triggers go first: one firing on the deletes would write rows of its own, changes
        no client made (QA: a delete trigger's audit rows were in the change log, never
        deleted). Tables are emptied children first (a table before those its foreign
        keys reference): deleting a parent's rows first would set its children's keys to
        NULL (ON DELETE SET NULL: updates no one made) or fail (RESTRICT, with --fk).
        With --fk, the other checks wait for the end of the load (``defer_foreign_keys``),
        so neither the order of the deletes nor that of the file's rows can fail it.
        """
        now = (
            "(SELECT group_concat(type || ' ' || name, char(10) ORDER BY type || ' ' || name) "
            f"FROM sqlite_schema WHERE {USER_OBJECTS})"
        )
        # (the listing by the same SQL the check runs, in the same read as the objects:
        # sorted here, a UTF-16 database's names would order otherwise — review)
        found = self._read(f"SELECT type, name, {now} FROM sqlite_schema WHERE {USER_OBJECTS}")
        objects = [(kind, name) for kind, name, _ in found]
        listed = found[0][2] if found else None
        tables = [str(name) for kind, name in objects if kind == "table"]
        # what the list below was made from, checked where it runs: a write committed in
        # between (another load, a CREATE or DROP; on a cluster any entry appended
        # before this one) made a table survive the replacement, or the load fail with
        # "no such table" (backup QA) — Store.load makes the list again
        expected = "NULL" if listed is None else "'" + str(listed).replace("'", "''") + "'"
        # (json_extract: core SQL that fails with a message of ours, on every node alike)
        guard = Statement(
            f"SELECT json_extract('{{}}', CASE WHEN {now} IS {expected} THEN '$' "
            f"ELSE '{LOAD_RACED}' END)"
        )
        references = {
            table: {
                str(parent)
                for (parent,) in self._read(
                    'SELECT "table" FROM pragma_foreign_key_list(?)', (table,)
                )
            }
            for table in tables
        }
        out = [Statement("PRAGMA defer_foreign_keys=ON")] if self._foreign_keys else []
        out.append(guard)
        out += [
            Statement(f"DROP TRIGGER IF EXISTS {_quote(n)}") for k, n in objects if k == "trigger"
        ]
        out += [Statement(f"DELETE FROM {_quote(n)}") for n in children_first(tables, references)]
        order = {"view": 1, "index": 2, "table": 3}
        for kind, name in sorted(objects, key=lambda o: order.get(o[0], 9)):
            if kind in order and not (kind == "index" and name.startswith("sqlite_autoindex")):
                out.append(Statement(f"DROP {kind.upper()} IF EXISTS {_quote(name)}"))
        return out

    # -- facts ---------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(self.path + suffix)
        return total

    def user_table_count(self) -> int:
        return int(
            self._read(
                f"SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND {USER_OBJECTS}"
            )[0][0]
        )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _journal_entries(
    conn: apsw.Connection, after: int, limit: int, max_bytes: int | None = None
) -> tuple[list[JournalEntry], bool]:
    """Entries after ``after``: at most ``limit`` and — past the first — ``max_bytes`` of SQL
    text; and whether a bound ended the page."""
    cursor = conn.execute(
        f"SELECT cid, query, snapshot, ts, seed, internal = 1, "
        f"coalesce(octet_length(query), 0) FROM {JOURNAL_TABLE} WHERE cid > ? ORDER BY cid "
        "LIMIT ?",
        (after, limit),
    )
    found: list[JournalEntry] = []
    size = 0
    try:
        for cid, query, snapshot, ts, seed, internal, length in cursor:
            size += length
            if found and max_bytes is not None and size > max_bytes:
                return found, True
            found.append(JournalEntry(cid, query, snapshot, ts, seed, bool(internal)))
    finally:
        cursor.close()
    return found, len(found) == limit
