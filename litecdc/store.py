"""The store: what the HTTP API and the CLI call. One method per operation.

It joins the SQLite engine (``db/``) and the journal (``journal/``). All methods
are synchronous and thread-safe: writes are serialised on the one writer
connection, reads run concurrently on per-thread reader connections. Callers in
async code run them in a thread (``anyio.to_thread.run_sync``).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litecdc.config import NodeConfig
from litecdc.db import source
from litecdc.db.datafile import SQLITE_HEADER, file_creation_error
from litecdc.db.engine import LOAD_RACED, Engine
from litecdc.db.page_workers import PageWorkers
from litecdc.db.read_limit import ReadLimit
from litecdc.db.schema import (
    HOLDS_TABLE,
    advance_hold_sql,
    prune_sql,
    register_hold_sql,
    release_hold_sql,
)
from litecdc.errors import (
    ConfigError,
    LoadError,
    ModeError,
    NotFoundError,
    PositionUnavailableError,
    RequestError,
)
from litecdc.journal.journal import APPLIED_REVISION, Journal, Mode
from litecdc.results import (
    MAX_CID,
    MAX_SEQ,
    JournalPage,
    NodeStatus,
    ReadLevel,
    RowChange,
    Statement,
    StatementResult,
    WriteOutcome,
)
from litecdc.wire import subscriber_name_problem, to_ipc

log = logging.getLogger("litecdc.store")

MAX_PAGE = 10_000
#: bytes of stored SQL text (/journal) or images (/cdc/changes) past which a page ends
#: before its limit: a page is held in memory while it is answered (eight 50 MB rows took
#: the node from 330 MB to 1 GB), and limit=10000 of bulk writes' entries would be GBs
PAGE_BYTES = 16 * 1024 * 1024
#: journal entries deleted per write transaction when the journal is trimmed (an entry of
#: a bulk write may hold megabytes: writers wait for one batch)
JOURNAL_TRIM_BATCH = 1_000
#: … and SQL text bytes (past a batch's first entry): freeing an entry reads all of it
JOURNAL_TRIM_BATCH_BYTES = 16 * 1024 * 1024
#: the largest snapshot chunk / change page the pull source serves
MAX_SOURCE_PAGE = 1_000_000
MAX_PARTITIONS = 1024


@dataclass(frozen=True)
class Hold:
    """A pull subscriber's retention hold: the change log is kept after ``cid``."""

    name: str
    cid: int
    expired: bool


@dataclass(frozen=True)
class SubscriberList:
    holds: list[Hold]
    pruned_cid: int
    last_cid: int
    retention_cids: int
    #: the CDC webhook's high watermark; None when no CDC service ever recorded one
    webhook_hwm: int | None = None


def _check_subscriber_name(name: object) -> None:
    if (problem := subscriber_name_problem(name)) is not None:
        raise RequestError(problem)


#: held (flock) by the process whose node has the data directory open
DATA_DIR_LOCK = "litecdc.lock"


def _lock_data_dir(data_dir: Path) -> int:
    """Take the data directory for this process, or refuse: two nodes writing one
    database would both number commits from the same journal and break each other."""
    path = data_dir / DATA_DIR_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        # (config QA: an immutable directory or lock file ended the start with "cannot
        # start: [Errno 1] …", exit status 1)
        raise ConfigError(
            f"cannot use the data directory {data_dir}: {path} cannot be opened for writing "
            f"({exc.strerror or exc}); let the node's user write there, or start the node on "
            "another --data-dir"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"data directory {data_dir} is in use by another litecdc node (pid {holder}); "
            "each node needs a data directory of its own"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_database(db_path: Path) -> int | None:
    """Take the database file itself for this process (flock on the file the path leads
    to), or refuse. Config QA: a ``db.sqlite`` that is a symbolic link let a node whose
    directory lock was its own share another node's database; the first then failed
    every write (both numbered commits from one journal). None while the file does not
    exist (SQLite makes it; the caller locks it then); other problems with the path are
    the data file checks' to name."""
    try:
        # (non-blocking: a FIFO there must not hang the start; datafile refuses it)
        fd = os.open(db_path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"database {db_path} (the file {os.path.realpath(db_path)}) is in use by another "
            "litecdc node: each node needs a database of its own"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_files_can_be_made(data_dir: Path) -> None:
    """ConfigError unless a file can be made in ``data_dir``. Config QA: an immutable
    directory holding a -wal and -shm left by a crash opened, and every /db/backup was
    then a 500 (its copy is made there), the close a "disk I/O error" (SQLite could not
    end the WAL)."""
    exc = file_creation_error(data_dir)
    if exc is None:
        return
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise ConfigError(
            f"cannot use the data directory {data_dir}: the disk it is on is full "
            f"({exc.strerror}); free space there and start the node again"
        )
    raise ConfigError(
        f"cannot use the data directory {data_dir}: no file can be made there "
        f"({exc.strerror or exc}), where the node makes its backups' copies and SQLite "
        "the database's -wal and -shm files; let the node's user write there, or start "
        "the node on another --data-dir"
    )


#: runs of a SQLite file's load whose statements another write outdated (LOAD_RACED)
LOAD_ATTEMPTS = 5


class Store:
    """One node's replicated-SQLite state: data, journal and captured changes."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        data_dir = Path(config.data_dir)
        if data_dir.exists() and not data_dir.is_dir():
            raise ConfigError(f"data directory {data_dir} is a file, not a directory")
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the data directory {data_dir}: {exc.strerror or exc}"
            ) from None
        self._dir_lock = _lock_data_dir(Path(config.data_dir))
        # (kept open until the engine is closed: closing a descriptor of the database
        # would drop SQLite's POSIX locks on it)
        self._db_lock: int | None = None
        engine: Engine | None = None
        try:
            _check_files_can_be_made(data_dir)
            self._db_lock = _lock_database(Path(config.db_path))
            engine = Engine(
                config.db_path,
                synchronous=config.synchronous,
                foreign_keys=config.foreign_keys,
                # measured (bench_cluster.py, 3 nodes and etcd on 2 cores): small commits
                # on every node, no idle core for the thread: 16-client writes 1,008 ->
                # 882-912 txn/s with it. A standalone node's bulk writes gain ~10%.
                background_checkpoints=not config.clustered,
            )
            self.engine = engine
            if self._db_lock is None:  # made by SQLite just now
                self._db_lock = _lock_database(Path(config.db_path))
            self.journal = Journal(engine)
            self._page_workers = (
                PageWorkers(str(config.db_path), config.source_workers)
                if config.source_workers
                else None
            )
        except BaseException:
            # a failed open leaves nothing behind: no thread, no lock on the directory
            if engine is not None:
                engine.close()
            if self._db_lock is not None:
                os.close(self._db_lock)
            os.close(self._dir_lock)
            raise
        self._closed = False
        self._lock = threading.Lock()
        self._writer: Callable[[Sequence[Statement], bool], WriteOutcome] = self._commit_locally
        self._read_gate: Callable[[ReadLevel], None] | None = None
        self._internal_writer: Callable[[str], int] = lambda q: self.journal.commit_internal(q).cid

    # -- writes ---------------------------------------------------------------
    def execute(
        self, statements: Sequence[Statement], *, transaction: bool = False
    ) -> WriteOutcome:
        """Run write statements as one journaled commit (rqlite's /db/execute).

        Without ``transaction`` each statement succeeds or fails on its own and the
        failures are reported per statement; with it, the first failure rolls back
        the whole request. A read statement in the list returns its rows.
        """
        return self._writer(statements, transaction)

    def route_writes(self, writer: Callable[[Sequence[Statement], bool], WriteOutcome]) -> None:
        """Send writes somewhere else than this node's journal: a cluster node appends them
        to the log and answers once they are applied here (or raises NotLeaderError)."""
        self._writer = writer

    def _commit_locally(self, statements: Sequence[Statement], transaction: bool) -> WriteOutcome:
        return self.journal.commit(statements, transaction=transaction)

    def request(
        self,
        statements: Sequence[Statement],
        *,
        transaction: bool = False,
        level: ReadLevel = "weak",
        read_only: bool | None = None,
        limit: ReadLimit | None = None,
    ) -> WriteOutcome:
        """rqlite's unified /db/request: reads only → query path, else one journaled write.
        ``read_only``: what :meth:`is_read_only` answered for them, when already asked;
        ``limit``: when the reads must stop (:meth:`query`; writes run to the end)."""
        if read_only is None:
            read_only = self.is_read_only(statements)
        if read_only:
            results = self.query(statements, level=level, limit=limit)
            return WriteOutcome(results=results, read_only=True)
        return self.execute(statements, transaction=transaction)

    def is_read_only(
        self, statements: Sequence[Statement], limit: ReadLimit | None = None, *, run: bool = True
    ) -> bool:
        """Whether every statement only reads (what /db/request runs as a query); the
        earlier statements of a string of several run to tell, under ``limit`` — or,
        without ``run``, such a string counts as a write."""
        return all(self.engine.is_read_only(s, limit, run=run) for s in statements)

    def load(self, data: bytes) -> WriteOutcome:
        """rqlite's /db/load: a SQLite file replaces the database's contents, SQL text runs
        on it as it is (Engine.load_statements).

        Either is one journaled transaction, captured like any write (a replacement:
        deletes of every existing row, then the file's rows as inserts); LoadError when
        it fails, and then nothing changed.
        """
        for _ in range(LOAD_ATTEMPTS):
            statements = self.engine.load_statements(data)
            outcome = self.execute(statements, transaction=True)
            failed = [r.error for r in outcome.results if r.error]
            if not failed:
                return outcome
            if not data.startswith(SQLITE_HEADER) or LOAD_RACED not in failed[0]:
                what = "the SQLite file" if data.startswith(SQLITE_HEADER) else "the SQL text"
                hint = ""
                if data.startswith(SQLITE_HEADER) and "too big" in failed[0]:
                    # (scale QA: a 510 MB blob's row, as hex SQL text, passed SQLite's limit
                    # of 1,000,000,000 bytes a statement, and the error named nothing)
                    hint = (
                        " (a row of the file, written as SQL text for the journal — a blob "
                        "in hex, twice its size — is larger than SQLite's limit of "
                        "1,000,000,000 bytes a statement: values of about 500 MB and more "
                        "cannot be loaded)"
                    )
                raise LoadError(f"load: {what} failed: {failed[0]}{hint}")
            # another write changed the tables between the making of the statements
            # (which list them) and their run: nothing changed; made again
        raise LoadError(
            f"load: the database's tables changed while each of {LOAD_ATTEMPTS} attempts was "
            "prepared (other schema changes or loads ran meanwhile); nothing changed: load "
            "it again"
        )

    # -- reads ----------------------------------------------------------------
    def query(
        self,
        statements: Sequence[Statement],
        *,
        level: ReadLevel = "weak",
        transaction: bool = False,
        limit: ReadLimit | None = None,
    ) -> list[StatementResult]:
        """Run read-only statements on a reader connection (rqlite's /db/query); ``limit``
        stops them past a deadline or once cancelled (error ``query timeout``).

        A standalone node is always the leader, so every level reads local data that
        includes every acknowledged write. In a cluster, the read gate decides first:
        ``none`` reads locally anywhere, other levels need the leader (a follower raises
        NotLeaderError and the HTTP layer forwards), and ``linearizable`` has the leader
        confirm its leadership before reading.
        """
        if self._read_gate is not None:
            self._read_gate(level)
        return self.engine.query(statements, transaction=transaction, limit=limit)

    def route_reads(self, gate: Callable[[ReadLevel], None]) -> None:
        """Check every read's consistency level first (a cluster node's leadership rules)."""
        self._read_gate = gate

    def wait_for_cid(
        self, cid: int, timeout: float, given_up: Callable[[], bool] | None = None
    ) -> bool:
        """Block until this node has applied ``cid`` (read-your-writes on a follower);
        False after ``timeout`` or once ``given_up()`` (checked twice a second) says the
        reader is gone."""
        deadline = time.monotonic() + timeout
        while self.journal.available_snapshot() < cid:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (given_up is not None and given_up()):
                return False
            self.journal.wait_for_commit_after(self.journal.last_cid(), min(remaining, 0.5))
        return True

    def journal_page(self, after: int = 0, limit: int = 1000) -> JournalPage:
        """Journal entries with cid > ``after``, in cid order, plus the available snapshot."""
        if limit < 1 or limit > MAX_PAGE:
            raise RequestError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        entries, more, oldest = self.engine.journal_page(after, limit, PAGE_BYTES)
        return JournalPage(entries, self.journal.available_snapshot(), oldest, more)

    def changes(
        self, after: int = 0, limit: int = 1000, after_seq: int | None = None
    ) -> list[RowChange]:
        """Captured row changes after cid ``after`` (after change ``(after, after_seq)``
        when ``after_seq`` is given, to resume inside a transaction), in (cid, seq) order:
        ``limit`` of them, or fewer where PAGE_BYTES ended the page (see changes_page)."""
        return self.changes_page(after, limit, after_seq)[0]

    def changes_page(
        self, after: int = 0, limit: int = 1000, after_seq: int | None = None
    ) -> tuple[list[RowChange], bool]:
        """Captured row changes as :meth:`changes` gives them — at most ``limit`` and, past
        the first, PAGE_BYTES of stored images — and whether the page ended at a bound
        (more may follow: read on from its last change).

        Raises PositionUnavailableError (HTTP 410) when the change log was pruned past
        ``after``: an empty or short page would otherwise look like all there was.
        """
        if limit < 1 or limit > MAX_PAGE:
            raise RequestError(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
        if not 0 <= after <= MAX_CID:
            raise RequestError(f"after must be between 0 and {MAX_CID}, got {after}")
        if after_seq is not None and not 0 <= after_seq <= MAX_SEQ:
            raise RequestError(f"after_seq must be between 0 and {MAX_SEQ}, got {after_seq}")
        changes, more = self.engine.changes(after, limit, after_seq, PAGE_BYTES)
        # read after the page: pruning only moves forward, so one that raced it shows here
        pruned = self.engine.read_consistent(source.pruned_cid)
        if after < pruned:
            raise PositionUnavailableError(
                f"changes after cid {after} are no longer available: the change log was "
                f"pruned through cid {pruned} (changes the CDC service delivered, or every "
                "pull subscriber has read, or beyond --retention-cids); read on from "
                f"after={pruned}",
                pruned_cid=pruned,
            )
        return changes, more

    # -- the pull source (pipeline subscribers): holds, snapshot chunks, change ranges --------
    def route_internal_writes(self, writer: Callable[[str], int]) -> None:
        """Send litecdc's own writes (retention holds, pruning) through the leader's log;
        ``writer`` returns the entry's cid, or raises NotLeaderError on a follower."""
        self._internal_writer = writer

    def subscribers(self) -> SubscriberList:
        """The retention holds, the cid the change log is pruned through, and the head."""

        def read(conn: Any) -> SubscriberList:
            try:
                rows = conn.execute(
                    f"SELECT name, cid, expired FROM {HOLDS_TABLE} ORDER BY name"
                ).fetchall()
            except Exception:  # no holds table yet (apsw.SQLError)
                rows = []
            holds = [Hold(name, cid, bool(expired)) for name, cid, expired in rows]
            return SubscriberList(
                holds,
                source.pruned_cid(conn),
                source.head_cid(conn),
                self.config.retention_cids,
                source.webhook_hwm(conn),
            )

        return self.engine.read_consistent(read)

    def _hold(self, name: str) -> Hold:
        for hold in self.subscribers().holds:
            if hold.name == name:
                return hold
        raise NotFoundError(f"no subscriber {name!r} is registered on this node")

    def register_subscriber(self, name: str, cid: int | None = None) -> int:
        """Place (or restart) subscriber ``name``'s retention hold at the head; returns the
        cid of the registration, the subscriber's initial snapshot version.

        With ``cid``, the hold is placed there instead (a reader that starts after it: QA,
        a stream's ``starting_cid`` registered at the head let the node prune the changes
        it was about to read); PositionUnavailableError when they are gone already."""
        _check_subscriber_name(name)
        if cid is None:
            return self._internal_writer(
                register_hold_sql(name, self.config.retention_cids, webhook=self._webhook)
            )
        if not 0 <= cid <= MAX_CID:
            raise RequestError(f"cid must be between 0 and {MAX_CID}, got {cid}")
        before = self.subscribers()
        # (a follower's copy may lag: the leader, which the write goes to, judges)
        if self.journal.mode is not Mode.FOLLOWER:
            if cid > before.last_cid:
                raise RequestError(
                    f"cid {cid} is beyond the head of this node's journal (cid "
                    f"{before.last_cid}): a hold can only be placed on changes that exist"
                )
            # refused before anything is written (QA: the hold was written, expired at
            # once by the pruning of the same commit, and a live one so destroyed)
            self._check_hold_place(name, cid, before)
        self._internal_writer(
            register_hold_sql(name, self.config.retention_cids, webhook=self._webhook, cid=cid)
        )
        after = self.subscribers()  # (the write places it only if still allowed)
        if any(h.name == name and h.cid == cid and not h.expired for h in after.holds):
            return cid
        self._check_hold_place(name, cid, after)
        raise PositionUnavailableError(  # (a hold of the name placed since, concurrently)
            f"the hold of subscriber {name!r} was moved meanwhile; register it again",
            pruned_cid=after.pruned_cid,
        )

    def _check_hold_place(self, name: str, cid: int, subs: SubscriberList) -> None:
        """PositionUnavailableError unless a hold at ``cid`` keeps what follows it: the
        change log was not pruned through it, and it would not expire at once."""
        cap = self.config.retention_cids
        if cid < subs.pruned_cid:
            reason = (
                f"the change log was pruned through cid {subs.pruned_cid} (changes the CDC "
                "service delivered, or every pull subscriber has read, or beyond "
                "--retention-cids)"
            )
        elif cid < subs.last_cid - cap:
            reason = (
                f"it is more than --retention-cids ({cap}) commits behind the head (cid "
                f"{subs.last_cid}): a hold there would expire at once"
            )
        else:
            return
        raise PositionUnavailableError(
            f"cannot place the hold of subscriber {name!r} at cid {cid}: {reason}; register "
            "it at the head and take a new snapshot",
            pruned_cid=subs.pruned_cid,
        )

    def advance_subscriber(self, name: str, cid: int) -> Hold:
        """Move ``name``'s hold forward to ``cid``: changes up to it may be pruned."""
        _check_subscriber_name(name)
        if not 0 <= cid <= MAX_CID:
            raise RequestError(f"cid must be between 0 and {MAX_CID}, got {cid}")
        subs = self.subscribers()
        if cid > subs.last_cid:
            raise RequestError(
                f"cid {cid} is beyond the head of this node's journal (cid {subs.last_cid}): a "
                "subscriber can only have applied changes that exist"
            )
        hold = self._hold(name)
        if hold.expired:
            raise PositionUnavailableError(
                f"subscriber {name!r} fell more than {self.config.retention_cids} commits "
                "behind and its hold expired; register again and re-snapshot",
                pruned_cid=self.subscribers().pruned_cid,
            )
        if cid <= hold.cid and self.journal.mode is not Mode.FOLLOWER:
            # never back: nothing to write (each write is a commit, replicated). A follower
            # asks the leader still: its own copy may lag a release or an expiry (review)
            return hold
        self._internal_writer(
            advance_hold_sql(name, cid, self.config.retention_cids, webhook=self._webhook)
        )
        return self._hold(name)

    def release_subscriber(self, name: str) -> None:
        """Drop ``name``'s hold (unsubscribe): what only it kept may be pruned."""
        _check_subscriber_name(name)
        self._hold(name)
        self._internal_writer(
            release_hold_sql(name, self.config.retention_cids, webhook=self._webhook)
        )

    @property
    def _webhook(self) -> bool:
        """Whether this node runs the CDC webhook (its watermark then limits pruning)."""
        return self.config.cdc is not None

    def retention_due(self) -> bool:
        """Whether the retention cap calls for pruning: a hold to expire, or (with neither
        a webhook nor a hold) changes older than the cap.

        "A webhook" is this node's configuration, not a high watermark in the database: a
        webhook that has delivered nothing yet has none, and the cap must not delete what
        it still has to send; a webhook removed from the configuration leaves its
        watermark behind, and the cap must apply again.

        Pruning is itself a commit that moves the head, so the cap is enforced only once
        it is exceeded by a slack (a tenth of it): an idle node settles instead of pruning
        one more commit at every check.
        """
        subs = self.subscribers()
        floor = subs.last_cid - self.config.retention_cids
        if any(not h.expired and h.cid < floor for h in subs.holds):
            return True
        live = [h.cid for h in subs.holds if not h.expired]
        if live or self._webhook:
            return False  # the webhook and the holds prune as they move
        oldest = self.engine.read_consistent(source.oldest_change_cid)
        if oldest is None:
            return False
        slack = max(self.config.retention_cids // 10, 1)
        return bool(oldest <= floor - slack)

    def prune_changes(self) -> None:
        self._internal_writer(prune_sql(self.config.retention_cids, webhook=self._webhook))

    def trim_journal(self) -> int:
        """Delete the journal entries older than the newest ``journal_retention_cids``
        (none when it is 0), oldest first and a batch per write transaction, so writers
        wait for one batch at most. The entry at the available snapshot always stays.
        Each node trims its own journal: entries are not replicated state (the tables
        and the change log are), so nothing goes through the log. Returns how many went.
        """
        cap = self.config.journal_retention_cids
        if cap <= 0:
            return 0
        journal = self.journal
        through = min(journal.last_cid() - cap, journal.available_snapshot() - 1)
        deleted = 0
        while (first := journal.min_cid()) <= through:
            end = self.engine.journal_batch_end(
                first, through, JOURNAL_TRIM_BATCH, JOURNAL_TRIM_BATCH_BYTES
            )
            deleted += journal.truncate(end)
        return deleted

    def source_tables(self) -> list[str]:
        return self.engine.read_consistent(source.user_tables)

    def source_table(
        self, table: str, *, count_rows: bool = False
    ) -> tuple[source.SourceTable, int | None, int]:
        """(description, row count — only with ``count_rows``: it reads the whole table —,
        head cid) of ``table``."""

        def read(conn: Any) -> tuple[source.SourceTable, int | None, int]:
            spec = source.describe(conn, table)
            rows = source.approximate_rows(conn, spec) if count_rows else None
            return spec, rows, source.head_cid(conn)

        return self.engine.read_consistent(read)

    def source_splits(self, table: str, partitions: int) -> tuple[int, list[list[Any]]]:
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise RequestError(
                f"partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )

        def read(conn: Any) -> tuple[int, list[list[Any]]]:
            spec = source.describe(conn, table)
            return source.head_cid(conn), source.splits(conn, spec, partitions)

        return self.engine.read_consistent(read)

    def source_rows(
        self,
        table: str,
        after_key: list[Any] | None,
        until_key: list[Any] | None,
        limit: int,
    ) -> source.RowsPage:
        """A snapshot chunk: one read transaction, which it reports the cid of."""
        if not 1 <= limit <= MAX_SOURCE_PAGE:
            raise RequestError(f"limit must be between 1 and {MAX_SOURCE_PAGE}, got {limit}")
        return self.engine.read_consistent(
            lambda conn: source.read_rows(
                conn, source.describe(conn, table), after_key, until_key, limit
            )
        )

    def source_rows_ipc(
        self,
        table: str,
        after_key: list[Any] | None,
        until_key: list[Any] | None,
        limit: int,
    ) -> bytes:
        """A snapshot chunk as Arrow IPC bytes, built by a worker process when there are
        any (``source_workers``): parallel chunks then use every core."""
        if not 1 <= limit <= MAX_SOURCE_PAGE:
            raise RequestError(f"limit must be between 1 and {MAX_SOURCE_PAGE}, got {limit}")
        if self._page_workers is not None:
            spec = self.engine.read_consistent(lambda conn: source.describe(conn, table))
            data = self._page_workers.rows_ipc(spec, after_key, until_key, limit)
            if data is not None:
                return data
        return to_ipc(self.source_rows(table, after_key, until_key, limit).rows)

    def source_changes(
        self, table: str, after: int, until: int | None, limit: int
    ) -> source.ChangesPage:
        """The table's events after cid ``after`` (whole transactions, about ``limit``)."""
        self._check_cid_range(after, until, limit)
        return self.engine.read_consistent(
            lambda conn: source.read_table_changes(
                conn, source.describe(conn, table), after, until, limit
            )
        )

    def source_position(self, table: str, after: int, max_events: int) -> source.ChangePosition:
        """The next batch of at most ``max_events`` events after cid ``after``."""
        self._check_cid_range(after, None, max_events)
        return self.engine.read_consistent(
            lambda conn: source.change_position(
                conn, source.describe(conn, table), after, max_events
            )
        )

    @staticmethod
    def _check_cid_range(after: int, until: int | None, limit: int) -> None:
        if not 0 <= after <= MAX_CID:
            raise RequestError(f"after must be between 0 and {MAX_CID}, got {after}")
        if until is not None and not 0 <= until <= MAX_CID:
            raise RequestError(f"until must be between 0 and {MAX_CID}, got {until}")
        if not 1 <= limit <= MAX_SOURCE_PAGE:
            raise RequestError(f"limit must be between 1 and {MAX_SOURCE_PAGE}, got {limit}")

    # -- the change feed the CDC service reads (cdc.service.ChangeFeed) -------------------------
    def read_transactions(
        self,
        after: int,
        max_transactions: int,
        max_events: int | None = None,
        *,
        oversize_first: bool = True,
    ) -> tuple[list[RowChange], bool]:
        """Captured changes of whole transactions after cid ``after`` (see Engine)."""
        return self.engine.read_transactions(
            after, max_transactions, max_events, oversize_first=oversize_first
        )

    def next_transaction(self, after: int) -> tuple[int, int] | None:
        """(cid, number of changes) of the first transaction with changes after ``after``."""
        return self.engine.next_transaction(after)

    def transaction_changes(self, cid: int, after_seq: int, limit: int) -> list[RowChange]:
        """Up to ``limit`` changes of transaction ``cid`` after its change ``after_seq``."""
        return self.engine.transaction_changes(cid, after_seq, limit)

    def wait_for_commit_after(self, cid: int, timeout: float) -> bool:
        return self.journal.wait_for_commit_after(cid, timeout)

    def last_cid(self) -> int:
        return self.journal.last_cid()

    def cdc_high_watermark(self) -> int | None:
        return self.engine.cdc_high_watermark()

    def pruned_cid(self) -> int:
        """The cid the change log is pruned through (0 before anything was)."""
        return self.engine.read_consistent(source.pruned_cid)

    def queue_stats(self, after: int = 0) -> tuple[int, int | None]:
        """(captured changes stored after cid ``after``, the oldest one's cid)."""
        return self.engine.queue_stats(after)

    def backup(
        self, destination: str | os.PathLike[str], *, rollback_journal: bool = False
    ) -> None:
        """Write a consistent copy of the SQLite file (journal and changes included); with
        ``rollback_journal``, a DELETE journal mode copy instead of a WAL one."""
        self.engine.backup(str(destination), rollback_journal=rollback_journal)

    def restore_from(
        self,
        source: str | os.PathLike[str],
        *,
        min_applied_revision: int = 0,
        min_cid: int = 0,
    ) -> int:
        """Install a snapshot — another node's ``/db/backup`` of the same cluster — in place
        of this node's database, while it runs; returns the log revision it had applied.

        FOLLOWER mode only (a cluster node catching up). The file must hold an applied
        revision of at least ``min_applied_revision`` and a journal reaching ``min_cid``;
        it is verified before anything changes (Engine.restore_from) and the journal
        reloads its state from it. A founding node that has applied no log entry yet
        records no revision: its data counts as revision 0, asked for only by a node
        catching up with the cluster's founding data (``min_applied_revision`` 0).
        """
        if self.journal.mode is not Mode.FOLLOWER:
            raise ModeError(
                f"a snapshot is installed in FOLLOWER mode only, the journal is in "
                f"{self.journal.mode.value.upper()} mode"
            )

        def acceptable(state: dict[str, int], last_cid: int) -> None:
            revision = state.get(APPLIED_REVISION)
            if revision is None and not (min_applied_revision <= 0 < min_cid):
                raise LoadError(
                    "snapshot: it records no applied log revision (not taken on a cluster node)"
                )
            if (revision or 0) < min_applied_revision:
                raise LoadError(
                    f"snapshot: it has applied the log up to revision {revision}, "
                    f"revision {min_applied_revision} at least is needed"
                )
            if last_cid < min_cid:
                raise LoadError(
                    f"snapshot: its journal ends at cid {last_cid}, before the cluster's "
                    f"founding data (cid {min_cid})"
                )

        state = self.journal.reload_state(
            lambda: self.engine.restore_from(str(source), check=acceptable)
        )
        revision = state.get(APPLIED_REVISION, 0)
        log.info("installed a snapshot at log revision %d (cid %d)",
                 revision, self.journal.last_cid())  # fmt: skip
        return revision

    def dump_sql(self, tables: Sequence[str] | None = None) -> str:
        """The user tables — or ``tables`` only — as SQL text (rqlite's
        ``/db/backup?fmt=sql[&tables=a,b]``)."""
        return self.engine.dump_sql(tables)

    def status(self) -> NodeStatus:
        return NodeStatus(
            node_id=self.config.node_id,
            mode=self.journal.mode.value,
            data_dir=str(self.config.data_dir),
            db_path=str(self.config.db_path),
            db_size_bytes=self.engine.size_bytes(),
            last_cid=self.journal.last_cid(),
            available_snapshot=self.journal.available_snapshot(),
            journal_min_cid=self.journal.min_cid(),
            changes_queued=self.engine.changes_count(),
            sqlite_version=self.engine.sqlite_version,
            tables=self.engine.user_table_count(),
        )

    @property
    def mode(self) -> Mode:
        return self.journal.mode

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._page_workers is not None:
                self._page_workers.close()
            try:
                self.engine.close()
            finally:
                if self._db_lock is not None:
                    os.close(self._db_lock)
                os.close(self._dir_lock)
