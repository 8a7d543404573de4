"""What a statement reads and writes, from SQLite's authorizer callback.

The journal computes each transaction's dependency from table-level read and
write sets. SQLite reports them to the authorizer when a statement is prepared
(trigger bodies and views included). APSW reuses prepared statements from its
cache without authorizing them again, so sets are cached per SQL text and the
cache is cleared on every schema change.

The same callback refuses, with a reason, what a replicated write must not do.
SQLite does not show it a trigger's body at CREATE TRIGGER, only when a statement
that fires the trigger is prepared; the engine prepares such statements (without
running them) to judge a new trigger (``Engine._check_triggers``).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import apsw

from litecdc.db.determinism import NON_DETERMINISTIC_FUNCTIONS
from litecdc.db.schema import INTERNAL_PREFIX, INTERNAL_TABLES, is_internal_name

_WRITE = {apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE}
# DDL whose first argument names the object and (for indexes and triggers) second its table
_DDL = {
    apsw.SQLITE_CREATE_TABLE,
    apsw.SQLITE_CREATE_INDEX,
    apsw.SQLITE_CREATE_VIEW,
    apsw.SQLITE_CREATE_TRIGGER,
    apsw.SQLITE_DROP_TABLE,
    apsw.SQLITE_DROP_INDEX,
    apsw.SQLITE_DROP_VIEW,
    apsw.SQLITE_DROP_TRIGGER,
    apsw.SQLITE_REINDEX,
    apsw.SQLITE_ANALYZE,
}
_CREATE = {apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_CREATE_VIEW, apsw.SQLITE_CREATE_TRIGGER}
_CREATE_OBJECT = {*_CREATE, apsw.SQLITE_CREATE_INDEX}
#: DDL that may reshape a table (see db/reshape.py)
_TABLE_DDL = {apsw.SQLITE_CREATE_TABLE, apsw.SQLITE_DROP_TABLE, apsw.SQLITE_ALTER_TABLE}
_TEMP_DDL = {
    apsw.SQLITE_CREATE_TEMP_TABLE,
    apsw.SQLITE_CREATE_TEMP_INDEX,
    apsw.SQLITE_CREATE_TEMP_VIEW,
    apsw.SQLITE_CREATE_TEMP_TRIGGER,
    apsw.SQLITE_DROP_TEMP_TABLE,
    apsw.SQLITE_DROP_TEMP_INDEX,
    apsw.SQLITE_DROP_TEMP_VIEW,
    apsw.SQLITE_DROP_TEMP_TRIGGER,
}
#: PRAGMAs that only describe the schema; any other PRAGMA changes per-connection or
#: per-file state that is not replicated.
INTROSPECTION_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_info",
        "index_xinfo",
        "index_list",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
        "user_version",
        "application_id",
        "encoding",
        "foreign_keys",
    }
)
#: PRAGMAs that list what the node's SQLite build and connection provide (functions,
#: modules, collations, compile-time options, pragmas): a replica with another build
#: would store other rows, so writes may not read them; queries may
BUILD_DEPENDENT_PRAGMAS = frozenset(
    {"function_list", "module_list", "compile_options", "pragma_list", "collation_list"}
)
#: introspection PRAGMAs that change the file header (or connection) when given a value
#: (encoding: a no-op on a node's file, but heading a journal replayed into an empty
#: database it made a UTF-16 one — engine QA)
_HEADER_PRAGMAS = frozenset({"user_version", "application_id", "foreign_keys", "encoding"})
#: PRAGMAs a query may give an argument: the read-only ones
_QUERY_PRAGMAS = (INTROSPECTION_PRAGMAS - _HEADER_PRAGMAS) | BUILD_DEPENDENT_PRAGMAS
#: table-valued PRAGMAs are the eponymous virtual tables pragma_<name>
_PRAGMA_TABLE_PREFIX = "pragma_"
#: tables whose contents depend on the file layout of each replica
_LAYOUT_TABLES = frozenset({"dbstat", "sqlite_dbpage"})
_SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})
#: PRAGMAs that read every table (or the one named): the transaction reads everything
_READ_ALL_PRAGMAS = frozenset({"foreign_key_check", "integrity_check", "quick_check"})
#: PRAGMAs a write may set: their setting lasts until the transaction ends (SQLite resets
#: it at COMMIT and ROLLBACK; the engine after each entry of a batch), so a replica
#: running the journal entry runs it the same way
TRANSACTION_PRAGMAS = frozenset({"defer_foreign_keys"})


ATTACH_REFUSED_IN_QUERIES = "ATTACH and DETACH are not allowed"
WAL_CHECKPOINT_REFUSED = (
    "PRAGMA wal_checkpoint is not available through the API: the node checkpoints its "
    "write-ahead log itself"
)


def pragma_refusal(pragma: str, value: str | None) -> str | None:
    """Why ``PRAGMA pragma`` (``value``: its argument or new value, if any) cannot be
    used in a write; None when it may."""
    name = pragma.lower()
    if name == "wal_checkpoint":
        return WAL_CHECKPOINT_REFUSED
    if name in BUILD_DEPENDENT_PRAGMAS:
        return (
            f"PRAGMA {pragma} lists what this node's SQLite build and connection provide, "
            "which can differ between replicas; it cannot be used in a write (a query can "
            "read it)"
        )
    if name in INTROSPECTION_PRAGMAS and (value is None or name not in _HEADER_PRAGMAS):
        return None
    if name in TRANSACTION_PRAGMAS:
        return None
    if value is None:  # a read: page_count, data_version, database_list…
        return (
            f"PRAGMA {pragma} reads connection or file state that differs between "
            "replicas; it cannot be used in a write"
        )
    refusal = (
        f"PRAGMA {pragma} changes connection or file state that is not "
        "replicated; it is not allowed in writes"
    )
    if name == "foreign_keys":
        # (rqlite QA: rqlite's backup guide runs it after a load; rqlite's -fk is ours)
        refusal += (
            ": foreign key constraints are enforced on every node started with "
            "`litecdc serve --fk` (rqlite's -fk)"
        )
    return refusal


@dataclass(slots=True)
class Access:
    """Tables (views, indexes) a statement reads and writes, and whether it changes the schema."""

    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    schema: bool = False
    #: tables, views and triggers the statement creates (SQLite's own tables too, such
    #: as the sqlite_stat1 a first ANALYZE creates)
    created: set[str] = field(default_factory=set)
    #: reads state that any earlier write may have changed (sqlite_sequence, or every
    #: table at once as foreign_key_check does): a barrier, like a schema change
    reads_everything: bool = False
    #: writes SQLite's own sqlite_sequence, which every later AUTOINCREMENT insert reads
    #: without the authorizer saying so: a barrier
    writes_sqlite_tables: bool = False
    #: why the statement was refused, if it was
    refused: str | None = None
    #: the trigger or view whose body held what was refused (None: the statement itself)
    refused_in: str | None = None
    #: the refusal means the client wanted a transaction (BEGIN…): fail the whole request
    refused_transaction_control: bool = False
    #: tables the transaction reshaped (db/reshape.py), by ``reshape.fold``-ed name: the
    #: table's name now, or None when it is gone (dropped, renamed away). Noted as the
    #: statements run, never cached with the SQL text.
    reshaped: dict[str, str | None] = field(default_factory=dict)
    #: tables whose rows the transaction changed without row changes (db/reshape.py), by
    #: ``reshape.fold``-ed name; noted like ``reshaped``
    unlogged: set[str] = field(default_factory=set)

    @property
    def barrier(self) -> bool:
        """Whether the transaction depends on everything before it and everything after
        it depends on it (see Journal.snapshot_for)."""
        return self.schema or self.reads_everything or self.writes_sqlite_tables

    @property
    def wrote(self) -> bool:
        """Whether there is anything to commit and journal."""
        return bool(self.writes) or self.schema or self.writes_sqlite_tables

    def merge(self, other: Access) -> None:
        self.reads |= other.reads
        self.writes |= other.writes
        self.schema = self.schema or other.schema
        self.created |= other.created
        self.reads_everything = self.reads_everything or other.reads_everything
        self.writes_sqlite_tables = self.writes_sqlite_tables or other.writes_sqlite_tables
        self.reshaped.update(other.reshaped)
        self.unlogged |= other.unlogged


class AccessCache:
    """The Access of recently run SQL texts, so a statement APSW has cached (which the
    authorizer does not see again) still has its read/write sets.

    Bounded in entries and in the characters of the texts it keeps, least recently used
    dropped first:
    clients that write values into their SQL (rqlite's own examples do) send a new text
    with every write, and an unbounded dict grew by ~1 KB per write without end
    (200,000 writes: +220 MB). A dropped text is recorded again when it comes back.
    """

    def __init__(self, max_entries: int = 4096, max_chars: int = 4 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._entries: OrderedDict[str, Access] = OrderedDict()
        self._chars = 0

    def get(self, sql: str) -> Access | None:
        access = self._entries.get(sql)
        if access is not None:
            self._entries.move_to_end(sql)
        return access

    def put(self, sql: str, access: Access) -> None:
        if len(sql) > self.max_chars // 16:
            return  # a text this long (a /db/load) would push out many and rarely comes back
        if sql in self._entries:
            self._entries.move_to_end(sql)
            self._entries[sql] = access
            return
        self._entries[sql] = access
        self._chars += len(sql)
        while self._chars > self.max_chars or len(self._entries) > self.max_entries:
            dropped, _ = self._entries.popitem(last=False)
            self._chars -= len(dropped)

    def clear(self) -> None:
        self._entries.clear()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)


def _is_internal(name: str) -> bool:
    """Whether an existing object (named as SQLite stores it) is litecdc's: the prefix in
    lower case, or one of its tables in another case (one a client made under that name
    before the prefix was reserved in any case: litecdc took it for its own)."""
    return name.startswith(INTERNAL_PREFIX) or name.lower() in INTERNAL_TABLES


def _is_user_object(name: str | None) -> bool:
    return name is not None and name != "" and not name.startswith("sqlite_")


class WriteAuthorizer:
    """The writer connection's authorizer: records access, refuses the unreplicable."""

    def __init__(
        self,
        on_schema_change: Callable[[], None],
        is_table: Callable[[str], bool] | None = None,
    ) -> None:
        #: called when a statement that changes the schema is prepared, before it runs
        self._on_schema_change = on_schema_change
        #: whether a table or view of that name exists (one named pragma_<name> hides
        #: the pragma's table); None: assume none does
        self._is_table = is_table
        self.recording: Access | None = None
        #: True while litecdc runs its own statements (no checks, no recording)
        self.internal = False
        #: the previous call was SQLite moving a root page (DROP TABLE / DROP INDEX)
        self._moved_rootpage = False
        #: the trigger or view whose body SQLite is authorizing (its 5th argument)
        self._context: str | None = None
        #: the SQL statement being prepared is DDL / writes sqlite_stat* / reads a
        #: table-valued pragma (see prepared), with the trigger or view doing it
        self._ddl_prepared = False
        self._stat_written: tuple[str, str | None] | None = None
        self._pragma_tables: dict[str, str | None] = {}
        #: user tables the statement being prepared creates, drops or alters: (name, ALTER)
        self._table_ddl: list[tuple[str, bool]] = []

    def reset(self) -> None:
        """Forget what the last statement noted (before a new one is prepared)."""
        self._stat_written, self._ddl_prepared = None, False
        self._pragma_tables = {}
        self._table_ddl = []

    @property
    def ddl_prepared(self) -> bool:
        """Whether the statement just prepared (not judged yet) changes the schema."""
        return self._ddl_prepared

    def take_table_ddl(self) -> list[tuple[str, bool]]:
        """The user tables the statement just prepared creates, drops or alters, as
        (name, whether by ALTER TABLE) — what SQLite says of them when it prepares the
        statement, whether or not running it changes anything — and forget them."""
        ddl, self._table_ddl = self._table_ddl, []
        return ddl

    def prepared(self) -> str | None:
        """Called after each SQL statement of a client's string is prepared, before it
        runs: why it must not run (None: it may), judged on the whole statement."""
        stat, ddl, pragma_tables = self._stat_written, self._ddl_prepared, self._pragma_tables
        self.reset()
        if stat is not None and not ddl:
            # SQLite's own DDL writes them (ANALYZE, DROP TABLE/INDEX, ALTER TABLE; ANALYZE
            # before its own action is authorized). A client's rows reach the query planner
            # only when each node next loads the schema (a restart), so replicas would
            # plan — and number rows — differently
            self._context = stat[1]
            return self._refusal(
                f"{stat[0]} cannot be written directly: the statistics would reach each "
                "replica's query planner at a different time; run ANALYZE instead"
            )
        for table, context in pragma_tables.items():
            # SQLite authorizes the pragma itself only when the table is scanned — not
            # when a trigger body is compiled, nor in a write that reads no row of it
            reason = pragma_refusal(table[len(_PRAGMA_TABLE_PREFIX) :], None)
            if reason is not None and not (self._is_table is not None and self._is_table(table)):
                self._context = context
                return self._refusal(reason)
        return None

    def _refusal(self, reason: str) -> str:
        if self.recording is not None and self.recording.refused is None:
            self.recording.refused = reason
            self.recording.refused_in = self._context
        return reason

    def _refuse(self, reason: str) -> int:
        self._refusal(reason)
        return apsw.SQLITE_DENY

    def __call__(
        self,
        action: int,
        arg1: str | None,
        arg2: str | None,
        database: str | None,
        trigger_or_view: str | None,
    ) -> int:
        if self.internal:
            return apsw.SQLITE_OK
        access = self.recording
        moved_rootpage, self._moved_rootpage = self._moved_rootpage, False
        self._context = trigger_or_view
        if action == apsw.SQLITE_READ:
            table = arg1 or ""
            if table[: len(_PRAGMA_TABLE_PREFIX)].lower() == _PRAGMA_TABLE_PREFIX:
                self._pragma_tables.setdefault(table, trigger_or_view)  # judged in prepared
            if _is_internal(table):
                return self._refuse(
                    f"table {table} is internal to litecdc and cannot be read in a write: it is "
                    "litecdc's own record, which a write must not depend on (parts of it "
                    "differ between replicas, or change as litecdc prunes)"
                )
            if table in _LAYOUT_TABLES:
                return self._refuse(
                    f"{table} describes the file layout, which differs between replicas; it "
                    "cannot be read in a write"
                )
            if table in _SCHEMA_TABLES and arg2 == "rootpage" and not moved_rootpage:
                # (SQLite's own DROP TABLE / DROP INDEX reads it right after moving a root
                # page; any other read is the client's, also next to DDL in one string)
                return self._refuse(
                    "sqlite_schema.rootpage describes the file layout, which differs between "
                    "replicas; it cannot be read in a write"
                )
            if access is not None:
                if table == "sqlite_sequence":
                    access.reads_everything = True
                elif _is_user_object(table):
                    access.reads.add(table)
                if trigger_or_view:
                    access.reads.add(trigger_or_view)
            return apsw.SQLITE_OK
        if action in _WRITE:
            if arg1 and _is_internal(arg1):
                return self._refuse(f"table {arg1} is internal to litecdc and cannot be written")
            if arg1 in _SCHEMA_TABLES and arg2 == "rootpage":
                self._moved_rootpage = True
            if arg1 and arg1.startswith("sqlite_stat"):
                self._stat_written = (arg1, trigger_or_view)  # judged in prepared
            if access is not None and arg1 is not None:
                if _is_user_object(arg1):
                    access.writes.add(arg1)
                elif arg1 not in _SCHEMA_TABLES:  # DDL writes the schema: already a barrier
                    access.writes_sqlite_tables = True
            return apsw.SQLITE_OK
        if action in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
            return apsw.SQLITE_OK
        if action == apsw.SQLITE_FUNCTION:
            function = (arg2 or "").lower()
            reason = NON_DETERMINISTIC_FUNCTIONS.get(function)
            if reason is not None:
                return self._refuse(
                    f"{function}() cannot be used in a write: {reason}, so replicas would diverge"
                )
            return apsw.SQLITE_OK
        if action in _DDL or action == apsw.SQLITE_ALTER_TABLE:
            names: tuple[str | None, ...] = (
                (arg2,) if action == apsw.SQLITE_ALTER_TABLE else (arg1, arg2)
            )
            for name in names:
                # a new object's name as the client wrote it; an existing object's as stored
                # (an upper-case one made before litecdc refused them may be renamed away)
                if name and (
                    _is_internal(name) or (action in _CREATE_OBJECT and is_internal_name(name))
                ):
                    if action == apsw.SQLITE_ANALYZE:
                        return self._refuse(
                            "ANALYZE without a table name would analyze litecdc's internal "
                            "tables, whose contents differ between replicas; name the tables "
                            "(ANALYZE t)"
                        )
                    return self._refuse(f"{name} is internal to litecdc and cannot be changed")
            self._on_schema_change()
            self._ddl_prepared = True
            if action in _TABLE_DDL and _is_user_object(names[0]):
                self._table_ddl.append((str(names[0]), action == apsw.SQLITE_ALTER_TABLE))
            if access is not None:
                access.schema = True
                access.writes.update(n for n in names if n and _is_user_object(n))
                if action in _CREATE and arg1:
                    access.created.add(arg1)
            return apsw.SQLITE_OK
        if action in _TEMP_DDL:
            return self._refuse(
                "temporary objects exist on one connection only and are not "
                "replicated; create a regular table instead"
            )
        if action in (apsw.SQLITE_CREATE_VTABLE, apsw.SQLITE_DROP_VTABLE):
            return self._refuse(
                "virtual tables are not supported: their row changes cannot be captured"
            )
        if action == apsw.SQLITE_PRAGMA:
            if (arg1 or "").lower() in _READ_ALL_PRAGMAS and access is not None:
                access.reads_everything = True
            reason = pragma_refusal(arg1 or "", arg2)
            return apsw.SQLITE_OK if reason is None else self._refuse(reason)
        if action in (apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT):
            if self.recording is not None:
                self.recording.refused_transaction_control = True
            return self._refuse(
                "transaction control statements are not allowed: each request "
                "is one transaction (use the transaction parameter to make it "
                "all-or-nothing)"
            )
        if action in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
            return self._refuse(
                "ATTACH and DETACH are not allowed: attached databases are not replicated"
            )
        return self._refuse(f"statement type {action} is not allowed in writes")


class ReadAuthorizer:
    """A reader connection's authorizer: reads only, and nothing that outlives the call.

    Transaction control, temporary objects, ATTACH and PRAGMA assignments would leave
    state on a connection that serves other requests later (a client's BEGIN would pin
    its snapshot forever), so they are refused; litecdc's own BEGIN for a
    ``transaction`` read runs under :meth:`trusted`.
    """

    def __init__(self) -> None:
        self._trusted = False
        #: why the last refused statement was refused
        self.reason: str | None = None

    @contextlib.contextmanager
    def trusted(self) -> Iterator[None]:
        self._trusted = True
        try:
            yield
        finally:
            self._trusted = False

    def _refuse(self, reason: str) -> int:
        self.reason = reason
        return apsw.SQLITE_DENY

    def __call__(
        self,
        action: int,
        arg1: str | None,
        arg2: str | None,
        database: str | None,
        trigger_or_view: str | None,
    ) -> int:
        if self._trusted:
            return apsw.SQLITE_OK
        if action in (apsw.SQLITE_TRANSACTION, apsw.SQLITE_SAVEPOINT):
            return self._refuse(
                "transaction control statements are not allowed in queries; use the "
                "transaction parameter to read in one transaction"
            )
        if action in (apsw.SQLITE_ATTACH, apsw.SQLITE_DETACH):
            return self._refuse(ATTACH_REFUSED_IN_QUERIES)
        if action in _TEMP_DDL:
            return self._refuse("temporary objects are not allowed in queries")
        if action == apsw.SQLITE_PRAGMA and (arg1 or "").lower() == "wal_checkpoint":
            # (a reader's connection is read-only: SQLite said "disk I/O error" — fuzz QA)
            return self._refuse(WAL_CHECKPOINT_REFUSED)
        if (
            action == apsw.SQLITE_PRAGMA
            and arg2 is not None
            and (arg1 or "").lower() not in _QUERY_PRAGMAS
        ):
            return self._refuse(
                f"PRAGMA {arg1} with a value changes connection state; only "
                "reading pragmas is allowed in queries"
            )
        return apsw.SQLITE_OK
