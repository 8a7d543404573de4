"""The CDC pull server: runs every subscription an owner has, on Spark, and resumes them.

Each subscription moves forward through the jimdb stages, recorded in the metadata
store after every step so a restart (even a kill -9) resumes where it stopped:

1. **register** — the node returns its current cid, the initial snapshot version, and
   holds its change log from there; the node cuts the table into key ranges of about
   ``page_rows`` rows each (``/splits``).
2. **snapshot** — every round reads ``partitions`` unfinished ranges whole, in parallel
   Spark partitions (``format("litecdc")`` with ``ranges``), writes them to the sink,
   then records them done. Only the node compares keys — it cut the ranges and pages
   through each — so keys follow SQLite's order (collations, NULLs first, numbers
   before text) and travel as stored, not as mirrored. Chunks are read at different
   cids; the sink's version guard sorts that out. When every range is done, rows the
   snapshot did not see (a re-snapshot's leftovers) are swept.
3. **incremental** — micro-batches of whole transactions from the last applied cid,
   bounded by ``max_events``, read through Spark (``mode=changes``), applied in one sink
   commit, then recorded; the node's hold moves forward behind them.

A subscriber whose position fell past the node's retention cap gets "position no
longer available" and is re-snapshotted. A failing subscription is retried with
back-off and does not stop the others. ``run`` steps the subscriptions on ``parallel``
threads, in turn; a step that goes on for long has its sink's server asked whether it
still answers (``Sink.probe``), and one that does not has the step's connection broken
(``Sink.abort``), so a hung server fails its own subscriptions only. A row a sink
cannot store (a key longer than a MariaDB key column or a PostgreSQL index entry holds)
fails its batch until a later commit deletes the row at the source: its changes up to
then are skipped (they could never be in the sink).

A table is re-copied (a new snapshot) whatever the sink when DDL changed its rows
without row changes: a column with a DEFAULT added (the table description recorded for
the subscription is compared with the source's), or a *reshape* after the subscription's
copy began — the table dropped and created again, a column dropped or renamed (the
node's description says when the table was last reshaped, ``reshaped_cid``; the copy
began at its registration, ``init_snapshot_version``). A change the sink cannot follow
(a mirrored column gone or out of its place, a type or the key changed) fails the
subscription instead. Both are checked by a running server and on start.

Rows with NULL in their primary key (SQLite allows it outside INTEGER PRIMARY KEY and
WITHOUT ROWID) cannot be told apart by key: a mirror refuses them, a message sink
refuses two of one key (``check_null_keys``), until they have keys at the source.

Errors a Spark worker raised come back wrapped in Spark's exceptions, with the whole
traceback: ``worker_error`` takes the litecdc error out, so it is handled as itself and
recorded as its one line (the rest is logged at debug level).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from litecdc import errors
from litecdc.db.reshape import gives_rows_a_value
from litecdc.errors import (
    LitecdcError,
    NotFoundError,
    PipelineError,
    PositionUnavailableError,
    SchemaMismatchError,
    SinkError,
    SinkUnreachableError,
    SourceError,
    UnknownSubscriptionError,
)
from litecdc.pipeline import parquet_log
from litecdc.pipeline.metadata import MetadataStore, RangeProgress, Subscription
from litecdc.pipeline.metrics import PipelineMetrics
from litecdc.pipeline.parquet_log import ParquetLog
from litecdc.pipeline.sinks.base import (
    ChangeBatch,
    Sink,
    UnstorableKeyError,
    probe_sink,
    registration_of,
)
from litecdc.pipeline.sinks.registry import open_sink, sink_server
from litecdc.pipeline.source_client import KeyRange, Position, SourceClient, TableInfo
from litecdc.pipeline.source_client import Subscription as Hold
from litecdc.pipeline.spark import DEFAULT_DRIVER_MEMORY, jvm_exit_status
from litecdc.pipeline.tables import (
    CID_COLUMN,
    OP_COLUMN,
    OP_DELETE,
    Column,
    TableSpec,
    check_followable,
    named_as,
)
from litecdc.wire import encode_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger("litecdc.pipeline")

DEFAULT_PAGE_ROWS = 200_000
DEFAULT_MAX_EVENTS = 100_000
DEFAULT_PARTITIONS = 2
HOLD_INTERVAL = 5.0
#: how often a snapshot asks the node whether its hold still stands (a copy that outlasts
#: the node's retention cap is re-started at once, not after the rest of it was copied)
HOLD_CHECK_INTERVAL = 5.0
#: --until-caught-up gives up after this many failures in a row of one subscription
#: (with the back-off, about 15 s)
GIVE_UP_FAILURES = 5
RETRY_DELAY = 0.5
RETRY_MAX_DELAY = 30.0
#: a Parquet change log's query started again after a failure has not recovered until it
#: has run this long: its failure shows a step or more later, and a start reset the
#: back-off (scale QA: on a loaded machine twelve logs' queries failed ~20 s after each
#: start, "Python worker failed to connect back", and were started again every 0.5 s,
#: their Python processes piling up and loading the machine further)
QUERY_RECOVERED_AFTER = 60.0
SCHEMA_CHECK_INTERVAL = 5.0
#: a step of `run` going on this long gets its sink's server asked for a new connection,
#: and again as often while it lasts: a server that does not answer (a frozen process, a
#: network path that drops packets) has the step's connection broken, so the subscription
#: fails and is retried instead of waiting for ever; one that answers is only slow
STALL_PROBE_AFTER = 30.0
#: how long a stopping `run` waits for the steps in progress to end
STOP_WAIT = 10.0
#: how often a stop cancels the Spark jobs of the steps still in flight, meanwhile
CANCEL_EVERY = 0.5
#: the Spark job groups of steps (``PipelineServer._job_group``) start so
JOB_GROUP_PREFIX = "litecdc-step-"
#: subscriptions `run` steps at once, by default (each step holds a batch in memory)
DEFAULT_PARALLEL = 4
#: how often `run` looks for added, changed and removed subscriptions, and for stalls
WATCH_INTERVAL = 0.5
#: seconds between two checks that this run still holds its owner's claim (PostgreSQL
#: drops it with its connection: a restarted server)
CLAIM_CHECK_INTERVAL = 5.0
IDLE_HOLD_INTERVAL = 300.0
#: the most key ranges a snapshot is cut into (the most a node's /splits gives)
MAX_CHUNKS = 1024
#: the most rows a node's /rows gives in one page
MAX_PAGE_ROWS = 1_000_000
#: the Spark partition (= key range) of a snapshot row, while a round counts them
_RANGE_COLUMN = "_litecdc_range"


Key = tuple[Any, ...]


@dataclass
class KeyScan:
    """A look ahead in the source's change log, from ``start``, for deletes of ``keys``
    (rows a sink refused to store): where it got, and which it found deleted. Kept while
    the batch ending at ``start`` keeps failing, so each commit is read once."""

    start: int
    keys: frozenset[Key]
    scanned: int
    deleted: set[Key] = field(default_factory=set)


@dataclass
class SubscriptionState:
    """What the server knows of one running subscription (status, metrics, tests)."""

    name: str
    stage: str = "register"
    applied_cid: int = 0
    source_cid: int = 0
    snapshot_rows: int = 0
    snapshot_total: int = 0
    behind_since: float | None = None
    last_error: str | None = None
    failures: int = 0
    retry_at: float = 0.0
    key_scan: KeyScan | None = None
    #: the last failure was its sink's server not answering (SinkUnreachableError)
    unreachable: bool = False
    #: when a Parquet change log's streaming query was last started (monotonic)
    query_started: float | None = None

    @property
    def lag_cids(self) -> int:
        return max(self.source_cid - self.applied_cid, 0)

    def lag_seconds(self, now: float | None = None) -> float:
        since = self.behind_since  # (read once: a scrape reads it while steps set it)
        if since is None:
            return 0.0
        return (now if now is not None else time.monotonic()) - since


#: seconds a failed step's lag probe waits for the source (it runs on the step's thread)
LAG_PROBE_TIMEOUT = 5.0


@dataclass
class _Running:
    subscription: Subscription
    client: SourceClient
    spec: TableSpec
    sink: Sink | None  # None for a Parquet change log (Spark writes it)
    state: SubscriptionState
    parquet: ParquetLog | None = None
    query: StreamingQuery | None = None
    spec_checked: float = field(default_factory=time.monotonic)
    #: the head cid of the node the table's description was last read from: a later read
    #: asks a node at least as far (review: a follower behind it would lack a column the
    #: mirror already took, as if it were dropped)
    spec_cid: int = 0
    #: the node's hold for this subscription, as last moved, and when
    hold_cid: int = 0
    hold_moved: float = 0.0
    #: when a snapshot round last asked the node whether the hold still stands
    hold_checked: float = field(default_factory=time.monotonic)
    #: the node's retention cap, in cids (read at start): a hold trailing the head by a
    #: quarter of it moves whatever the time (QA: a caught-up subscription of a quiet
    #: table moved its hold every 300 s only, and busy other tables expired it)
    retention_cids: int | None = None
    #: the cid its copy of the table began at (its registration), as recorded
    init_cid: int | None = None
    #: why its sink's connection was broken under a step (the server stopped answering)
    stalled: str | None = None


@dataclass
class _Scheduled:
    """One subscription as `run` schedules it: when its next step is due, whether a
    step is in progress (and since when)."""

    subscription: Subscription
    #: the host:port its sink writes to (None: files)
    server: str | None = None
    due_at: float = 0.0
    in_flight: bool = False
    #: the subscription is gone, or was removed and added again under its name: step it
    #: no more, drop it once its step in progress ended
    retired: bool = False
    #: when the step in progress began (monotonic), None while queued or between steps
    step_started: float | None = None
    #: when its sink's server was last asked, during this step
    probed_at: float = 0.0


class PipelineServer:
    """Runs the subscriptions of ``owner`` found in ``meta`` on ``spark``."""

    def __init__(
        self,
        meta: MetadataStore,
        spark: SparkSession,
        *,
        owner: str = "default",
        poll_interval: float = 1.0,
        metrics: PipelineMetrics | None = None,
        on_progress: Callable[[SubscriptionState], None] | None = None,
        retry_delay: float = RETRY_DELAY,
        stall_probe_after: float = STALL_PROBE_AFTER,
        parallel: int = DEFAULT_PARALLEL,
    ) -> None:
        """``retry_delay``: seconds before a failed subscription's first retry, doubling
        up to 30 s (default 0.5); ``stall_probe_after``: seconds a step of `run` goes on
        before its sink's server is asked whether it still answers (default 30);
        ``parallel``: how many subscriptions `run` steps at once (default 4)."""
        if parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {parallel}")
        self.meta = meta
        self.retry_delay = retry_delay
        self.stall_probe_after = stall_probe_after
        self.parallel = parallel
        self.spark = spark
        self.owner = owner
        self.poll_interval = poll_interval
        self.metrics = metrics or PipelineMetrics()
        self.on_progress = on_progress
        self.states: dict[str, SubscriptionState] = {}
        self._running: dict[str, _Running] = {}
        #: sinks of failed attempts kept for the next one (Sink.keep_for_retry), with the
        #: subscription they were opened for
        self._kept_sinks: dict[str, tuple[Subscription, Sink]] = {}
        #: subscriptions whose recorded failure is known to be cleared (a previous run may
        #: have stopped while one was failing)
        self._cleared: set[str] = set()
        self._stop = threading.Event()
        #: until_caught_up: Parquet change logs run availableNow queries to completion
        self._available_now = False
        #: whether the last ``run(until_caught_up=True)`` ended caught up (each
        #: subscription caught up or given up), not stopped first
        self.caught_up = False
        #: `run`: every owned subscription, the steps waiting for a thread, a nudge for
        #: the scheduler when a step ends
        self._scheduled: dict[str, _Scheduled] = {}
        self._queue: queue.SimpleQueue[_Scheduled | None] = queue.SimpleQueue()
        self._step_ended = threading.Event()
        self._stopping = False
        #: sink servers (host:port) found not answering: failures in a row, and when they
        #: may be tried again
        self._server_failures: dict[str, int] = {}
        self._server_retry_at: dict[str, float] = {}

    # -- lifecycle -------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        self._step_ended.set()

    def run(self, *, until_caught_up: bool = False) -> int:
        """Run every owned subscription until stopped. Steps run on ``parallel`` threads,
        in turn (a subscription with work left queues up again behind the others), so a
        slow sink, or one whose server hangs, holds up no other subscription (the watch
        on stalled steps breaks a hung one's connection). With ``until_caught_up``,
        return once each has applied every change committed at its source before this
        call or has failed GIVE_UP_FAILURES times in a row (it would never catch up: it
        is not stepped again, and the others go on — docs QA: one whose hold could not
        be released ended every run before a healthy one's snapshot was done). Returns
        how many subscriptions are still failing (0 = all healthy)."""
        targets: dict[str, int] | None = {} if until_caught_up else None
        self._available_now = until_caught_up
        self._scheduled = {}
        self._queue = queue.SimpleQueue()
        self._stopping = False
        self._server_failures.clear()
        self._server_retry_at.clear()
        threads = [
            threading.Thread(
                target=self._steps, args=(targets,), name=f"litecdc-step-{i}", daemon=True
            )
            for i in range(self.parallel)
        ]
        for thread in threads:
            thread.start()
        listed, claim_checked = 0.0, time.monotonic()
        caught_up = False
        try:
            while not self._stop.is_set():
                if time.monotonic() - claim_checked >= CLAIM_CHECK_INTERVAL:
                    claim_checked = time.monotonic()
                    self.meta.check_owner_claim()  # (lost to another run: raises, run ends)
                if time.monotonic() - listed >= WATCH_INTERVAL:
                    listed = time.monotonic()
                    self._check_spark_alive()
                    self._tend()
                    self._watch_stalls()
                # after every step's end (it wakes this loop), not every WATCH_INTERVAL:
                # the bench's 200k-event backlog took 0.2 s longer to be found caught up
                if targets is not None and self._caught_up(targets):
                    caught_up = True
                    break
                self._step_ended.clear()  # before dispatching: no step's end is missed
                next_due = self._dispatch(give_up=targets is not None)
                self._step_ended.wait(min(max(next_due - time.monotonic(), 0), WATCH_INTERVAL))
        finally:
            self.caught_up = caught_up
            # (caught up: the steps in flight end as they are; stopped, given up, the
            # owner's claim lost, Ctrl-C: their reads are cancelled — review)
            self._stop_threads(threads, cancel_reads=not caught_up)
            self.close()
        return sum(1 for s in list(self.states.values()) if s.last_error)

    def _check_spark_alive(self) -> None:
        """End the run when Spark's JVM has died (out of memory, killed): every step
        after it failed with "connection refused" until each subscription was given up
        on, the run waiting on (scale QA). A new run starts a new JVM."""
        status = jvm_exit_status(self.spark) if self.spark is not None else None
        if status is not None:
            how = f"was killed by signal {-status}" if status < 0 else f"exited (status {status})"
            raise PipelineError(
                f"Spark's JVM {how}; its last words are in the log "
                "above — `java.lang.OutOfMemoryError: Java heap space` means it needs more "
                f"memory: run again with a larger --driver-memory (default "
                f"{DEFAULT_DRIVER_MEMORY}) or with fewer --parallel steps"
            )

    def close(self) -> None:
        for name in list(self._running):
            scheduled = self._scheduled.get(name)
            if scheduled is not None and scheduled.in_flight:
                continue  # a step still in it: its connections are that thread's
            self._forget_connections(name)
        for name in list(self._kept_sinks):
            self._close_kept_sink(name)

    def _caught_up(self, targets: dict[str, int]) -> bool:
        """Whether each owned subscription has caught up, or was given up (failed
        GIVE_UP_FAILURES times in a row: no longer stepped); one being unsubscribed has
        its hold released first."""
        for sub in self.meta.list_subscriptions(owner=self.owner, include_cancelled=True):
            state = self.states.get(sub.name)
            if state is not None and state.failures >= GIVE_UP_FAILURES:
                continue
            if sub.cancel or state is None or sub.name not in targets:
                return False
            if state.stage != "incremental" or state.applied_cid < targets[sub.name]:
                return False
        return True

    # -- `run`'s scheduling ---------------------------------------------------------------
    def _tend(self) -> None:
        """Schedule every owned subscription; one gone, or removed and added again under
        its name (another sink, another registration), is retired: its state and
        connections are dropped once no step of it is in progress (a new one of the name
        starts afresh then)."""
        owned = {
            s.name: s
            for s in self.meta.list_subscriptions(owner=self.owner, include_cancelled=True)
        }
        for name, scheduled in list(self._scheduled.items()):
            current = owned.get(name)
            if current is None or not _same_subscription(scheduled.subscription, current):
                scheduled.retired = True
            elif current.cancel and not scheduled.subscription.cancel:
                scheduled.subscription = current  # unsubscribed meanwhile: release it
            if scheduled.retired and not scheduled.in_flight:
                del self._scheduled[name]
                self._forget(name)
        for name, sub in owned.items():
            if name not in self._scheduled:
                self._scheduled[name] = _Scheduled(sub, server=sink_server(sub.sink))

    def _dispatch(self, *, give_up: bool) -> float:
        """Queue every due subscription with no step in progress; when the next is due.
        ``give_up`` (until_caught_up): not one that failed GIVE_UP_FAILURES times.

        A sink server's failing subscriptions retry one at a time: each retry against a
        server that does not answer holds a thread for its connect_timeout, and together
        they held every thread (QA: the other sinks stalled). A server one of whose
        subscriptions found it not answering is *troubled*: all its subscriptions share
        that one step (a new step there would hang as the first did), after a back-off of
        its own, and steps on troubled servers leave one thread free for the others."""
        now = time.monotonic()
        next_due = now + WATCH_INTERVAL
        items = list(self._scheduled.items())
        troubled = {s.server for n, s in items if s.server is not None and self._unreachable(n)}
        slot_taken = {
            s.server for n, s in items if s.in_flight and (self._failing(n) or s.server in troubled)
        }
        on_troubled = sum(1 for _, s in items if s.in_flight and s.server in troubled)
        for name, scheduled in items:
            if scheduled.in_flight or scheduled.retired:
                continue
            state = self.states.get(name)
            if give_up and state is not None and state.failures >= GIVE_UP_FAILURES:
                continue
            if scheduled.due_at > now:
                next_due = min(next_due, scheduled.due_at)
                continue
            server = scheduled.server
            if server is not None and (server in troubled or self._failing(name)):
                if server in slot_taken:
                    continue  # after that one's step (its end wakes the scheduler)
                if server in troubled:
                    backoff = self._server_retry_at.get(server, 0.0)
                    if backoff > now:
                        next_due = min(next_due, backoff)
                        continue
                    if self.parallel > 1 and on_troubled >= self.parallel - 1:
                        continue
                    on_troubled += 1
                slot_taken.add(server)
            scheduled.in_flight = True
            self._queue.put(scheduled)
        return next_due

    def _failing(self, name: str) -> bool:
        state = self.states.get(name)
        return state is not None and state.last_error is not None

    def _unreachable(self, name: str) -> bool:
        state = self.states.get(name)
        return state is not None and state.unreachable

    def _server_heard(
        self, server: str, state: SubscriptionState, *, was_unreachable: bool
    ) -> None:
        """After a step on ``server``: a back-off of the server's own while its
        subscriptions find it not answering (they take turns at it, so theirs alone would
        have it asked back to back), cleared once one that found it so gets through (a
        step that had nothing to write says nothing of the server)."""
        if state.last_error is None:
            if not was_unreachable:
                return
            self._server_failures.pop(server, None)
            self._server_retry_at.pop(server, None)
        elif state.unreachable:
            failures = self._server_failures.get(server, 0) + 1
            self._server_failures[server] = failures
            delay = min(self.retry_delay * 2 ** min(failures - 1, 6), RETRY_MAX_DELAY)
            self._server_retry_at[server] = time.monotonic() + delay

    def _steps(self, targets: dict[str, int] | None) -> None:
        """A stepping thread: one queued step after the other."""
        while (scheduled := self._queue.get()) is not None:
            if self._stop.is_set() or self._stopping:
                scheduled.in_flight = False  # queued, not begun: left for the next run
                continue
            sub = scheduled.subscription
            state = self.states.setdefault(sub.name, SubscriptionState(sub.name))
            scheduled.step_started = time.monotonic()
            was_unreachable = state.unreachable
            self._set_job_group(sub.name)
            try:
                busy = self._step_one(sub, state, targets)
            except Exception:  # _step_one records every failure: this is a bug of ours
                log.exception("subscription %s: step failed", sub.name)
                busy = False
            scheduled.step_started = None
            if scheduled.server is not None:
                self._server_heard(scheduled.server, state, was_unreachable=was_unreachable)
            if busy is None:
                scheduled.retired = True  # unsubscribed
            elif state.last_error is not None and state.retry_at > time.monotonic():
                scheduled.due_at = state.retry_at
            else:
                scheduled.due_at = time.monotonic() + (0.0 if busy else self.poll_interval)
            scheduled.in_flight = False
            self._step_ended.set()

    def _stop_threads(self, threads: list[threading.Thread], *, cancel_reads: bool) -> None:
        """End the stepping threads; a step still waiting on its sink after STOP_WAIT has
        its sink's connection broken, and is left behind (daemon) if even that fails."""
        self._stopping = True  # steps queued and not begun are skipped
        for _ in threads:
            self._queue.put(None)
        deadline = time.monotonic() + STOP_WAIT
        for thread in threads:
            while thread.is_alive() and time.monotonic() < deadline:
                if cancel_reads:
                    # again and again: a job a step submits after a cancel is not in it
                    self._cancel_reads()
                thread.join(min(CANCEL_EVERY, max(deadline - time.monotonic(), 0)))
        for name, scheduled in self._scheduled.items():
            running = self._running.get(name)
            if scheduled.in_flight and running is not None and running.sink is not None:
                running.sink.abort()
        for thread in threads:
            thread.join(1.0)
            if thread.is_alive():
                log.warning("a step did not end when the server stopped; left behind")

    def _cancel_reads(self) -> None:
        """When `run` ends other than caught up, cancel the Spark jobs of the steps in
        flight (what a step has read it has not written: the next run reads it again),
        so that only writes to sinks have STOP_WAIT to end (CI: a step's read at a busy
        start took longer, and its write was then cut). A mirror's or message sink's
        write runs no Spark job: it goes on. A Parquet log's steps are left alone."""
        if self.spark is None:
            return
        for name, scheduled in list(self._scheduled.items()):
            running = self._running.get(name)
            if not scheduled.in_flight or (running is not None and running.parquet is not None):
                # (a Parquet log's snapshot is read and written by one Spark job: cut,
                # its snapshot/ is left empty and copied whole again — review)
                continue
            try:
                self.spark.sparkContext.cancelJobGroup(self._job_group(name))
            except Exception as exc:  # (Spark's JVM gone: nothing runs there)
                log.debug("subscription %s: cancelling its Spark jobs: %s", name, exc)

    def _job_group(self, subscription: str) -> str:
        """The Spark job group of ``subscription``'s steps on this server (two servers
        may share a Spark context: in tests, or embedded)."""
        return f"{JOB_GROUP_PREFIX}{id(self):x}-{subscription}"

    def _set_job_group(self, subscription: str) -> None:
        """Put the stepping thread's Spark jobs in ``subscription``'s group, which a stop
        can cancel (per thread: PySpark pins each Python thread to a JVM thread). Best
        effort: a JVM that does not answer fails the step's read, which is recorded."""
        if self.spark is None:
            return
        try:
            self.spark.sparkContext.setJobGroup(
                self._job_group(subscription),
                f"litecdc: subscription {subscription}",
                interruptOnCancel=True,
            )
        except Exception as exc:
            log.debug("subscription %s: setting its Spark job group: %s", subscription, exc)

    def _watch_stalls(self) -> None:
        """Ask the server of every sink a step has waited on for stall_probe_after (and
        as often again) whether it still answers, in a thread of its own."""
        now = time.monotonic()
        for name, scheduled in self._scheduled.items():
            started = scheduled.step_started
            if started is None or now - started < self.stall_probe_after:
                continue
            if now - max(scheduled.probed_at, started) < self.stall_probe_after:
                continue
            running = self._running.get(name)
            if running is None or running.sink is None or not running.sink.probes:
                continue  # no server to ask (QA: a Delta sink's step was said to "answer")
            scheduled.probed_at = now
            threading.Thread(
                target=self._probe, args=(running, started, scheduled.server),
                name=f"litecdc-probe-{name}", daemon=True,
            ).start()  # fmt: skip

    def _probe(self, running: _Running, started: float, server: str | None) -> None:
        """Ask ``running``'s sink server whether it answers; if not, break the connection
        of every step waiting on that server, not this one's only: theirs wait on the same
        silence, and each would otherwise hold its thread until its own probe (QA: three
        subscriptions on one frozen server held both threads of --parallel 2 for ~40 s)."""
        sink = running.sink
        assert sink is not None
        name = running.subscription.name
        error = probe_sink(sink)
        now = time.monotonic()
        if error is None:
            log.info(
                "subscription %s: a step has run %.0f s; its sink answers", name, now - started
            )
            return
        waiting = [(name, running, started, "")]
        for other_name, scheduled in list(self._scheduled.items()):  # (a copy: see _tend)
            other, begun = self._running.get(other_name), scheduled.step_started
            same_server = server is not None and scheduled.server == server
            if other_name != name and same_server and other is not None and begun is not None:
                waiting.append((other_name, other, begun, f" (asked for {name})"))
        for other_name, other, begun, asked in waiting:
            if other.sink is None or not other.sink.probes:
                continue
            other.stalled = (
                f"{error}{asked}; a write to it had waited {now - begun:.0f} s: its "
                "connection was broken"
            )
            log.warning("subscription %s: %s", other_name, other.stalled)
            other.sink.abort()

    # -- one round over every subscription ------------------------------------------------
    def run_round(self, targets: dict[str, int] | None = None) -> bool:
        """One step of every owned subscription, one after the other, in this thread (tests
        step a server this way); True when any had work left."""
        busy = False
        owned = {
            s.name: s
            for s in self.meta.list_subscriptions(owner=self.owner, include_cancelled=True)
        }
        for name, running in list(self._running.items()):
            # gone, or removed and added again under its name between two rounds (another
            # sink, another registration): the connections and state are the old one's
            current = owned.get(name)
            if current is None or not _same_subscription(running.subscription, current):
                self._forget(name)
        for name, (kept, _sink) in list(self._kept_sinks.items()):
            current = owned.get(name)
            if current is None or not _same_subscription(kept, current):
                self._close_kept_sink(name)
        for name, sub in owned.items():
            if self._stop.is_set():
                break
            state = self.states.setdefault(name, SubscriptionState(name))
            if state.retry_at > time.monotonic():
                continue
            busy = bool(self._step_one(sub, state, targets)) or busy
        return busy

    def _step_one(
        self, sub: Subscription, state: SubscriptionState, targets: dict[str, int] | None
    ) -> bool | None:
        """One step of ``sub``, its failure recorded (and its retry time set); True when it
        has work left, None once it is unsubscribed."""
        name = sub.name
        busy: bool | None = False
        try:
            if sub.cancel:
                self._unsubscribe(sub)
                return None
            running = self._running.get(name) or self._start(sub, state)
            running.stalled = None  # (a probe that ended after the last step found it)
            if targets is not None and name not in targets:
                targets[name] = running.client.table_info(running.spec.name).last_cid
                state.source_cid = max(state.source_cid, targets[name])
            busy = self._step(running)
            if not self._recovering(running):
                if name not in self._cleared:
                    self._record_failure(name, None)
                    self._cleared.add(name)
                state.last_error = None
                state.failures = 0
                state.unreachable = False
        except Exception as exc:
            if isinstance(exc, UnknownSubscriptionError) and exc.name == name:
                # unsubscribed (and removed) while the step ran: nothing to retry (QA: the
                # log said "unknown subscription … (retrying in 0.5s)", and did not)
                log.info("subscription %s: removed while a step ran; it stops here", name)
                self._forget_connections(name)
                self._release_left_hold(sub)
                return None
            if self._stopping and _cancelled_read(exc):
                log.info("subscription %s: stopped while reading; the next run reads it", name)
                self._forget_connections(name)
                return False
            if self._stopping:  # cut short by `run` stopping (its connection broken)
                log.info("subscription %s: stopped mid-step (%s); it goes on next run", name, exc)
                self._forget_connections(name)
                return False
            failure: Exception = exc
            running_now = self._running.get(name)
            if running_now is not None and running_now.stalled is not None:
                # what the watch found, not the broken connection's own error
                failure = SinkUnreachableError(running_now.stalled)
            self._failed(state, failure)
            self._record_failure(name, state.last_error)
            self._cleared.discard(name)
            if not isinstance(failure, SourceError) and not self._stop.is_set():
                # (the source failed it: no use asking it again — review)
                self._lag_of_failing(sub, state)
        self.metrics.observe(state)
        if self.on_progress is not None:
            self.on_progress(state)
        return busy

    @staticmethod
    def _recovering(running: _Running) -> bool:
        """Whether ``running`` is a failed Parquet change log whose query, started again,
        has not run QUERY_RECOVERED_AFTER yet: its failure and back-off stand meanwhile."""
        state, started = running.state, running.state.query_started
        if running.parquet is None or state.last_error is None or started is None:
            return False
        return running.query is not None and time.monotonic() - started < QUERY_RECOVERED_AFTER

    def _start(self, sub: Subscription, state: SubscriptionState) -> _Running:
        client = SourceClient(list(sub.sources), **_auth(sub.options))
        info = client.table_info(sub.table_name)
        spec = named_as(info.spec, sub.table_name)
        # against what the sink mirrors (stored): the change may have come while we were
        # not running, or failed the subscription a moment ago
        mirrored = self.meta.mirrored_spec(sub.name)
        stored = TableSpec.from_json(mirrored) if mirrored is not None else None
        if stored is not None:
            check_followable(stored, spec)
        if parquet_log.is_parquet_url(sub.sink):
            log_dir = parquet_log.parse_parquet_url(sub.sink)
            parquet_log.check_names(log_dir, spec)
            running = _Running(sub, client, spec, None, state, parquet=log_dir)
        else:
            kept = self._kept_sinks.pop(sub.name, None)
            sink = None
            if kept is not None:
                if _same_subscription(kept[0], sub):
                    sink = kept[1]
                    # (a table that gained a column: the same destination, the names the
                    # same through named_as; closing the sink instead would let what the
                    # broker holds of its batch land among the retry's — review)
                    sink.spec = spec
                else:
                    kept[1].close()  # removed and added again meanwhile: not this one's
            if sink is None:
                sink = open_sink(sub.sink, spec, sub.name, prepare=False)
            running = _Running(sub, client, spec, sink, state)
        self._running[sub.name] = running  # from here on, a failure closes it
        running.spec_cid = max(running.spec_cid, info.last_cid)  # (see _check_schema)
        if running.sink is not None:
            running.sink.prepare()  # once running: a server that hangs in it is watched
        progress = self.meta.progress(sub.name)
        holds = client.subscriptions()
        running.retention_cids = holds.retention_cids
        if progress.stage not in (None, "register") and holds.get(sub.name) is None:
            # registered, yet the node has no hold (placed when it registered)
            raise _history_replaced(sub.name, "the node has no hold for it")
        if progress.stage not in (None, "register"):
            # the source gained a column with a DEFAULT, or was reshaped, while we were not
            # running: whatever the sink (a mirror, a log of messages), its rows are stale
            reason = _recopy_reason(stored, info, progress.init_snapshot_version)
            if reason is not None:
                log.info("subscription %s: %s; re-snapshotting", sub.name, reason)
                self._drain_log_sink(running)
                self._register(running, restart=True)
        # only now: a crash before the re-snapshot was recorded decides it again
        self._mirrors(sub.name, running.spec)
        progress = self.meta.progress(sub.name)
        self._registered(running, progress.init_snapshot_version)
        state.stage = progress.stage or "register"
        state.applied_cid = progress.last_log_index or 0
        log.info("subscription %s: %s stage, table %s", sub.name, state.stage, sub.table_name)
        return running

    @staticmethod
    def _registered(running: _Running, init_cid: int | None) -> None:
        """Tell the sink which registration its writes belong to (message sinks put it in
        their de-duplication ids): from what the metadata store recorded, so the same on
        every retry and restart."""
        running.init_cid = init_cid
        if running.sink is None or init_cid is None:
            return
        running.sink.registration = registration_of(running.subscription, init_cid)

    def _record_failure(self, name: str, error: str | None) -> None:
        """Keep the error in the metadata store for `pipeline status` (best effort: the
        store may be what fails)."""
        try:
            self.meta.set_failure(name, error)
        except Exception as exc:  # the subscription itself may be gone (unsubscribed)
            log.debug("subscription %s: could not record its state: %s", name, exc)

    def _mirrors(self, name: str, spec: TableSpec) -> None:
        """Record the table description the sink now mirrors (when it changed)."""
        if self.meta.mirrored_spec(name) != spec.to_json():
            self.meta.set_mirrored_spec(name, spec.to_json())

    def _forget(self, name: str) -> None:
        self._forget_connections(name)
        self.states.pop(name, None)
        self._cleared.discard(name)
        self.metrics.forget(name)

    def _lag_of_failing(self, sub: Subscription, state: SubscriptionState) -> None:
        """A failed step's lag figures: the position recorded in the metadata store and
        the source's head now (ops QA: with the sink down they stayed as they were — all 0
        after a restart, the step failing before it read anything — while the
        subscription fell behind, so a lag alert never fired). Best effort: a source or
        store that does not answer leaves them as they are."""
        try:
            progress = self.meta.progress(sub.name)
            if progress.last_log_index is not None:
                state.applied_cid = max(state.applied_cid, progress.last_log_index)
            with SourceClient(
                list(sub.sources), timeout=LAG_PROBE_TIMEOUT, **_auth(sub.options)
            ) as client:
                head = client.table_info(sub.table_name).last_cid
        except Exception as exc:
            log.debug("subscription %s: no lag figures: %s", sub.name, exc)
            return
        state.source_cid = max(state.source_cid, head)
        if state.source_cid > state.applied_cid and state.behind_since is None:
            state.behind_since = time.monotonic()

    def _failed(self, state: SubscriptionState, exc: Exception) -> None:
        state.failures += 1
        error = worker_error(exc)
        if error is not exc:  # Spark's multi-line wrapping: the whole of it for debugging
            log.debug("subscription %s: %s", state.name, exc)
        text = str(error) if isinstance(error, LitecdcError) else f"{type(error).__name__}: {error}"
        # one line in the log and in `status` (libpq's messages, for one, span two)
        state.last_error = " ".join(part.strip() for part in text.splitlines() if part.strip())
        state.unreachable = isinstance(error, SinkUnreachableError)
        delay = min(self.retry_delay * 2 ** min(state.failures - 1, 6), RETRY_MAX_DELAY)
        state.retry_at = time.monotonic() + delay
        log.warning("subscription %s: %s (retrying in %.1fs)", state.name, state.last_error, delay)
        # a broken connection or sink is rebuilt on the next attempt (a sink the retry
        # must wait on is kept for it)
        self._forget_connections(state.name, keep_sink=True)

    def _forget_connections(self, name: str, *, keep_sink: bool = False) -> None:
        if not keep_sink:
            self._close_kept_sink(name)
        running = self._running.pop(name, None)
        if running is None:
            return
        try:
            if running.query is not None:
                running.query.stop()
            if running.sink is not None:
                if keep_sink and running.sink.keep_for_retry():
                    self._kept_sinks[name] = (running.subscription, running.sink)
                else:
                    running.sink.close()
        finally:
            running.client.close()

    def _close_kept_sink(self, name: str) -> None:
        kept = self._kept_sinks.pop(name, None)
        if kept is not None:
            kept[1].close()

    def _unsubscribe(self, sub: Subscription) -> None:
        try:
            _release_hold(sub)
        except LitecdcError as exc:
            # (docs QA: the bare 401 did not say this was a pending unsubscribe, nor
            # how to end it)
            refused = "(401" in str(exc) or "(HTTP 403)" in str(exc)
            need = "a user allowed to execute" if refused else "the source to answer"
            raise SourceError(
                f"unsubscribed, but its hold on the source cannot be released: {exc}; "
                f"releasing needs {need} — or `litecdc pipeline unsubscribe --force "
                f"{sub.name}` removes it without releasing the hold"
            ) from exc
        # removed first: a store that fails it leaves the state and its failures counted
        # (review: forgotten first, the failures never added up to giving it up, and
        # `--until-caught-up` waited on it for good)
        self.meta.remove_subscription(sub.name)
        self._forget(sub.name)
        log.info("subscription %s: unsubscribed, hold released", sub.name)

    @staticmethod
    def _release_left_hold(sub: Subscription) -> None:
        """Release the hold a step may have placed for ``sub`` just as it was unsubscribed:
        an `unsubscribe` that released it before the step's registration left the new
        hold on the node for good (QA: the change log kept past it, the name refused)."""
        try:
            _release_hold(sub)
        except LitecdcError as exc:
            log.warning(
                "subscription %s: removed; its hold on the source may be left there (%s): "
                "release it with DELETE /cdc/subscriptions/%s on the node",
                sub.name, exc, sub.name,
            )  # fmt: skip

    # -- stages ------------------------------------------------------------------------
    def _step(self, running: _Running) -> bool:
        progress = self.meta.progress(running.subscription.name)
        running.state.stage = progress.stage or "register"
        try:
            try:
                if progress.stage in (None, "register"):
                    self._register(running, restart=False)
                    return True
                if progress.stage == "snapshot":
                    return self._snapshot_round(running)
                return self._incremental_round(running)
            except Exception as exc:
                error = worker_error(exc)  # what a Spark worker raised, as it raised it
                if error is exc:
                    raise
                log.debug("subscription %s: %s", running.subscription.name, exc)
                raise error from exc
        except PositionUnavailableError as exc:
            log.warning("subscription %s: %s — re-snapshotting", running.subscription.name, exc)
            self._register(running, restart=True)
            return True

    def _register(self, running: _Running, *, restart: bool) -> None:
        sub = running.subscription
        registered = running.client.register(sub.name)
        if restart:
            if running.query is not None:
                running.query.stop()
                running.query = None
            if running.parquet is not None:
                parquet_log.restart(running.parquet)
            self.meta.restart_snapshot(sub.name, registered.cid)
        else:
            if running.sink is not None:
                # a new subscription: a sink's record left by an earlier one of the same
                # name (unsubscribed, perhaps on another source) is not ours, nor are the
                # rows of a kept mirror at our cids or later (another history's)
                running.sink.forget_progress()
                disowned = running.sink.disown_rows(registered.cid)
                if disowned:
                    log.info(
                        "subscription %s: the mirror holds %d row(s) written at cid %d or "
                        "later, before this subscription registered there (another source's?):"
                        " the snapshot replaces them, or removes them",
                        sub.name, disowned, registered.cid,
                    )  # fmt: skip
            self.meta.start_register(sub.name, registered.cid)
        self._registered(running, registered.cid)
        # everything the copy is planned and read from is read at the registration or
        # later: a node behind it (a cluster follower) waits, or the next is asked
        # (pipeline QA: pages older than the registration were swept away at the end)
        init = registered.cid
        info = running.client.table_info(
            sub.table_name, count_rows=True, min_cid=init
        )  # (count: the progress total)
        running.spec_cid = max(running.spec_cid, info.last_cid)
        self._evolve(running, named_as(info.spec, sub.table_name))
        if running.parquet is not None:
            # a Parquet snapshot is one Spark write (partitions in parallel): one range
            ranges: list[KeyRange] = [(None, None)]
        else:
            page_rows = int(sub.options.get("page_rows", DEFAULT_PAGE_ROWS))
            chunks = chunk_count(
                info.rows or 0, int(sub.options.get("partitions", DEFAULT_PARTITIONS)), page_rows
            )
            ranges = running.client.splits(sub.table_name, chunks, min_cid=init).ranges()
            # the last range ends at the table's last key: a row past it came after the
            # registration, which the change log brings (an append-only table would
            # otherwise grow that range all through the snapshot, to be read in one go)
            last_key = self._last_key(running, ranges[-1][0], page_rows, init)
            ranges[-1] = (ranges[-1][0], last_key)
        self.meta.set_ranges(sub.name, ranges)
        running.state.snapshot_rows = 0
        running.state.snapshot_total = info.rows or 0
        running.state.stage = "snapshot"
        log.info(
            "subscription %s: registered at cid %d, %d range(s), ~%d rows",
            sub.name, registered.cid, len(ranges), info.rows,
        )  # fmt: skip

    @staticmethod
    def _last_key(
        running: _Running, after: list[Any] | None, page_rows: int, min_cid: int
    ) -> list[Any] | None:
        """The table's last key at ``min_cid`` or later, read from ``after`` on when the
        rest is about a range's worth; None otherwise (or when it cannot be read: the
        snapshot says why)."""
        limit = min(page_rows + 1, MAX_PAGE_ROWS)  # a range holds about page_rows
        try:
            tail = running.client.rows(
                running.spec.name, after_key=after, limit=limit, min_cid=min_cid
            )
        except SourceError as exc:
            log.debug("subscription %s: %s", running.subscription.name, exc)
            return None
        return tail.last_key if tail.done else None

    def _snapshot_round(self, running: _Running) -> bool:
        sub = running.subscription
        progress = self.meta.progress(sub.name)
        pending = [r for r in progress.ranges if not r.done]
        state = running.state
        state.snapshot_rows = sum(r.rows_copied for r in progress.ranges)
        if not pending:
            init_cid = progress.init_snapshot_version or 0
            self._mark_copied_rows(running, progress.ranges)
            swept = running.sink.finish_snapshot(init_cid) if running.sink is not None else 0
            self.meta.finish_snapshot(sub.name)
            state.stage = "incremental"
            state.applied_cid = init_cid
            log.info(
                "subscription %s: snapshot done (%d rows, %d stale row(s) swept)",
                sub.name, state.snapshot_rows, swept,
            )  # fmt: skip
            return True
        if running.parquet is not None:
            partitions = str(sub.options.get("partitions", DEFAULT_PARTITIONS))
            reader = self._reader(running).option("partitions", partitions)
            rows_written = parquet_log.write_snapshot(
                reader.option("min_cid", str(progress.init_snapshot_version or 0)),
                running.parquet,
            )
            for r in pending:
                self.meta.record_chunk(
                    sub.name,
                    r.range_id,
                    last_key=None,
                    read_cid=progress.init_snapshot_version or 0,
                    rows=rows_written,
                    done=True,
                )
            state.snapshot_rows = rows_written
            self.metrics.snapshot_rows(sub.name, rows_written)
            return True
        assert running.sink is not None
        self._check_hold_during_snapshot(running, progress.ranges)
        if self._check_schema(running, force=False):
            return True  # reshaped while being copied: copied again at once, not after
        # every range is a chunk of about --page-rows rows, cut by the node: read whole,
        # --partitions of them in parallel, so the node alone compares keys (collations,
        # NULLs, values of several types: a key's mirrored text may not be its value)
        # (a range a server before them left part copied goes on from its last key)
        chunk = pending[: int(sub.options.get("partitions", DEFAULT_PARTITIONS))]
        rows, per_range = self._read_ranges(
            running,
            [(r.last_snapshot_key or r.lower_key, r.upper_key) for r in chunk],
            progress.init_snapshot_version or 0,
        )
        # A column added while the chunk was read: pages read after it came without its
        # values (read with the older description) or with a column the sink has not, and
        # their rows carry cids at or above the commit that wrote those values, so the
        # change log cannot bring them either (pipeline QA: values lost, lag 0). Asked
        # after the read: a column added later came after every page. The chunk is then
        # dropped and read again, with the new description.
        columns = running.spec.column_names
        if self._check_schema(running) or running.spec.column_names != columns:
            log.info(
                "subscription %s: the source table changed while a chunk was read; "
                "reading it again", sub.name,
            )  # fmt: skip
            return True
        check_null_keys(running.spec, rows, running.sink)
        if rows.num_rows:
            running.sink.write_snapshot(rows)
        for index, r in enumerate(chunk):
            n, read_cid = per_range.get(index, (0, progress.init_snapshot_version or 0))
            self.meta.record_chunk(
                sub.name, r.range_id, last_key=r.upper_key, read_cid=read_cid, rows=n, done=True
            )
            state.snapshot_rows += n
        self.metrics.snapshot_rows(sub.name, rows.num_rows)
        return True

    def _incremental_round(self, running: _Running) -> bool:
        sub = running.subscription
        state = running.state
        progress = self.meta.progress(sub.name)
        after = progress.last_log_index or 0
        state.applied_cid = after
        if running.parquet is not None:
            return self._parquet_round(running, after)
        assert running.sink is not None
        max_events = int(sub.options.get("max_events", DEFAULT_MAX_EVENTS))
        position = running.client.position(sub.table_name, after=after, max_events=max_events)
        state.source_cid = position.last_cid
        _check_not_behind(sub.name, position.last_cid, after)
        self._check_same_history(running, after, position)
        now = time.monotonic()
        if position.end_cid <= after:
            state.behind_since = None
            self._check_schema(running)
            return False
        if state.behind_since is None:
            state.behind_since = now
        if position.events:
            if self._check_schema(running):
                return True  # re-snapshotting
            events = self._read(
                running,
                {"mode": "changes", "after_cid": str(after), "until_cid": str(position.end_cid)},
            )
            # a column added at the source since the check above: the sink takes it first,
            # or the batch's values of it would be lost
            added = set(events.column_names) - set(running.spec.change_schema().names)
            if added and self._check_schema(running):
                return True  # re-snapshotting
            applicable = self._null_key_changes(running, events)
            if applicable is None:
                return True  # re-snapshotting
            events = applicable
            batch = ChangeBatch(sub.name, after, position.end_cid)
            try:
                running.sink.write_changes(events, batch)
            except UnstorableKeyError as exc:
                events = self._skip_deleted_later(running, events, batch, exc)
                running.sink.write_changes(events, batch)
            state.key_scan = None
            self.metrics.events_applied(sub.name, events.num_rows)
        self.meta.record_log_position(sub.name, position.end_cid, position.end_mark)
        state.applied_cid = position.end_cid
        self._move_hold(running, position.end_cid, applied=bool(position.events))
        if position.end_cid >= position.last_cid:
            state.behind_since = None
        return position.end_cid < position.last_cid

    def _check_same_history(self, running: _Running, applied: int, position: Position) -> None:
        """_history_replaced unless the source's commit the sink's data was last marked at
        (see source_mark) is still that commit. Backup QA: a node restored from a backup
        taken after the subscription registered still had its hold, and once new writes
        moved its head past the applied cid the mirror followed the other history
        silently (status lag 1, verify: rows wrong, missing, extra). Its new commits reuse
        the cids, not the marks (the leader's clock and random seed). A mark the source
        cannot tell (the journal trimmed that far, a cid beyond a follower's head, an
        older node) is not checked; one ahead of the sink (a snapshot's) stays until the
        sink passes it, then the mark moves to ``applied`` when that one is known.

        ``position``: the source's position after ``applied`` (its after_mark is the
        mark of ``applied``)."""
        name = running.subscription.name
        seen = self.meta.source_mark(name)
        if seen is not None:
            cid, mark = seen
            if cid == applied:
                now = position.after_mark
            else:  # (marked at the end of a snapshot, or behind a parquet log's position)
                found = self._mark_position(running, cid)
                now = found.after_mark if found is not None else None
            if now is not None and now != mark:
                raise _history_replaced(
                    name,
                    f"the source's commit {cid} is not the one the sink's data came from "
                    f"(another commit has that cid now: mark {now}, not {mark})",
                    may_catch_up=False,
                )
            if cid >= applied:
                return  # (kept until the sink passes it: checked again meanwhile)
            # (behind the sink: checked if it could be — one trimmed or pruned never can)
        if position.after_mark is not None and applied > 0:
            self.meta.record_source_mark(name, applied, position.after_mark)

    def _mark_copied_rows(self, running: _Running, ranges: Sequence[RangeProgress]) -> None:
        """At the end of a snapshot, mark the newest commit whose rows it copied (retest
        QA: restored from a backup taken while the table was being copied, a source's new
        commits reused the cids of rows already copied, whose versions then made the
        change log's be skipped; the registration's commit, in both histories, told
        nothing)."""
        newest = max((r.current_snapshot_version or 0 for r in ranges), default=0)
        if newest <= 0:
            return
        # (min_cid: a cluster follower behind waits or passes to the next node; a
        # standalone node answers 409 at once, the cid being another history's)
        position = self._mark_position(running, newest, min_cid=newest)
        if position is not None and position.after_mark is not None:
            self.meta.record_source_mark(running.subscription.name, newest, position.after_mark)

    @staticmethod
    def _mark_position(
        running: _Running, cid: int, *, min_cid: int | None = None
    ) -> Position | None:
        """The source's position after ``cid``, for the mark of that commit; None once the
        change log was pruned past it (the mark cannot be asked then: whatever needs those
        changes finds out and copies the table again, as before marks)."""
        table = running.subscription.table_name
        try:
            return running.client.position(table, after=cid, max_events=1, min_cid=min_cid)
        except PositionUnavailableError:
            return None

    def _null_key_changes(self, running: _Running, events: pa.Table) -> pa.Table | None:
        """The batch's events a mirror can apply, as to rows with NULL in their key (a
        mirror cannot hold one): a delete is dropped (no such row is in the mirror); an
        upsert re-copies the table instead (None), and that snapshot fails, naming the
        rows, while such rows are at the source. Skipping the upsert would leave the
        mirror short of the row, silently: NULL tells no row of that key from another."""
        sink = running.sink
        assert sink is not None
        if sink.kind != "mirror" or getattr(sink, "holds_null_keys", False):
            return events
        nulls = null_key_mask(running.spec, events)
        if nulls is None:
            return events
        upserts = pc.and_(nulls, pc.not_equal(events[OP_COLUMN], OP_DELETE))
        if pc.any(upserts).as_py():
            log.warning(
                "subscription %s: %d change(s) of rows with NULL in the primary key, which "
                "the mirror cannot hold: re-snapshotting (it waits until those rows have "
                "keys at the source)",
                running.subscription.name, pc.sum(upserts).as_py(),
            )  # fmt: skip
            self._register(running, restart=True)
            return None
        return events.filter(pc.invert(nulls))

    def _skip_deleted_later(
        self,
        running: _Running,
        events: pa.Table,
        batch: ChangeBatch,
        refused: UnstorableKeyError,
    ) -> pa.Table:
        """The batch without the changes of rows the sink refused to store (a key longer
        than it holds) that a later commit deletes at the source: such a row can be in the
        sink at no point, and skipping it until its delete (which the sink skips too)
        leaves the sink as it would be. Re-raises ``refused`` when none is deleted later:
        the subscription waits, failing with that error, for the fix it asks for."""
        gone = self._deleted_later(running, {tuple(k) for k in refused.keys}, after=batch.end_cid)
        if not gone:
            raise refused
        log.warning(
            "subscription %s: %d row(s) the sink cannot store are deleted at the source "
            "later on; their changes until then are skipped",
            running.subscription.name, len(gone),
        )  # fmt: skip
        keys = zip(*(events[k].to_pylist() for k in running.spec.key), strict=True)
        keep = [key not in gone for key in keys]
        return events.filter(pa.array(keep, pa.bool_()))

    def _deleted_later(self, running: _Running, keys: set[Key], *, after: int) -> set[Key]:
        """Which of ``keys`` a commit after cid ``after`` deletes at the source: the
        table's change log read on from there to the head, a batch's worth at a time."""
        state = running.state
        wanted = frozenset(keys)
        scan = state.key_scan
        if scan is None or scan.start != after or not wanted <= scan.keys:
            known = scan.keys if scan is not None and scan.start == after else frozenset()
            scan = state.key_scan = KeyScan(after, known | wanted, after)
        limit = int(running.subscription.options.get("max_events", DEFAULT_MAX_EVENTS))
        while not wanted <= scan.deleted:
            page = running.client.changes(running.spec.name, after=scan.scanned, limit=limit)
            deletes = page.table.filter(pc.equal(page.table[OP_COLUMN], OP_DELETE))
            columns = [deletes[k].to_pylist() for k in running.spec.key]
            scan.deleted.update(k for k in zip(*columns, strict=True) if k in scan.keys)
            if page.end_cid <= scan.scanned or page.end_cid >= page.last_cid:
                scan.scanned = max(scan.scanned, page.end_cid)
                break  # the head: what is not deleted by now is still there
            scan.scanned = page.end_cid
        return set(wanted & scan.deleted)

    def _parquet_round(self, running: _Running, after: int) -> bool:
        """The change log is one structured-streaming query: run it to the head
        (until caught up) or keep it running, and record where it got.

        The query's columns are the table's when it started; its source stops it at the
        first event of a column added since (``parquet_log``), so no event is written
        without one. The source's table is followed as for the other sinks: a column
        added starts the query again with it; one with a DEFAULT starts the log over."""
        assert running.parquet is not None
        sub, state = running.subscription, running.state
        if self._check_schema(running, force=running.query is None):
            return True  # a column with a default: the log starts over
        if running.query is None:
            # the source's commit the log was written through, checked before the query
            # reads what follows it (review: after the query, the mark of its new position
            # was all there was to compare — a restored older history's changes were in)
            position = self._mark_position(running, after)
            if position is not None:
                _check_not_behind(sub.name, position.last_cid, after)
                self._check_same_history(running, after, position)
            options = self._source_options(sub) | {
                "starting_cid": str(after),
                "subscription": sub.name,
                "max_events": str(sub.options.get("max_events", DEFAULT_MAX_EVENTS)),
            }
            running.query = parquet_log.start_changes(
                self.spark,
                options,
                running.parquet,
                available_now=self._available_now,
                interval_seconds=self.poll_interval,
            )
            state.query_started = time.monotonic()
        query = running.query
        if self._available_now:
            # its end (an error too, which exception() gives below)
            with contextlib.suppress(Exception):
                query.awaitTermination()
            running.query = None
        failure = query.exception()
        if failure is not None:
            running.query = None
            columns = running.spec.column_names
            error = worker_error(failure)
            log.debug("subscription %s: the change log's query failed: %s", sub.name, failure)
            if not isinstance(error, PositionUnavailableError) and self._hold_expired(running):
                error = PositionUnavailableError(
                    f"subscription {sub.name}: its hold on the source expired ({error})"
                )
            if isinstance(error, PositionUnavailableError):
                raise error from failure  # _step takes a new snapshot
            if self._check_schema(running) or running.spec.column_names != columns:
                return True  # stopped by an added column: started again with it
            raise SinkError(f"parquet change log {running.parquet.path}: {error}") from failure
        cid = parquet_log.applied_cid(query)
        if cid is not None and cid > after:
            self.meta.record_log_position(sub.name, cid)
            state.applied_cid = cid
        # behind only while the table has events not applied: an idle stream follows the
        # head now and then (datasource.IDLE_BATCH_INTERVAL), and other tables' commits
        # are no lag (QA: an idle table's log showed a lag growing to 30 s)
        try:
            position = running.client.position(
                sub.table_name, after=state.applied_cid, max_events=1
            )
        except PositionUnavailableError:
            held = self._held_cid(running)
            if held is None or held <= state.applied_cid:
                raise
            # the stream moves the hold (and the node prunes to it) as Spark commits a
            # batch, before the position is recorded here: a query started again (an added
            # column, a restart after kill -9) reports none until its first batch, and the
            # recorded one was pruned. The log holds everything up to the hold (CI: the
            # 410 started the whole log over, its change files deleted)
            self.meta.record_log_position(sub.name, held)
            state.applied_cid = held
            position = running.client.position(sub.table_name, after=held, max_events=1)
        state.source_cid = position.last_cid
        _check_not_behind(sub.name, position.last_cid, state.applied_cid)
        self._check_same_history(running, state.applied_cid, position)
        if position.events == 0:
            state.behind_since = None
        elif state.behind_since is None:
            state.behind_since = time.monotonic()
        return False

    def _check_hold_during_snapshot(
        self, running: _Running, ranges: Sequence[RangeProgress]
    ) -> None:
        """PositionUnavailableError (re-snapshot) once the node has dropped the hold while
        the table was being copied: the changes since the copy began are gone, so the rest
        of the copy would be wasted (before, it was found out only after the copy)."""
        now = time.monotonic()
        if now - running.hold_checked < HOLD_CHECK_INTERVAL:
            return
        running.hold_checked = now
        if not self._hold_expired(running):
            return
        done = sum(1 for r in ranges if r.done)
        cap = running.retention_cids
        raise PositionUnavailableError(  # (logged after the subscription's name)
            f"its hold on the source expired while the table was being copied ({done} of "
            f"{len(ranges)} ranges done): the node keeps "
            f"{cap if cap is not None else 'a limited number of'} commits behind a hold, and "
            "a copy that takes longer than the source needs to make them never ends — raise "
            "the node's --retention-cids"
        )

    @staticmethod
    def _hold(running: _Running) -> Hold | None:
        """This subscription's hold on the node; None when it has none, or cannot be
        asked (the caller's own error says more)."""
        try:
            return running.client.subscriptions().get(running.subscription.name)
        except LitecdcError:
            return None

    def _held_cid(self, running: _Running) -> int | None:
        """The cid of this subscription's hold on the node, unless it is gone or expired."""
        hold = self._hold(running)
        return None if hold is None or hold.expired else hold.cid

    def _hold_expired(self, running: _Running) -> bool:
        """Whether the node dropped this subscription's hold (past its retention cap)."""
        hold = self._hold(running)
        return hold is not None and hold.expired

    def _move_hold(self, running: _Running, cid: int, *, applied: bool) -> None:
        """Let the node prune what the sink has applied. Moving the hold is itself a
        commit on the node, so it is done after batches that carried events (at most
        every HOLD_INTERVAL seconds) and otherwise only every IDLE_HOLD_INTERVAL — an idle
        subscription must not keep writing to an idle source — or once it trails by a
        quarter of the node's retention cap (a busy source: it would expire first)."""
        now = time.monotonic()
        every = HOLD_INTERVAL if applied else IDLE_HOLD_INTERVAL
        cap = running.retention_cids
        far = cap is not None and cid - running.hold_cid >= max(cap // 4, 1)
        if cid <= running.hold_cid or (now - running.hold_moved < every and not far):
            return
        try:
            running.client.progress(running.subscription.name, cid)
        except NotFoundError as exc:
            raise _history_replaced(
                running.subscription.name, "the node has no hold for it"
            ) from exc
        running.hold_cid, running.hold_moved = cid, now

    # -- reading through Spark -----------------------------------------------------------
    @staticmethod
    def _source_options(sub: Subscription) -> dict[str, str]:
        options = {
            "url": ",".join(sub.sources),
            "table": sub.table_name,
            "page_rows": str(sub.options.get("page_rows", DEFAULT_PAGE_ROWS)),
        }
        for key in ("user", "password", "ca_cert"):
            if sub.options.get(key):
                options[key] = str(sub.options[key])
        return options

    def _reader(self, running: _Running) -> DataFrameReader:
        reader = self.spark.read.format("litecdc")
        for key, value in self._source_options(running.subscription).items():
            reader = reader.option(key, value)
        return reader

    def _read(self, running: _Running, options: dict[str, str]) -> pa.Table:
        reader = self._reader(running)
        for key, value in options.items():
            reader = reader.option(key, value)
        table: pa.Table = reader.load().toArrow()
        return table

    def _read_ranges(
        self, running: _Running, ranges: list[KeyRange], min_cid: int
    ) -> tuple[pa.Table, dict[int, tuple[int, int]]]:
        """The rows of whole key ranges, one Spark partition each, read at ``min_cid`` (the
        snapshot's initial version) or later, and per range (by its index) how many rows
        it held and the highest cid they were read at."""
        from pyspark.sql.functions import spark_partition_id

        reader = self._reader(running).option("ranges", _json([list(r) for r in ranges]))
        reader = reader.option("min_cid", str(min_cid))
        frame = reader.load()
        table: pa.Table = frame.withColumn(_RANGE_COLUMN, spark_partition_id()).toArrow()
        # the partitions are the ranges, in order (counts only: what is read, and so
        # copied, does not depend on it)
        stats = table.group_by(_RANGE_COLUMN, use_threads=False).aggregate(
            [(CID_COLUMN, "count"), (CID_COLUMN, "max")]
        )
        per_range = {
            int(index): (int(count), int(cid))
            for index, count, cid in zip(
                stats[_RANGE_COLUMN].to_pylist(),
                stats[f"{CID_COLUMN}_count"].to_pylist(),
                stats[f"{CID_COLUMN}_max"].to_pylist(),
                strict=True,
            )
        }
        return table.drop_columns([_RANGE_COLUMN]), per_range

    # -- schema changes at the source ----------------------------------------------------
    def _check_schema(self, running: _Running, *, force: bool = True) -> bool:
        """Follow the source table's columns; True when that needs a re-snapshot."""
        now = time.monotonic()
        if not force and now - running.spec_checked < SCHEMA_CHECK_INTERVAL:
            return False
        running.spec_checked = now
        info = running.client.table_info(
            running.subscription.table_name, min_cid=running.spec_cid or None
        )
        running.spec_cid = max(running.spec_cid, info.last_cid)
        spec = named_as(info.spec, running.subscription.table_name)
        check_followable(running.spec, spec)  # running.spec: the description recorded
        reason = _recopy_reason(running.spec, info, running.init_cid)
        if reason is not None:
            # rows changed without any row change: copy them again. The re-snapshot is
            # recorded before the new description (_register evolves the sink after it),
            # so a crash in between decides the same on restart
            log.info("subscription %s: %s; re-snapshotting", running.subscription.name, reason)
            self._drain_log_sink(running)
            self._register(running, restart=True)
            return True
        self._evolve(running, spec)
        return False

    def _drain_log_sink(self, running: _Running) -> None:
        """Before a message sink's re-copy: send the changes it has not had yet. The new
        snapshot sends every row there is, but a row deleted since would get no message,
        and consumers rebuilding the table would keep it (pipeline QA: 10 deletes lost).
        A mirror needs none of this: its re-copy sweeps the rows the snapshot lacks."""
        sink, name = running.sink, running.subscription.name
        progress = self.meta.progress(name)
        if sink is None or sink.kind != "log" or progress.stage != "incremental":
            return
        self._registered(running, progress.init_snapshot_version)  # ids as on every send
        table = running.spec.name
        known = running.spec.change_schema().names
        max_events = int(running.subscription.options.get("max_events", DEFAULT_MAX_EVENTS))
        after = progress.last_log_index or 0
        try:
            while True:
                position = running.client.position(table, after=after, max_events=max_events)
                end = position.end_cid
                if after < position.unlogged_cid <= end:
                    # up to the commit that changed rows without row changes (the reason
                    # for the re-copy, perhaps): the node refuses changes across it
                    end = position.unlogged_cid - 1
                if end <= after:
                    return
                first = position.first_cid
                if first is not None and first <= end and first < position.reshaped_cid:
                    # the node serves a table's events in its shape of today, so not those
                    # of before its reshape (QA: this read failed the subscription on
                    # every retry, and it was never copied again)
                    log.warning(
                        "subscription %s: its changes after cid %d are of the table before "
                        "its reshape at cid %d, which the source cannot serve; consumers "
                        "learn of rows deleted meanwhile from the new snapshot's end",
                        name, after, position.reshaped_cid,
                    )  # fmt: skip
                    return
                if position.events and (first is None or first <= end):
                    options = {"mode": "changes", "after_cid": str(after)}
                    events = self._read(running, {**options, "until_cid": str(end)})
                    # the new column's values come with the re-copy; the sink knows the old
                    events = events.select([n for n in events.column_names if n in known])
                    applicable = self._null_key_changes(running, events)
                    if applicable is None:
                        return
                    sink.write_changes(applicable, ChangeBatch(name, after, end))
                self.meta.record_log_position(name, end)
                after = end
                log.info("subscription %s: sent its changes through cid %d before the re-copy",
                         name, after)  # fmt: skip
                if end >= position.last_cid or end < position.end_cid:
                    return
        except Exception as exc:
            error = worker_error(exc)
            if not isinstance(error, PositionUnavailableError):
                raise
            # the node pruned them (an expired hold): the re-copy goes on, and its
            # snapshot_done tells consumers which rows are gone (QA: raised here, the
            # subscription failed on every retry and never re-copied)
            log.warning(
                "subscription %s: the changes after cid %d are gone from the source (%s); "
                "consumers learn of rows deleted meanwhile from the new snapshot's end",
                name, after, error,
            )  # fmt: skip

    def _evolve(self, running: _Running, spec: TableSpec) -> None:
        """Take a new description of the table: the sink follows it, and it is recorded."""
        if [(c.name, c.arrow) for c in spec.columns] == [
            (c.name, c.arrow) for c in running.spec.columns
        ] and spec.key == running.spec.key:
            running.spec = spec
            return
        check_followable(running.spec, spec)
        if running.parquet is not None:
            parquet_log.check_names(running.parquet, spec)
        added = spec.added_columns(running.spec)
        if running.sink is not None:
            running.sink.evolve(spec)
        if running.query is not None:  # a Parquet log: the next query has the new columns
            running.query.stop()
            running.query = None
        running.spec = spec
        self._mirrors(running.subscription.name, spec)
        log.info(
            "subscription %s: source added column(s) %s; the sink follows",
            running.subscription.name, ", ".join(c.name for c in added),
        )  # fmt: skip


def _cancelled_read(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is Spark's word that a step's job was cancelled
    with its group (``_cancel_reads``)."""
    seen: BaseException | None = exc
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if f"cancelled part of cancelled job group {JOB_GROUP_PREFIX}" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _release_hold(sub: Subscription) -> None:
    """Release ``sub``'s hold on its source (none there — never registered, released
    already — is no error)."""
    with (
        SourceClient(list(sub.sources), **_auth(sub.options)) as client,
        contextlib.suppress(NotFoundError),
    ):
        client.unsubscribe(sub.name)


def _history_replaced(name: str, what: str, *, may_catch_up: bool = True) -> SourceError:
    """The source no longer continues the history the mirror follows (QA: a node rebuilt
    from an older backup had no hold and its head behind the applied cid; its changes were
    taken for the old history's and the mirror stayed wrong, `status` saying lag 0). A new
    copy cannot fix it either: the mirror's versions are the old history's cids, and the
    version guard would keep them. The subscription fails until rebuilt. (No "subscription
    NAME:" in front: every place that shows it says whose it is — it was there twice.)"""
    maybe = (
        " — unless it is a cluster node still catching up, for a moment (the run retries) —"
        if may_catch_up
        else ","
    )
    return SourceError(
        f"{what}: the source's database was replaced (a restored backup, a new data "
        f"directory) or the subscription's hold deleted there{maybe} so its changes may not "
        "follow what the mirror holds; rebuild the mirror: `litecdc pipeline unsubscribe "
        f"{name}`, empty or drop the mirror, and subscribe again"
    )


def _check_not_behind(name: str, head: int, applied: int) -> None:
    if head < applied:
        raise _history_replaced(
            name,
            f"the source's head (cid {head}) is behind what it applied (cid {applied})",
        )


def _same_subscription(a: Subscription, b: Subscription) -> bool:
    """Whether ``a`` and ``b`` are one subscription: the same definition, added at the
    same moment (one re-created under the name has its own ``created_at``)."""
    return a.created_at == b.created_at and a.same_definition(b)


def _recopy_reason(mirrored: TableSpec | None, info: TableInfo, init_cid: int | None) -> str | None:
    """Why the sink's copy of the table is stale although the table can be followed
    (``check_followable``), or None: DDL changed its rows without any row change. A
    column with a DEFAULT was added to the description the sink mirrors (``mirrored``),
    or the table was *reshaped* after the copy began at ``init_cid`` (the registration):
    dropped and created again (the copy keeps rows the new table does not have), a column
    dropped or renamed (and added again under its name and type, which looks the same:
    the copy keeps the old values in it). The node records when (``reshaped_cid``, 0 for
    a table it has no record of: nothing to compare)."""
    if mirrored is not None and _need_recopy(info.spec.added_columns(mirrored)):
        return "a column with a default was added"
    if init_cid is not None and info.reshaped_cid > init_cid:
        return (
            f"the table was reshaped at cid {info.reshaped_cid} (created again, or a column "
            f"dropped or renamed), after its copy began at cid {init_cid}"
        )
    return None


def _need_recopy(added: list[Column]) -> bool:
    """Whether columns the source added (to the description the sink mirrors) have a
    DEFAULT: SQLite gave existing rows that value without any row change, so only a new
    snapshot brings it to the sink — a mirror's rows, or a log's consumers."""
    # (the node counts such a column's commit as changing rows without row changes the
    # same way, db/reshape.py: a change read across it is refused, and the re-copy is
    # what brings it)
    return any(gives_rows_a_value(column.default) for column in added)


#: the line a Python traceback ends with: ``module.Class: message``
_ERROR_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*): (?P<message>.*)$", re.MULTILINE)
_TRACEBACK = "Traceback (most recent call last):"


def worker_error(exc: BaseException) -> BaseException:
    """The error a Python worker of Spark raised, out of the exception Spark wraps it in
    (``PythonException``, ``StreamingQueryException``: the whole traceback, the query's
    plan…): a litecdc error as itself (its one-line message, its class — a 410 from the
    source stays a PositionUnavailableError), another as a PipelineError of its last
    line. ``exc`` itself when it is no Spark error."""
    if not type(exc).__module__.startswith(("pyspark.", "py4j.")):
        return exc
    text = str(exc)
    found = [m for m in _ERROR_LINE.finditer(text) if m["name"].startswith("litecdc.errors.")]
    if found:
        name, message = found[-1]["name"].rsplit(".", 1)[1], found[-1]["message"]
        kind = getattr(errors, name, None)
        if isinstance(kind, type) and issubclass(kind, LitecdcError):
            with contextlib.suppress(TypeError):  # one whose constructor wants more
                return kind(message)
        return PipelineError(message)
    if _TRACEBACK in text:
        last = text.rsplit(_TRACEBACK, 1)[1]
        line = next((x for x in last.splitlines() if x and not x[0].isspace()), None)
        if line is not None:
            return PipelineError(line.strip())
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return PipelineError(f"{type(exc).__name__}: {first}")


def null_key_mask(spec: TableSpec, rows: pa.Table) -> pa.ChunkedArray | None:
    """Which rows (or events) hold a NULL in a key column; None when none does."""
    mask: Any = None
    for k in spec.key:
        column = pc.is_null(rows[k])
        mask = column if mask is None else pc.or_(mask, column)
    if mask is None or not rows.num_rows or not pc.any(mask).as_py():
        return None
    return mask


def check_null_keys(spec: TableSpec, rows: pa.Table, sink: Sink) -> None:
    """SchemaMismatchError when snapshot ``rows`` hold keys with NULLs that ``sink``
    cannot keep apart. SQLite lets a rowid table's PRIMARY KEY other than INTEGER
    PRIMARY KEY hold NULLs, in several rows (the rows of one key are always read in the
    same round: ranges are cut between keys). A mirror keeps rows by their key: one with
    a NULL in it identifies no row (a sink saying ``holds_null_keys`` keeps one row per
    such key); a message sink sends them, but two rows of one key would get the same
    key and snapshot message id (a broker drops all but one)."""
    nulls = null_key_mask(spec, rows)
    if nulls is None:
        return
    found = rows.filter(nulls)
    keys = list(zip(*(found[k].to_pylist() for k in spec.key), strict=True))
    where = f"table {spec.name}"
    columns = ", ".join(spec.key)
    what = type(sink).__name__.removesuffix("Sink").lower() or "sink"
    if sink.kind == "mirror" and not getattr(sink, "holds_null_keys", False):
        raise SchemaMismatchError(
            f"{where}: {len(keys)} row(s) have NULL in the primary key ({columns}), e.g. "
            f"key {encode_key(list(keys[0]))}; SQLite allows that in a rowid table's PRIMARY "
            f"KEY other than INTEGER PRIMARY KEY, but the {what} mirror keeps rows by their "
            "key and NULL identifies none: give those rows a key at the source, or delete "
            "them, and the subscription goes on"
        )
    counts = Counter(keys)
    shared = next((k for k, n in counts.items() if n > 1), None)
    if shared is not None:
        reason = (
            "a mirror keeps one row per key"
            if sink.kind == "mirror"
            else "their messages would carry the same key and de-duplication id, and all "
            "but one would be dropped"
        )
        raise SchemaMismatchError(
            f"{where}: {counts[shared]} rows share the key {encode_key(list(shared))} "
            f"(NULL in the primary key ({columns}), which SQLite allows in several rows); "
            f"the {what} sink cannot tell them apart ({reason}): give those rows keys of "
            "their own at the source and the subscription goes on"
        )


def chunk_count(rows: int, partitions: int, page_rows: int) -> int:
    """How many key ranges a snapshot of about ``rows`` rows is cut into: one per
    ``page_rows`` rows, at least ``partitions`` (read in parallel), at most MAX_CHUNKS
    (the node's limit; a larger table gets larger chunks)."""
    wanted = -(-rows // max(page_rows, 1))
    return max(1, min(MAX_CHUNKS, max(partitions, wanted)))


def _auth(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "user": options.get("user") or None,
        "password": options.get("password") or None,
        "ca_cert": options.get("ca_cert") or None,
    }


def _json(value: Any) -> str:
    return json.dumps(value)
