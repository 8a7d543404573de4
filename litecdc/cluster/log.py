"""The cluster's log in etcd: the leader's group commit and every node's apply loop.

Each write is one key, ``/litecdc/<cluster>/log/<cid, 20 digits>``, whose value is the
:class:`~litecdc.results.LogEntry` (msgpack). Keys sort in cid order.

* :class:`LogAppender` (the leader only) takes whatever callers queued while the previous
  etcd txn was in flight and appends it in ONE txn (at most 127 entries — etcd allows 128
  compares and every key has one, plus the fence — and less than 1.5 MiB), guarded by
  ``Compare.created_at(leader_key, fence_revision)`` and by every key being absent. A
  failed guard means another leader exists: the node steps down and the waiting writes
  fail with :class:`~litecdc.errors.NotLeaderError`. A timed-out txn is ambiguous: the
  appender sends the *same* txn again until etcd answers — its guards make it succeed at
  most once, and the failure branch reads the first key back, so "already appended by the
  earlier attempt" is recognised by the entry's bytes (each entry carries its own seed
  and timestamp).
* :class:`ApplyLoop` (every node, the leader too) watches the log prefix from the
  journal's applied revision and applies entries in cid order with
  :meth:`Journal.apply_log_entry`, which stores the entry's etcd revision in the same
  SQLite transaction. All entries of one group commit share one revision, so after a
  restart the loop watches *from* the applied revision (not after it) and skips the cids
  the journal already has.

Usage (what :class:`litecdc.cluster.node.ClusterNode` does)::

    appender = LogAppender(client, journal, "c1", step_down=election.step_down).start()
    loop = ApplyLoop(client, journal, "c1").start()
    appender.open(election.fence_revision, journal.last_cid() + 1)   # after catching up

    def prepare() -> LogEntry:                  # runs under the appender's lock, so
        entry = journal.prepare_entry(stmts)     # entries enter the log in cid order
        loop.expect(entry)
        return entry

    submission = appender.submit(prepare)
    revision = submission.result(timeout=10)      # committed in etcd
    outcome = loop.wait_applied(submission.entry, timeout=10)        # applied here
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import apsw
import msgspec

from litecdc.cluster.election import leader_key
from litecdc.cluster.etcd import (
    ClusterError,
    CompactedError,
    Compare,
    EtcdClient,
    EtcdUnavailableError,
    Get,
    KeyValue,
    Put,
    Watch,
)
from litecdc.errors import (
    DuplicateCidError,
    LitecdcError,
    NotLeaderError,
    RequestError,
    SnapshotUnavailableError,
)
from litecdc.journal.journal import BatchEnded, Journal
from litecdc.results import LogEntry, WriteOutcome

log = logging.getLogger("litecdc.cluster")

#: etcd's default limit of operations (and of compares) in one txn (--max-txn-ops)
MAX_TXN_OPS = 128
#: etcd's default limit of one request's size (--max-request-bytes), 1.5 MiB
MAX_REQUEST_BYTES = 1536 * 1024
#: bytes of each txn kept for the request's framing and the fence compare
TXN_BYTES_MARGIN = 16 * 1024
#: default seconds the appender keeps re-sending a txn whose outcome is unknown
DEFAULT_AMBIGUOUS_TIMEOUT = 30.0
#: default pause between attempts after an etcd error, seconds
DEFAULT_RETRY_INTERVAL = 0.5
#: default seconds of silence on the log watch before asking etcd for a progress report
#: (and, if that goes unanswered as long, watching again — possibly through another member)
DEFAULT_QUIET_INTERVAL = 5.0
#: default pause before the apply loop tries again after it could not apply an entry
DEFAULT_STALL_RETRY_INTERVAL = 2.0


def log_prefix(cluster: str) -> str:
    return f"/litecdc/{cluster}/log/"


def log_key(cluster: str, cid: int) -> str:
    """The etcd key of the entry with ``cid``: the cid zero-padded to 20 digits."""
    return f"{log_prefix(cluster)}{cid:020d}"


def _txn_cost(key: str, data: bytes) -> int:
    """Bytes one entry adds to a txn: its put and its "absent" compare, with some framing."""
    return len(data) + 2 * len(key) + 32


@dataclass(slots=True)
class LogWriteOutcome(WriteOutcome):
    """A write's outcome on a cluster node: the journal's results plus where it is in the log.

    ``cid`` keeps the journal's meaning (None when nothing was committed); ``log_cid`` is the
    cid the entry used in the log either way (an entry that committed nothing is recorded
    as the empty entry for it), and ``revision`` the etcd revision of its log key.
    """

    log_cid: int = 0
    revision: int = 0

    @property
    def raft_index(self) -> int | None:
        """The entry's cid in the log, committed or not: a write whose statements all
        failed still took its place (rqlite's raft_index is there for every write)."""
        return self.log_cid or self.cid


# --- the leader's group commit -----------------------------------------------------------


@dataclass(slots=True)
class Submission:
    """One entry queued for the log. :meth:`result` is its etcd revision once appended."""

    entry: LogEntry
    data: bytes
    future: Future[int] = field(default_factory=Future)
    #: set when the entry could not go to the log as asked (too large): the empty entry
    #: took its cid, and the caller gets this error once that is appended
    refused: LitecdcError | None = None

    def result(self, timeout: float | None = None) -> int:
        """The etcd revision of the entry's key. Raises NotLeaderError when it was not
        appended (safe to retry elsewhere), EtcdUnavailableError when its fate is unknown,
        ``concurrent.futures.TimeoutError`` after ``timeout``."""
        return self.future.result(timeout)


class LogAppender:
    """The leader's group commit: queued entries go to etcd in as few txns as possible.

    ``step_down(reason)`` is called when a guarded append proves another leader exists, or
    when the outcome of an append stays unknown (Election.step_down).
    """

    def __init__(
        self,
        client: EtcdClient,
        journal: Journal,
        cluster: str,
        *,
        step_down: Callable[[str], None],
        max_entries: int = MAX_TXN_OPS - 1,
        max_bytes: int = MAX_REQUEST_BYTES - TXN_BYTES_MARGIN,
        ambiguous_timeout: float = DEFAULT_AMBIGUOUS_TIMEOUT,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
    ) -> None:
        self.client = client
        self.journal = journal
        self.cluster = cluster
        self.max_entries = max(1, min(max_entries, MAX_TXN_OPS - 1))
        self.max_bytes = max_bytes
        self.ambiguous_timeout = ambiguous_timeout
        self.retry_interval = retry_interval
        self._step_down = step_down
        self._leader_key = leader_key(cluster)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: deque[Submission] = deque()
        self._fence: int | None = None
        self._next_cid = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        #: etcd txns that appended entries, entries appended, appends refused by the fence
        self.txns = 0
        self.entries = 0
        self.fenced = 0

    # -- leadership ---------------------------------------------------------------------------

    def open(self, fence_revision: int, next_cid: int) -> None:
        """Accept entries, guarded by ``fence_revision``; the first must be ``next_cid``."""
        with self._lock:
            if self._closed:
                raise NotLeaderError("the log appender is closed")
            self._fence = fence_revision
            self._next_cid = next_cid

    def close_leadership(self, reason: str) -> None:
        """Stop accepting entries; queued ones fail with NotLeaderError. A txn already sent
        completes (its guard decides), and its entries are applied like any other."""
        with self._lock:
            self._fence = None
            dropped = list(self._queue)
            self._queue.clear()
        _fail(dropped, NotLeaderError(f"not appended to the log: {reason}"))

    @property
    def accepting(self) -> bool:
        with self._lock:
            return self._fence is not None and not self._closed

    # -- callers ------------------------------------------------------------------------------

    def submit(self, prepare: Callable[[], LogEntry]) -> Submission:
        """Queue the entry ``prepare()`` returns (it is called under the appender's lock,
        so cids are allocated in the order entries enter the log).

        Raises NotLeaderError when this node does not lead. An entry larger than etcd takes
        in one request is replaced by the empty entry for its cid (the cid is already
        allocated) and its submission fails with RequestError once that is appended.
        """
        with self._lock:
            if self._closed or self._fence is None:
                raise NotLeaderError("this node is not the leader")
            entry = prepare()
            if entry.cid != self._next_cid:
                raise ClusterError(
                    f"log entry for cid {entry.cid} submitted out of order (expected cid "
                    f"{self._next_cid}): entries must be prepared through submit()"
                )
            key = log_key(self.cluster, entry.cid)
            data = entry.encode()
            submission = Submission(entry, data)
            if _txn_cost(key, data) > self.max_bytes:
                empty = LogEntry(entry.cid, entry.snapshot, entry.timestamp_ms, entry.seed, ())
                submission = Submission(
                    empty,
                    empty.encode(),
                    refused=RequestError(
                        f"the write is too large for the cluster's log ({len(data)} bytes "
                        f"encoded; etcd takes at most {self.max_bytes} per request): split it "
                        "into smaller writes (a SQLite file's /db/load cannot be split: start "
                        "a node on a data directory holding the file as db.sqlite, and it "
                        "founds a new cluster with that data — docs/cluster.md)"
                    ),
                )
            self._next_cid += 1
            self._queue.append(submission)
            self._wake.notify()
            return submission

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> LogAppender:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"litecdc-log-appender {self.cluster}", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            self._closed = True
            self._fence = None
            dropped = list(self._queue)
            self._queue.clear()
            self._wake.notify_all()
        _fail(dropped, NotLeaderError("not appended to the log: the node is closing"))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the appender thread -------------------------------------------------------------------

    def _take(self) -> tuple[list[Submission], int | None] | None:
        """The next batch (≤ max_entries, < max_bytes) and the fence; None once closed."""
        with self._wake:
            while not self._queue and not self._closed:
                self._wake.wait()
            if self._closed:
                return None
            batch: list[Submission] = []
            size = 0
            while self._queue and len(batch) < self.max_entries:
                head = self._queue[0]
                cost = _txn_cost(log_key(self.cluster, head.entry.cid), head.data)
                if batch and size + cost > self.max_bytes:
                    break
                batch.append(self._queue.popleft())
                size += cost
            return batch, self._fence

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, fence = taken
            if fence is None:  # leadership went between submit and here
                _fail(batch, NotLeaderError("not appended to the log: leadership lost"))
                continue
            try:
                self._append(batch, fence)
            except Exception as exc:
                log.exception("log append failed unexpectedly")
                self._lost(batch, fence, f"log append failed: {exc}", unknown=True)

    def _append(self, batch: list[Submission], fence: int) -> None:
        keys = [log_key(self.cluster, s.entry.cid) for s in batch]
        compare = [Compare.created_at(self._leader_key, fence)]
        compare += [Compare.absent(key) for key in keys]
        success = [Put(key, s.data) for key, s in zip(keys, batch, strict=True)]
        failure = [Get(self._leader_key), Get(keys[0])]
        deadline = time.monotonic() + self.ambiguous_timeout
        while True:
            try:
                result = self.client.txn(compare, success, failure)
                break
            except EtcdUnavailableError as exc:
                # Ambiguous: the txn may have been applied. Sending it again is safe: its
                # guards let at most one attempt succeed, and the failure branch reads the
                # first key back, so an earlier success is recognised below.
                if time.monotonic() >= deadline or self._is_closed() or self._term_over(fence):
                    # (a term that ended — this node's next one may have begun — needs no
                    # answer: its take-over read the log as it is; the queue is the new
                    # term's, waiting behind this txn: cluster QA, 10 s of failed writes)
                    self._lost(batch, fence, f"the outcome of a log append is unknown: {exc}",
                               unknown=True)  # fmt: skip
                    return
                log.warning("log append of cids %d-%d: %s; sending it again",
                            batch[0].entry.cid, batch[-1].entry.cid, exc)  # fmt: skip
                time.sleep(self.retry_interval)
            except ClusterError as exc:  # refused (NOSPACE, permissions…): nothing appended
                self._lost(batch, fence, f"etcd refused the log append: {exc}", error=exc)
                return
        if result.succeeded:
            self._appended(batch, result.revision)
            return
        leader = result.ranges[0] if result.ranges else []
        first = result.ranges[1] if len(result.ranges) > 1 else []
        if first and first[0].value == batch[0].data:
            self._appended(batch, first[0].mod_revision)  # an earlier attempt went through
            return
        if first:
            reason = f"the log already holds another entry for cid {batch[0].entry.cid}"
        elif not leader:
            reason = "the leader key is gone (lease lost)"
        else:
            reason = (
                f"the leader key was created again at revision {leader[0].create_revision} "
                f"(this node's fence is {fence})"
            )
        with self._lock:
            self.fenced += 1
        self._lost(batch, fence, f"log append refused: {reason}")

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def _term_over(self, fence: int) -> bool:
        """Whether the term that took a batch under ``fence`` has ended."""
        with self._lock:
            return self._fence != fence

    def _appended(self, batch: list[Submission], revision: int) -> None:
        with self._lock:
            self.txns += 1
            self.entries += len(batch)
        for submission in batch:
            if submission.refused is not None:
                submission.future.set_exception(submission.refused)
            else:
                submission.future.set_result(revision)

    def _lost(
        self,
        batch: list[Submission],
        fence: int,
        reason: str,
        *,
        unknown: bool = False,
        error: LitecdcError | None = None,
    ) -> None:
        """The batch, taken under ``fence``, is not (known to be) in the log: this node
        stops leading, if that term is still on.

        Everything queued behind it has higher cids, so it fails too; a new term (this
        node's or another's) allocates cids again from what the log holds. A batch of a
        term that already ended fails alone: the queue, the allocations and the lease are
        the next term's, which read the log after this batch could last be appended
        (cluster QA: an old term's append timing out on a paused etcd member deposed the
        node's new term, failing its writes for 10 s).
        """
        with self._lock:
            current = self._fence == fence
            queued: list[Submission] = []
            if current:
                self._fence = None
                queued = list(self._queue)
                self._queue.clear()
        if current:
            log.warning("%s; stepping down", reason)
        else:
            log.info("%s (a txn of a term that already ended)", reason)
        _fail(batch, EtcdUnavailableError(reason) if unknown else error or NotLeaderError(reason))
        if not current:
            return
        _fail(queued, NotLeaderError(f"not appended to the log: {reason}"))
        self.journal.forget_allocations()
        self._step_down(reason)


def _level_of(exc: ClusterError) -> int:
    """How loudly to log a failed etcd request: an unreachable etcd is logged by the
    client already (a line every few seconds, not one per request of every thread)."""
    return logging.DEBUG if isinstance(exc, EtcdUnavailableError) else logging.INFO


#: what a node whose disk is full is told to do (SQLite's "database or disk is full" comes
#: from the data directory's disk, or the temporary directory's for a big sort or index)
FULL_DISK_HINT = (
    ": free space on the disk of the node's data directory (or of SQLite's temporary "
    "directory); the node catches up by itself"
)


def _failure(what: str, exc: Exception, last: str | None) -> tuple[str, int]:
    """The message for a failure to apply or catch up, and the level to report it at. A
    full disk is the node's environment, not a bug: a line with what to do, no traceback
    (full-disk QA: a traceback every 2 s, 3,300 lines while the disk was full); any other
    failure logs its traceback once, not on every retry."""
    message = f"{what}: {exc}"
    if isinstance(exc, apsw.FullError):
        return message + FULL_DISK_HINT, logging.ERROR
    if message != last:
        log.exception("%s", what)
    return message, logging.DEBUG


def _cid_of(key: str, prefix: str) -> int:
    return int(key[len(prefix) :])


def _fail(submissions: list[Submission], error: Exception) -> None:
    for submission in submissions:
        if not submission.future.done():
            submission.future.set_exception(error)


# --- every node's apply loop -------------------------------------------------------------


class ApplyStalledError(ClusterError):
    """The apply loop met an entry it cannot apply (a gap, a corrupt entry, a diverged
    journal); it retries, and reports the reason in the node's status meanwhile."""


class DivergedError(ApplyStalledError):
    """This node's journal is not a prefix of the cluster's log: it holds a cid whose
    log entry it did not apply (written while the data directory ran standalone, say), or
    cids the log never had. Only new data fixes that (a fresh data directory)."""


#: how the message of an apply loop waiting for etcd to come back from the past begins
ETCD_WENT_BACK = "etcd went back in time"

#: the node-state name under which a node remembers its cluster's identity
CLUSTER_IDENTITY = "cluster_identity"


def identity_key(cluster: str) -> str:
    """A random number the cluster's first node writes and every node remembers
    (``CLUSTER_IDENTITY`` in its node state): an etcd without it, or with another, lost
    the cluster's data. (The settings key may be deleted on purpose; this one is not.)"""
    return f"/litecdc/{cluster}/identity"


def identity_of(value: bytes) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def etcd_lost_data(cluster: str, key: str, missing: bool) -> str:
    """Why a node of ``cluster`` does not trust etcd: its identity key is gone or other."""
    found = "missing" if missing else "not the one this node remembers"
    return (
        f"{ETCD_WENT_BACK}: its identity for cluster {cluster!r} ({key}) is {found} "
        "— etcd lost the cluster's data (wiped, or replaced by another), and "
        "its log is not the one this node followed: the node neither leads nor is ready. "
        "Restore etcd from a backup, or start the cluster afresh from the node with the most "
        "data (docs/cluster.md, 'When etcd loses its data')"
    )


#: what a diverged node's errors add: what it means and what to do
DIVERGED_ADVICE = (
    "this database did not come from this cluster's log (was the data directory written "
    "to while running standalone?): the node neither leads nor is ready; to rejoin, start "
    "it on a new, empty --data-dir (it copies the cluster's data)"
)


@dataclass(slots=True)
class _Applied:
    #: the entry the log held at that cid (a waiter compares it with its own)
    entry: LogEntry
    outcome: WriteOutcome
    revision: int


class ApplyLoop:
    """Watches the log and applies every entry, in order, on this node.

    ``expect(entry)`` before an entry is appended keeps its results for
    :meth:`wait_applied` (only entries submitted on this node keep results).
    """

    def __init__(
        self,
        client: EtcdClient,
        journal: Journal,
        cluster: str,
        *,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
        quiet_interval: float = DEFAULT_QUIET_INTERVAL,
        stall_retry_interval: float = DEFAULT_STALL_RETRY_INTERVAL,
        restore: Callable[[int], int] | None = None,
        on_stalled: Callable[[str], None] | None = None,
    ) -> None:
        """``on_stalled(reason)`` is called (on the apply thread) whenever the loop stops
        on an entry it cannot apply: a leader must not go on leading then."""
        self.client = client
        self.journal = journal
        self.cluster = cluster
        self.prefix = log_prefix(cluster)
        self.retry_interval = retry_interval
        self.quiet_interval = quiet_interval
        self.stall_retry_interval = stall_retry_interval
        self._revision = journal.applied_revision()
        #: after reading the log's keys at a revision (compacted position), watch from
        #: the revision after it (kept in memory: a restart reads the keys again)
        self._watch_from = 0
        #: installs a snapshot whose applied revision is at least the argument, returns it
        self._restore = restore
        self._stop = threading.Event()
        self._changed = threading.Condition()
        #: entries submitted on this node, by cid; one cid may be expected by two writes when
        #: a leader lost and regained leadership and handed the cid out again
        self._expected: dict[int, list[LogEntry]] = {}
        self._results: dict[int, _Applied] = {}
        self._thread: threading.Thread | None = None
        self._watch_lock = threading.Lock()
        self._watch: Watch | None = None
        #: the reason the loop cannot apply right now (None while healthy)
        self.last_error: str | None = None
        #: why the loop stopped on an entry it cannot apply (a gap, an unreadable entry, a
        #: failing apply, a diverged journal); None once it applies an entry again
        self.stalled: str | None = None
        #: why this node's journal is not a prefix of the log; it stays (only a snapshot
        #: installed over the data clears it)
        self.diverged: str | None = None
        self._on_stalled = on_stalled
        self._position_checked = False
        #: the log was compacted past this node's position: it needs a snapshot
        self.needs_snapshot = False
        #: the cid the cluster's data starts from: its founding node's own data, which no
        #: log entry holds (a standalone node grown into a cluster); a node whose journal
        #: is behind it, with the log holding nothing after its journal, copies it by
        #: snapshot (set by ClusterNode before ``start``)
        self.base_cid = 0
        #: the cluster identity this node remembers (ClusterNode sets it at start): an etcd
        #: without it lost the cluster's data (``_etcd_went_back``)
        self.identity: int | None = None
        #: set (with needs_snapshot) while a journal behind base_cid is not yet known to
        #: find its next entries in the log: no leading, not ready, until the loop checked
        self.base_pending = False
        #: entries applied, and entries skipped because the journal already had them
        self.applied = 0
        self.skipped = 0
        #: highest etcd revision any watch response reported
        self.seen_revision = 0
        #: catch-ups after compaction: by reading the log's keys, by installing a snapshot
        self.log_reads = 0
        self.snapshots_installed = 0

    def applied_revision(self) -> int:
        """The etcd revision of the last entry applied on this node (0 before any)."""
        with self._changed:
            return self._revision

    def forget_revision(self) -> None:
        """This directory joins a cluster anew (it belongs to none): a revision it applied
        is another etcd's, from a cluster it was detached from (config QA: founding a new
        cluster on a new etcd, the node took the lower revision there for etcd having lost
        data, and never led)."""
        with self._changed:
            self._revision = 0

    # -- waiting for entries --------------------------------------------------------------------

    def expect(self, entry: LogEntry) -> None:
        """Keep the results of ``entry`` when it is applied (call before appending it)."""
        with self._changed:
            self._expected.setdefault(entry.cid, []).append(entry)

    def forget(self, entry: LogEntry) -> None:
        with self._changed:
            self._forget(entry)

    def _forget(self, entry: LogEntry) -> None:
        waiting = self._expected.get(entry.cid)
        if waiting is not None:
            with contextlib.suppress(ValueError):
                waiting.remove(entry)
            if not waiting:
                del self._expected[entry.cid]
                self._results.pop(entry.cid, None)

    def wait_applied(self, entry: LogEntry, timeout: float) -> LogWriteOutcome | None:
        """The results of ``entry`` once the log's entry at its cid is applied here; None
        after ``timeout`` (or when the loop closes).

        Raises NotLeaderError when the log's entry at that cid is another one (a write
        whose append failed, superseded by another leader's or by a later write of this
        node's): this write was not committed.
        """
        cid = entry.cid
        deadline = time.monotonic() + timeout
        with self._changed:
            while cid not in self._results and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            applied = self._results.get(cid)
            if applied is not None or self._stop.is_set():
                self._forget(entry)
        if applied is None:
            return None
        if applied.entry != entry:
            raise NotLeaderError(
                f"the log's entry for cid {cid} is another write: this write was not "
                "committed; send it again"
            )
        o = applied.outcome
        return LogWriteOutcome(
            o.results, o.cid, o.snapshot, applied.revision, log_cid=cid, revision=applied.revision
        )

    def wait_for_cid(self, cid: int, timeout: float) -> bool:
        """True once the journal holds ``cid`` (applied here), False after ``timeout``."""
        return cid <= self.journal.last_cid() or self.journal.wait_for_commit_after(
            cid - 1, timeout
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ApplyLoop:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"litecdc-apply {self.cluster}", daemon=True
            )
            self._thread.start()
        return self

    def request_stop(self) -> None:
        """Tell the loop to stop after what it applies (close() waits for it)."""
        self._stop.set()
        with self._watch_lock:
            watch = self._watch
        if watch is not None:
            watch.cancel()
        with self._changed:
            self._changed.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the apply thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            # From the applied revision itself, not after it: a group commit's entries share
            # one revision, and a restart may have come between two of them.
            start = max(self.applied_revision(), self._watch_from, 1)
            try:
                went_back = self._etcd_went_back()
                if went_back is not None:
                    self._stall(went_back)
                    self._stop.wait(self.stall_retry_interval)
                    continue
                if self.stalled is not None and self.stalled.startswith(ETCD_WENT_BACK):
                    self.stalled = None  # etcd has its data again (restored)
                if not self._position_checked:
                    # before applying anything: a journal ahead of the log, or holding a
                    # cid the log has another entry for, is never caught by the watch
                    self.check_position()
                    self._position_checked = True
                if self._behind_base():
                    # the founder's own data is in no log entry: no watch would bring it
                    self._catch_up(None)
                    continue
                if self.base_pending:  # the log has what follows: no snapshot needed
                    self.base_pending = self.needs_snapshot = False
                watch = self.client.watch(self.prefix, prefix=True, start_revision=start)
            except ClusterError as exc:
                self._error(f"cannot watch the log: {exc}", _level_of(exc))
                self._stop.wait(self.retry_interval)
                continue
            with self._watch_lock:
                self._watch = watch
            try:
                self._follow(watch)
            except CompactedError as exc:
                self._catch_up(exc)
            except ApplyStalledError as exc:
                self._stall(str(exc), diverged=isinstance(exc, DivergedError))
                self._stop.wait(self.stall_retry_interval)
            except ClusterError as exc:  # the stream broke: watch again from the last entry
                self._error(f"log watch: {exc}; watching again", _level_of(exc))
                self._stop.wait(self.retry_interval)
            except Exception as exc:  # SQLite failure…: retry from the last applied entry
                if self._stop.is_set():
                    # the node is leaving and interrupted the entry (ClusterNode.close):
                    # it is applied again at the next start — not a failure to report
                    log.info("stopped applying the log: %s", exc)
                    break
                message, level = _failure("applying the log failed", exc, self.stalled)
                self._stall(message, level=level)
                self._stop.wait(self.stall_retry_interval)
            finally:
                with self._watch_lock:
                    self._watch = None
                watch.cancel()

    # -- catching up after compaction --------------------------------------------------------

    def _behind_base(self) -> bool:
        """Whether this node's journal is behind the cluster's founding data with no log
        entry after it: only a snapshot brings that data (cluster QA: a node joining a
        cluster grown from a standalone node found an empty log, took itself for caught
        up, served reads without the founder's tables and could lead without them)."""
        last = self.journal.last_cid()
        if last >= self.base_cid:
            return False
        return self.client.get(log_key(self.cluster, last + 1)) is None

    def _catch_up(self, compacted: CompactedError | None) -> None:
        """The watch's start revision was compacted (or the log's first entries are gone),
        or (``compacted`` None) the journal is behind the cluster's founding data.

        If every entry this node lacks is still a key, read them at one revision and watch
        from the revision after it. Otherwise the entries are gone, or were never in the
        log: install a snapshot from a peer (``restore``) and watch from its applied
        revision.
        """
        if self.diverged is not None:  # reading on would apply the log over data not its own
            self._stall(self.diverged, diverged=True)
            self._stop.wait(self.stall_retry_interval)
            return
        message = "catching up after compaction"
        try:
            first = self.client.range(self.prefix, prefix=True, limit=1, keys_only=True)
            last = self.journal.last_cid()
            first_cid = _cid_of(first.kvs[0].key, self.prefix) if first.kvs else None
            if (first_cid is None and last >= self.base_cid) or (
                first_cid is not None and first_cid <= last + 1
            ):
                self._read_log(first.revision)
                self.last_error, self.needs_snapshot = None, False
                return
            self.needs_snapshot = True
            if first_cid is None or first_cid <= self.base_cid + 1:
                # no entry holds the founding data: any snapshot holding it will do (the
                # installer takes one of at least base_cid)
                required = 0
                message = (
                    f"this node's journal ends at cid {last}, and the cluster's data starts "
                    f"at cid {self.base_cid} (its founding node's own data, in no log entry); "
                    "it needs a snapshot to catch up"
                )
            else:
                required = first.kvs[0].mod_revision
                message = (
                    f"the log was compacted past this node's position (applied revision "
                    f"{self.applied_revision()}, cid {last}; the log starts at cid "
                    f"{first_cid}); it needs a snapshot to catch up ({compacted})"
                )
            if self._restore is None:
                self._error(f"{message}; no snapshot source configured", logging.ERROR)
                self._stop.wait(self.stall_retry_interval)
                return
            self._error(f"{message}; installing a snapshot", logging.WARNING)
            revision = self._restore(required)
        except ApplyStalledError as exc:
            self._stall(str(exc), diverged=isinstance(exc, DivergedError))
            self._stop.wait(self.stall_retry_interval)
            return
        except LitecdcError as exc:
            self._error(f"{message}: {exc}; trying again", logging.WARNING)
            self._stop.wait(self.stall_retry_interval)
            return
        except Exception as exc:
            what = "catching up after compaction failed"
            message, level = _failure(what, exc, self.last_error)
            self._error(message, level if message != self.last_error else logging.DEBUG)
            self._stop.wait(self.stall_retry_interval)
            return
        with self._changed:
            self._revision = revision
            self._watch_from = 0
            self.snapshots_installed += 1
            self._changed.notify_all()
        # the data is the peers' now: whatever this node's own journal held is gone
        self.last_error, self.needs_snapshot = None, False
        self.stalled = self.diverged = None
        log.info("installed a snapshot at revision %d (cid %d); watching the log from there",
                 revision, self.journal.last_cid())  # fmt: skip

    def _read_log(self, revision: int) -> None:
        """Apply every entry after the journal's last cid as the log held them at
        ``revision``, then watch from ``revision + 1``. Reads blocks of 1,000 cids (the
        keys sharing their first 17 digits), so no response is larger than that."""
        cid = self.journal.last_cid() + 1
        while not self._stop.is_set():
            digits = f"{cid:020d}"
            kvs = self.client.range(self.prefix + digits[:17], prefix=True, revision=revision).kvs
            kvs = [kv for kv in kvs if kv.key >= self.prefix + digits]
            if not kvs:
                break
            for kv in kvs:
                self._apply(kv)
            cid = (cid // 1000 + 1) * 1000
        if self._stop.is_set():
            return
        self._watch_from = revision + 1
        self.seen_revision = max(self.seen_revision, revision)
        self.log_reads += 1
        log.info("caught up by reading the log at revision %d (cid %d)", revision,
                 self.journal.last_cid())  # fmt: skip

    def _error(self, message: str, level: int) -> None:
        self.last_error = message
        log.log(level, "%s", message)

    def _stall(self, message: str, *, diverged: bool = False, level: int = logging.ERROR) -> None:
        """The loop cannot apply the next entry: say so, and tell the node (a leader steps
        down: it could append entries but never apply, let alone acknowledge, them)."""
        # the same reason again (the loop retries every few seconds) is not news
        repeated = message == self.stalled
        self.stalled = message
        if diverged:
            self.diverged = message
        self._error(message, logging.DEBUG if repeated else level)
        if self._on_stalled is not None:
            try:
                self._on_stalled(message)
            except Exception:
                log.exception("apply loop stall listener failed")

    def check_position(self) -> str | None:
        """Whether this node's journal is a prefix of the log, as far as the log's keys
        tell: returns why not (and marks the loop diverged), or None.

        Diverged: the log's entry for the journal's last cid is newer than the revision
        this node applied (this journal's entry for that cid came from elsewhere), or the
        log ends before the journal does (this journal has cids the log never had). A log
        with no keys at all says nothing (a founder's own data, or a log not written yet).
        """
        if self.diverged is not None:
            return self.diverged
        went_back = self._etcd_went_back()
        if went_back is not None:
            self._stall(went_back)
            return went_back
        last = self.journal.last_cid()
        # read after the cid, from the database: the revision stored with the cid's entry
        # (the in-memory one is updated a moment after the journal's last cid)
        applied = self.journal.applied_revision()
        kv = self.client.get(log_key(self.cluster, last))
        problem = None
        if kv is not None:
            if kv.mod_revision > applied:
                problem = (
                    f"the journal already has cid {last}, but the log's entry for it (revision "
                    f"{kv.mod_revision}) is newer than this node's applied revision {applied}"
                )
        else:
            tail = self.client.range(
                self.prefix, prefix=True, limit=1, keys_only=True, descending=True
            ).kvs
            if tail and _cid_of(tail[0].key, self.prefix) < last:
                problem = (
                    f"the journal has cids up to {last}, but the cluster's log ends at cid "
                    f"{_cid_of(tail[0].key, self.prefix)}"
                )
        if problem is None:
            return None
        self._stall(f"{problem}: {DIVERGED_ADVICE}", diverged=True)
        return self.diverged

    def _etcd_went_back(self) -> str | None:
        """Why etcd cannot hold the log this node followed, or None: an etcd's revision
        never decreases, so one below the revision this node applied means etcd lost data
        — wiped, replaced, or restored from an older backup. Its log is then not the one
        applied here: a wiped etcd took new writes at revisions this node's watch had
        passed, so no node applied them (cluster QA: they were acknowledged 'in the log,
        do not retry', then every node stopped on them), and restored from a backup it
        lacks the newest entries."""
        if self.identity is not None:
            # (revisions alone are not enough: any other writer to that etcd, another
            # cluster say, brings its revision past ours again — cluster QA: a lagging
            # node then led the empty log alone, and acknowledged writes were lost)
            key = identity_key(self.cluster)
            kv = self.client.get(key)
            if kv is None or identity_of(kv.value) != self.identity:
                return etcd_lost_data(self.cluster, key, kv is None)
        applied = self.applied_revision()
        if applied <= 0:
            return None
        current = self.client.range(self.prefix, prefix=True, limit=1, keys_only=True).revision
        if current >= applied:
            return None
        return (
            f"{ETCD_WENT_BACK}: it is at revision {current}, behind revision {applied} "
            "that this node applied — etcd lost data (wiped, replaced, or restored from an "
            "older backup), and its log is not the one this node followed: the node neither "
            f"leads nor is ready. Restore etcd from a backup holding revision {applied} or "
            "later (the node goes on by itself), or start the cluster afresh from this "
            "node's data (docs/cluster.md, 'When etcd loses its data')"
        )

    def _follow(self, watch: Watch) -> None:
        quiet_since = time.monotonic()
        asked = False
        while not self._stop.is_set():
            batch = watch.get(timeout=min(0.5, self.quiet_interval))
            if batch is None:
                if self._stop.is_set():
                    return
                if time.monotonic() - quiet_since >= self.quiet_interval:
                    if asked:  # no progress report either: the member may hang
                        raise EtcdUnavailableError("the log watch went quiet")
                    watch.request_progress()
                    asked, quiet_since = True, time.monotonic()
                continue
            quiet_since, asked = time.monotonic(), False
            self.seen_revision = max(self.seen_revision, batch.revision)
            puts = sorted((e.kv for e in batch.events if e.type == "put"), key=lambda kv: kv.key)
            self._apply_batch(puts)
            self.last_error, self.needs_snapshot = None, False

    def _apply_batch(self, kvs: list[KeyValue]) -> None:
        """Apply one watch response's entries in ONE SQLite transaction (one fsync on this
        node for a whole group commit); anything unusual goes entry by entry."""
        if kvs and self.diverged is not None:
            raise DivergedError(self.diverged)  # nothing goes on top of data not the log's
        ready = [(kv, entry) for kv in kvs if (entry := self._checked(kv)) is not None]
        self._apply_ready(ready)

    def _apply_ready(self, ready: list[tuple[KeyValue, LogEntry]]) -> None:
        while ready:  # (a loop: a catch-up may hold a thousand such entries — cluster QA)
            ended = self._apply_until_ended(ready)
            if ended is None:
                return
            # an entry's statement ended the SQLite transaction: the entries before it
            # again, then its failure as found (not run twice: a statement stopped at the
            # write step limit takes ~100 s), then the rest
            index, outcome = ended
            if self._apply_until_ended(ready[:index]) is not None:
                for kv, entry in ready[:index]:  # (cannot happen: they ran fine before it)
                    self._apply_one(kv, entry)
            kv, entry = ready[index]
            self._applied(
                kv,
                entry,
                self.journal.record_failed_entry(entry, outcome, revision=kv.mod_revision),
            )
            ready = ready[index + 1 :]

    def _apply_until_ended(
        self, ready: list[tuple[KeyValue, LogEntry]]
    ) -> tuple[int, WriteOutcome] | None:
        """Apply ``ready`` as one batch (or one by one); None when all were applied, else
        the index and outcome of the entry that ended the batch, nothing of it applied."""
        if len(ready) < 2:
            for kv, entry in ready:
                self._apply_one(kv, entry)
            return None
        try:
            outcomes = self.journal.apply_log_entries(
                [entry for _, entry in ready], revision=ready[-1][0].mod_revision
            )
        except (DuplicateCidError, SnapshotUnavailableError):
            outcomes = None
        if isinstance(outcomes, BatchEnded):
            return outcomes.index, outcomes.outcome
        if outcomes is None:  # not applicable as a batch: one by one
            for kv, entry in ready:
                self._apply_one(kv, entry)
            return None
        for (kv, entry), outcome in zip(ready, outcomes, strict=True):
            self._applied(kv, entry, outcome)
        return None

    def _apply(self, kv: KeyValue) -> None:
        if self.diverged is not None:
            raise DivergedError(self.diverged)
        entry = self._checked(kv)
        if entry is not None:
            self._apply_one(kv, entry)

    def _checked(self, kv: KeyValue) -> LogEntry | None:
        """The entry in ``kv``, or None when the journal has it already."""
        try:
            cid = int(kv.key[len(self.prefix) :])
            entry = LogEntry.decode(kv.value)
        except (ValueError, msgspec.DecodeError) as exc:
            raise ApplyStalledError(f"unreadable log entry {kv.key}: {exc}") from exc
        if entry.cid != cid:
            raise ApplyStalledError(f"log entry {kv.key} holds cid {entry.cid}")
        applied_revision = self.applied_revision()
        if cid <= self.journal.last_cid():
            if kv.mod_revision > applied_revision:
                raise DivergedError(
                    f"the journal already has cid {cid}, but the log's entry for it (revision "
                    f"{kv.mod_revision}) is newer than this node's applied revision "
                    f"{applied_revision}: {DIVERGED_ADVICE}"
                )
            self.skipped += 1
            return None
        return entry

    def _apply_one(self, kv: KeyValue, entry: LogEntry) -> None:
        cid = entry.cid
        try:
            outcome = self.journal.apply_log_entry(entry, revision=kv.mod_revision)
        except DuplicateCidError:
            self.skipped += 1
            return
        except SnapshotUnavailableError as exc:
            first = self.client.range(self.prefix, prefix=True, limit=1, keys_only=True).kvs
            if first and _cid_of(first[0].key, self.prefix) > self.journal.last_cid() + 1:
                # the entries this node lacks were deleted: only a snapshot has them
                raise CompactedError(None, f"log entries before cid {cid}") from exc
            raise ApplyStalledError(
                f"log entry for cid {cid} cannot be applied: {exc} (the log misses an entry)"
            ) from exc
        self._applied(kv, entry, outcome)

    def _applied(self, kv: KeyValue, entry: LogEntry, outcome: WriteOutcome) -> None:
        cid = entry.cid
        self.stalled = None
        with self._changed:
            self._revision = kv.mod_revision
            self.applied += 1
            if cid in self._expected:
                self._results[cid] = _Applied(entry, outcome, kv.mod_revision)
            self._changed.notify_all()
