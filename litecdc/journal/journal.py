"""The journal: every committed write as an ordered entry (cid, query, snapshot).

This is the "simpler leader/follower replication" design of SQLite's hctree
branch. The journal table starts with the record (1, '', 0). A node is in one of
three modes, held in memory only (a restarted node is in NORMAL mode):

* NORMAL   — plain writes (:meth:`Journal.commit`) are journaled automatically.
             A standalone node is always in this mode.
* LEADER   — plain writes are errors; writes go through :meth:`Journal.leader_commit`,
             which allocates the cid first and returns (cid, snapshot). A failure
             after allocation leaves the empty entry (query NULL, snapshot 0).
* FOLLOWER — only :meth:`Journal.follower_commit` writes: it applies a leader's entry
             at its cid, but never before the entry's snapshot is available.

NORMAL and LEADER need a contiguous journal (no gaps), since they allocate the
next cid. The *available snapshot* is the highest cid of the unbroken run of
cids that starts at the smallest cid in the journal.
"""

from __future__ import annotations

import enum
import functools
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from litecdc.db.access import Access
from litecdc.db.engine import Decision, Engine, failed_statement_text
from litecdc.db.schema import SCHEMA_OBJECT
from litecdc.db.sqltext import parse_template, render
from litecdc.errors import (
    DuplicateCidError,
    ModeError,
    SnapshotUnavailableError,
    StatementError,
    TruncateError,
)
from litecdc.results import JournalEntry, LogEntry, Statement, WriteOutcome

#: cid of the journal's initial record (1, '', 0): "the database before any entry".
INITIAL_CID = 1
#: node state key: the log position (etcd revision) of the last applied entry
APPLIED_REVISION = "applied_revision"

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BatchEnded:
    """apply_log_entries committed nothing: the entry at ``index`` ended the batch's SQLite
    transaction; ``outcome`` is its result (a failed write: an empty entry)."""

    index: int
    outcome: WriteOutcome


class _EntryEndedBatch(Exception):
    """Raised out of in_one_transaction by the entry whose statement ended it."""

    def __init__(self, outcome: WriteOutcome) -> None:
        super().__init__("a statement ended the batch's transaction")
        self.outcome = outcome


class Mode(enum.Enum):
    NORMAL = "normal"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class LeaderCommit:
    """What leader_commit returns: the allocated cid, its snapshot and the statement results."""

    cid: int
    snapshot: int
    outcome: WriteOutcome
    entry: JournalEntry


class Journal:
    """In-memory view of the journal table plus the rules for writing it."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self.mode = Mode.NORMAL
        low, high, available = engine.journal_bounds()
        self._min = low
        self._last = high
        self._available = available
        self._pending = set(engine.journal_cids_above(available))
        cids = engine.table_cids()
        #: last cid that wrote / read each table, view or index
        self._written = {name: written for name, (written, _) in cids.items() if written}
        self._read = {name: read for name, (_, read) in cids.items() if read}
        self._schema_cid = self._written.pop(SCHEMA_OBJECT, INITIAL_CID)
        #: notified after every commit, for readers that follow the journal (CDC)
        self._committed = threading.Condition()
        #: highest cid handed out by prepare_entry (a leader's entries in flight)
        self._allocated = self._last
        self._allocation_lock = threading.Lock()

    def reload_state(self, install: Callable[[], T]) -> T:
        """Run ``install()`` (which replaced the database, e.g. Engine.restore_from) under
        the journal's lock, then re-read everything this object keeps in memory from the
        new database. The mode stays as it is. Returns what ``install`` returned."""
        with self._lock:
            result = install()
            low, high, available = self._engine.journal_bounds()
            self._min, self._last, self._available = low, high, available
            self._pending = set(self._engine.journal_cids_above(available))
            cids = self._engine.table_cids()
            self._written = {name: written for name, (written, _) in cids.items() if written}
            self._read = {name: read for name, (_, read) in cids.items() if read}
            self._schema_cid = self._written.pop(SCHEMA_OBJECT, INITIAL_CID)
            self._allocated = self._last
        with self._committed:
            self._committed.notify_all()
        return result

    # -- facts ------------------------------------------------------------------------
    def available_snapshot(self) -> int:
        """Highest cid of the unbroken run of cids from the smallest one in the journal."""
        return self._available

    def last_cid(self) -> int:
        return self._last

    def min_cid(self) -> int:
        return self._min

    def is_contiguous(self) -> bool:
        return self._available == self._last

    # -- modes --------------------------------------------------------------------------
    def set_mode(self, mode: Mode) -> None:
        """Switch mode. NORMAL and LEADER allocate cids, so they need a journal without gaps."""
        with self._lock:
            if mode is not Mode.FOLLOWER and not self.is_contiguous():
                raise ModeError(
                    f"cannot switch to {mode.value.upper()} mode: the journal has gaps "
                    f"(available snapshot {self._available}, last cid {self._last}); "
                    "apply the missing entries first"
                )
            self.mode = mode

    def _require_contiguous(self) -> None:
        """A new cid is allocated only over a journal without gaps (a restarted follower
        comes back in NORMAL mode but must not write until its gaps are filled)."""
        if not self.is_contiguous():
            raise ModeError(
                f"cannot commit: the journal has gaps (available snapshot {self._available}, "
                f"last cid {self._last}); apply the missing entries in FOLLOWER mode first"
            )

    # -- the dependency rule --------------------------------------------------------------
    def snapshot_for(self, access: Access, cid: int) -> int:
        """The cid a transaction depends on (its hctree "snapshot").

        Rule — the largest of:

        * the last cid that **wrote** any table, view or index the transaction reads or
          writes (it must see that write);
        * the last cid that **read** any table the transaction writes (that reader must
          not see this write: a replica may not run it first);
        * the last schema change (every statement is prepared against the schema) or
          other barrier (below) — and the last internal entry, which counts as one:
          litecdc's own entries (CDC high watermark, retention holds, pruning) read the
          journal's head, so they are barriers that no later transaction may overtake on
          a replica.

        A schema change, a transaction that reads ``sqlite_sequence`` or every table at
        once (``foreign_key_check``), and one that writes ``sqlite_sequence`` (read by
        every later AUTOINCREMENT insert without the authorizer saying so) are barriers:
        they depend on ``cid - 1`` (everything before them) and everything after depends on
        them.
        Objects never touched through the journal count as the initial record. A replica
        may apply the transaction as soon as its snapshot is available, in any order
        relative to transactions it does not depend on.
        """
        if access.barrier:
            return cid - 1
        snapshot = self._schema_cid
        written, read = self._written, self._read
        for name in access.reads | access.writes:
            snapshot = max(snapshot, written.get(name, INITIAL_CID))
        for name in access.writes:
            snapshot = max(snapshot, read.get(name, INITIAL_CID))
        return min(snapshot, cid - 1)

    def _record(self, cid: int, access: Access) -> None:
        """Update the in-memory view after ``cid`` was committed."""
        if access.barrier:
            # every later entry depends on a barrier, and it on everything before: no name's
            # cids can outweigh it in a snapshot any more, so none are kept (soak QA: every
            # name ever used stayed, here and in _litecdc_table_cids)
            # (only cids up to its own: one above it could only come from entries recorded
            # out of dependency order, which nothing does — not relied on, review)
            self._written = {name: c for name, c in self._written.items() if c > cid}
            self._read = {name: c for name, c in self._read.items() if c > cid}
            self._schema_cid = max(self._schema_cid, cid)
        else:
            for name in access.writes:
                if self._written.get(name, 0) < cid:
                    self._written[name] = cid
            for name in access.reads:
                if self._read.get(name, 0) < cid:
                    self._read[name] = cid
        self._last = max(self._last, cid)
        if cid == self._available + 1:
            self._available = cid
            while self._available + 1 in self._pending:
                self._available += 1
                self._pending.discard(self._available)
        else:
            self._pending.add(cid)
        with self._committed:
            self._committed.notify_all()

    def wait_for_commit_after(self, cid: int, timeout: float) -> bool:
        """Block until the journal holds a cid above ``cid`` (True) or ``timeout`` passes."""
        with self._committed:
            return self._committed.wait_for(lambda: self._last > cid, timeout)

    # -- writes -----------------------------------------------------------------------------
    def commit(self, statements: Sequence[Statement], *, transaction: bool = False) -> WriteOutcome:
        """A plain write (NORMAL mode): run, journal and capture as one commit.

        Nothing is journaled when nothing is committed, and no cid is used up.
        """
        with self._lock:
            if self.mode is not Mode.NORMAL:
                raise ModeError(
                    f"plain writes are not allowed in {self.mode.value.upper()} mode; "
                    + (
                        "use leader_commit"
                        if self.mode is Mode.LEADER
                        else "this node only applies the leader's entries"
                    )
                )
            self._require_contiguous()
            return self._run(statements, transaction, self._last + 1).outcome

    def leader_commit(
        self, statements: Sequence[Statement], *, transaction: bool = False
    ) -> LeaderCommit:
        """LEADER mode: allocate the next cid, run, and return (cid, snapshot).

        If the transaction commits nothing, the cid is still used: the journal gets
        the empty entry (query NULL, snapshot 0), which followers receive too.
        """
        with self._lock:
            if self.mode is not Mode.LEADER:
                raise ModeError(
                    f"leader_commit needs LEADER mode, the journal is in "
                    f"{self.mode.value.upper()} mode"
                )
            self._require_contiguous()
            cid = self._last + 1
            ran = self._run(statements, transaction, cid)
            if ran.entry is None:
                entry = JournalEntry(cid, None, 0, ran.timestamp_ms, ran.seed)
                self._engine.write_empty_entry(cid, ran.timestamp_ms, ran.seed)
                self._record(cid, Access())
                return LeaderCommit(cid, 0, ran.outcome, entry)
            return LeaderCommit(cid, ran.entry.snapshot, ran.outcome, ran.entry)

    def commit_internal(self, query: str) -> JournalEntry:
        """litecdc's own write (CDC state, pruning) as an internal journal entry.

        NORMAL mode only: a cluster leader appends internal entries through its log
        like any other write. The entry depends on everything before it.
        """
        with self._lock:
            if self.mode is not Mode.NORMAL:
                raise ModeError(
                    f"internal writes go through the log in {self.mode.value.upper()} mode"
                )
            self._require_contiguous()
            cid = self._last + 1

            def decide(access: Access) -> Decision:
                return Decision(cid, self.snapshot_for(access, cid))

            entry = self._engine.run_internal(
                query, timestamp_ms=time.time_ns() // 1_000_000, seed=0, decide=decide
            )
            # a barrier: every later entry depends on it (see Engine.run_internal)
            self._record(cid, Access(schema=True))
            return entry

    # -- the cluster's log (LogEntry): the leader prepares, every node applies ---------------
    def prepare_entry(
        self, statements: Sequence[Statement], *, transaction: bool = False
    ) -> LogEntry:
        """LEADER mode: allocate the next cid for a write and describe it for the log.

        Nothing runs here: the entry goes to the log, and every node (this one too)
        runs it with :meth:`apply_log_entry`. Parameters are written into each
        statement's text as exact literals. The snapshot is ``cid - 1``: entries are
        applied in log order, and read/write sets of statements that depend on earlier
        statements of the same request cannot be known before they run.
        """
        return self._allocate(
            tuple(map(_log_text, statements)), transaction=transaction, internal=False
        )

    def prepare_internal(self, query: str) -> LogEntry:
        """LEADER mode: allocate the next cid for litecdc's own write (CDC state, pruning)."""
        return self._allocate((query,), transaction=True, internal=True)

    def _allocate(self, texts: tuple[str, ...], *, transaction: bool, internal: bool) -> LogEntry:
        # its own lock: the journal lock is held while applied entries commit (an fsync),
        # and new writes must not queue behind that
        with self._allocation_lock:
            if self.mode is not Mode.LEADER:
                raise ModeError(
                    f"only the leader prepares log entries; the journal is in "
                    f"{self.mode.value.upper()} mode"
                )
            self._allocated = max(self._allocated, self._last) + 1
            cid = self._allocated
            return LogEntry(
                cid,
                cid - 1,
                time.time_ns() // 1_000_000,
                secrets.randbits(63),
                texts,
                transaction,
                internal,
            )

    def forget_allocations(self) -> None:
        """A leader whose appends failed (or a new leader) allocates again from the journal."""
        with self._allocation_lock:
            self._allocated = self._last

    def apply_log_entry(self, entry: LogEntry, *, revision: int | None = None) -> WriteOutcome:
        """Run a log entry at its cid (LEADER or FOLLOWER mode), as every node does.

        Like follower_commit: refuses a cid the journal has and an unavailable snapshot.
        A request that commits nothing still uses its cid: the journal records the empty
        entry. ``revision`` (the log position) is stored as ``applied_revision`` in the
        same SQLite transaction, so a restart neither skips nor repeats an entry.
        """
        with self._lock:
            self._check_applicable([entry])
            state = {APPLIED_REVISION: revision} if revision is not None else None
            outcome, access = self._execute_entry(entry, state)
            self._record(entry.cid, access)
            return outcome

    def apply_log_entries(
        self, entries: Sequence[LogEntry], *, revision: int
    ) -> list[WriteOutcome] | BatchEnded | None:
        """Apply consecutive log entries (one watch batch) in ONE SQLite transaction: one
        fsync for the batch instead of one per entry, with ``revision`` stored once.

        Each entry still runs alone (a savepoint each): its failure becomes its empty
        entry and touches no other. When a statement ends the whole SQLite transaction
        (``OR ROLLBACK``, the write step limit) nothing is committed: the answer is then
        BatchEnded, naming that entry and its outcome, so that the caller applies the
        entries before it again and records this one with :meth:`record_failed_entry`
        instead of running it a second time (a statement stopped at the step limit ran
        ~100 s); None when the batch ended otherwise (the caller goes one by one).
        """
        with self._lock:
            self._check_applicable(entries)
            running = 0  # the index of the entry that runs

            def step(index: int, entry: LogEntry) -> tuple[WriteOutcome, Access]:
                nonlocal running
                running = index
                return self._execute_entry(entry, None, in_batch=True)

            steps = [functools.partial(step, i, entry) for i, entry in enumerate(entries)]
            try:
                done = self._engine.in_one_transaction(steps, {APPLIED_REVISION: revision})
            except _EntryEndedBatch as ended:
                return BatchEnded(running, ended.outcome)
            if done is None:
                return None
            for entry, (_, access) in zip(entries, done, strict=True):
                self._record(entry.cid, access)
            return [outcome for outcome, _ in done]

    def _check_applicable(self, entries: Sequence[LogEntry]) -> None:
        """Refuse entries the journal has, or whose snapshot is not available (counting the
        entries before them in ``entries``)."""
        if self.mode is Mode.NORMAL:
            raise ModeError("log entries are applied in LEADER or FOLLOWER mode")
        available = self._available
        for entry in entries:
            if entry.cid <= available or entry.cid in self._pending:
                raise DuplicateCidError(f"the journal already has cid {entry.cid}")
            if entry.snapshot > available:
                raise SnapshotUnavailableError(entry.snapshot, available)
            if entry.cid == available + 1:
                available = entry.cid

    def record_failed_entry(
        self, entry: LogEntry, outcome: WriteOutcome, *, revision: int
    ) -> WriteOutcome:
        """Record ``entry`` as the empty entry a BatchEnded found it to be, without running
        it again: run alone on the same data, its statements fail at the same step."""
        with self._lock:
            self._check_applicable([entry])
            self._engine.write_empty_entry(
                entry.cid, entry.timestamp_ms, entry.seed, state={APPLIED_REVISION: revision}
            )
            self._record(entry.cid, Access())
            return outcome

    def _execute_entry(
        self, entry: LogEntry, state: dict[str, int] | None, *, in_batch: bool = False
    ) -> tuple[WriteOutcome, Access]:
        """Run one log entry at its cid; the caller records it once it is committed."""

        def fixed(access: Access) -> Decision:
            return Decision(entry.cid, entry.snapshot)

        if entry.internal:
            self._engine.run_internal(
                "\n".join(entry.statements),
                timestamp_ms=entry.timestamp_ms,
                seed=entry.seed,
                decide=fixed,
                state=state,
            )
            return WriteOutcome([], entry.cid, entry.snapshot), Access(schema=True)
        run = self._engine.run_write(
            [Statement(text) for text in entry.statements],
            transaction=entry.transaction,
            timestamp_ms=entry.timestamp_ms,
            seed=entry.seed,
            decide=fixed,
            state=state,
        )
        if run.entry is None:
            if in_batch and self._engine.batch_ended:
                raise _EntryEndedBatch(WriteOutcome(run.results, None, None))
            self._engine.write_empty_entry(entry.cid, entry.timestamp_ms, entry.seed, state=state)
            return WriteOutcome(run.results, None, None), Access()
        return WriteOutcome(run.results, entry.cid, entry.snapshot), run.access

    def applied_revision(self) -> int:
        """The log position of the last entry applied (0 before any)."""
        return self._engine.node_state(APPLIED_REVISION) or 0

    def follower_commit(self, entry: JournalEntry) -> bool:
        """FOLLOWER mode: apply the leader's entry at its cid. Returns whether its SQL ran.

        Refuses (SnapshotUnavailableError) to run before ``entry.snapshot`` is
        available, and refuses a cid the journal already holds. An entry whose SQL
        fails is recorded as the empty entry, exactly as on the leader; an error of this
        node's environment (disk full, I/O) records nothing and is raised, so the entry
        can be applied again once the cause is gone.
        """
        with self._lock:
            if self.mode is not Mode.FOLLOWER:
                raise ModeError(
                    f"follower_commit needs FOLLOWER mode, the journal is in "
                    f"{self.mode.value.upper()} mode"
                )
            if entry.cid <= self._available or entry.cid in self._pending:
                raise DuplicateCidError(f"the journal already has cid {entry.cid}")
            if entry.snapshot > self._available:
                raise SnapshotUnavailableError(entry.snapshot, self._available)
            ok, access = self._engine.apply_entry(entry)
            self._record(entry.cid, access)
            return ok

    def _run(self, statements: Sequence[Statement], transaction: bool, cid: int) -> _Ran:
        timestamp_ms = time.time_ns() // 1_000_000
        seed = secrets.randbits(63)

        def decide(access: Access) -> Decision:
            return Decision(cid, self.snapshot_for(access, cid))

        run = self._engine.run_write(
            statements, transaction=transaction, timestamp_ms=timestamp_ms, seed=seed, decide=decide
        )
        if run.entry is not None:
            self._record(run.entry.cid, run.access)
        outcome = WriteOutcome(
            run.results,
            run.entry.cid if run.entry else None,
            run.entry.snapshot if run.entry else None,
        )
        return _Ran(outcome, run.entry, timestamp_ms, seed)

    # -- truncation ---------------------------------------------------------------------------
    def truncate(self, through_cid: int) -> int:
        """Delete entries with cid <= ``through_cid``, oldest first. Returns how many.

        Only the unbroken run from the smallest cid can be truncated, and the entry
        at the available snapshot always stays, so the journal is never empty and
        cid order is never broken.
        """
        with self._lock:
            if through_cid >= self._available:
                raise TruncateError(
                    f"cannot truncate through cid {through_cid}: entries up to the available "
                    f"snapshot {self._available} may be truncated, and that entry stays, so "
                    f"the limit is {self._available - 1}"
                )
            if through_cid < self._min:
                return 0
            deleted = self._engine.delete_journal_through(through_cid)
            self._min = through_cid + 1
            return deleted


@dataclass(frozen=True, slots=True)
class _Ran:
    outcome: WriteOutcome
    entry: JournalEntry | None
    timestamp_ms: int
    seed: int


def _log_text(statement: Statement) -> str:
    """A statement as a log entry holds it: its SQL with the parameters written in. One
    whose parameters do not fit it (too few, named for ``?``) becomes a statement failing
    with that reason on every node — in its place, so the request's others run (or, in a
    transaction, are rolled back) as on a standalone node, which reports it per
    statement (determinism QA: a cluster failed the whole request with a 400)."""
    try:
        return (
            render(statement.sql, statement.params).rstrip()
            + parse_template(statement.sql).terminator
        )
    except StatementError as exc:
        return failed_statement_text(str(exc))
