"""The CDC push service: every captured row change, delivered to a webhook.

Design (rqlite's CDC service, made loss-free by litecdc's storage):

* The durable FIFO queue is ``_litecdc_changes`` itself, written in the same SQLite
  transaction as the data: nothing can be lost between commit and queue.
* A reader thread takes whole transactions' changes, up to ``max_batch_size`` transactions
  (as rqlite counts log entries) or what arrived within ``max_batch_delay`` of the first,
  and — only while this node is the
  leader — sends the batch, retrying per the policy. A batch that exhausts its attempts
  is dropped, counted and logged.
* The leader keeps the high watermark (HWM: the highest cid delivered or dropped) in
  memory; every ``high_watermark_interval`` it writes it through the log as an internal
  entry, and applying that entry deletes the changes at or below it on every node.
* On becoming leader a node resends everything above the persisted HWM, so delivery is
  at least once; duplicates appear only around leadership changes or when an endpoint
  accepted a batch whose answer was lost. Every event carries its cid.

The service depends on two narrow interfaces: :class:`ChangeFeed` (the queue) and
:class:`Leadership` (is-leader, leadership changes, write through the log).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Protocol

from litecdc.cdc.config import CDCConfig, redact_endpoint
from litecdc.cdc.envelopes import ENVELOPES, large_transaction_body
from litecdc.cdc.sinks import Sink, TransmitError, Withdrawn, create_sink
from litecdc.db.schema import (
    CREATE_CDC_STATE,
    DEFAULT_RETENTION_CIDS,
    high_watermark_sql,
)
from litecdc.results import RowChange

log = logging.getLogger("litecdc.cdc")

#: how long the reader sleeps between checks when idle or not the leader (also bounds how
#: long stop() waits for it)
IDLE_WAIT_SECONDS = 0.1
#: failure lines (retries, drops) logged per RETRY_LOG_INTERVAL seconds at most; the
#: next line counts those left out
LINES_PER_WINDOW = 3
RETRY_LOG_INTERVAL = 10.0


class ChangeFeed(Protocol):
    def read_transactions(
        self,
        after: int,
        max_transactions: int,
        max_events: int | None = None,
        *,
        oversize_first: bool = True,
    ) -> tuple[list[RowChange], bool]: ...
    def next_transaction(self, after: int) -> tuple[int, int] | None: ...
    def transaction_changes(self, cid: int, after_seq: int, limit: int) -> list[RowChange]: ...
    def wait_for_commit_after(self, cid: int, timeout: float) -> bool: ...
    def last_cid(self) -> int: ...
    def cdc_high_watermark(self) -> int | None: ...
    def pruned_cid(self) -> int: ...
    def queue_stats(self, after: int = 0) -> tuple[int, int | None]: ...


class Leadership(Protocol):
    def is_leader(self) -> bool: ...
    def add_listener(self, callback: Callable[[bool], None]) -> None: ...
    def write_internal(self, query: str) -> int: ...


@dataclass(frozen=True)
class _Large:
    """The next transaction, too large to share a batch (more than max_batch_events)."""

    cid: int
    changes: int


@dataclass
class Counters:
    sent_events: int = 0
    sent_batches: int = 0
    retries: int = 0
    failed_requests: int = 0
    dropped_events: int = 0
    dropped_batches: int = 0
    skipped_events: int = 0  # filtered out by table_filter
    #: failures of the reader itself, outside a request (reading the queue, taking over);
    #: each is logged, shown in last_error and retried after the retry policy's wait
    reader_errors: int = 0
    #: commits above the high watermark whose changes were pruned before they were sent
    #: (the node ran without this webhook meanwhile): they cannot be sent any more
    pruned_unsent_cids: int = 0


class CDCService:
    """Reads the change queue and delivers it, leader-only, at least once."""

    def __init__(
        self,
        config: CDCConfig,
        feed: ChangeFeed,
        leadership: Leadership,
        *,
        node_id: str,
        sink: Sink | None = None,
        retention_cids: int = DEFAULT_RETENTION_CIDS,
    ) -> None:
        self.config = config
        self._retention_cids = retention_cids
        self._feed = feed
        self._leadership = leadership
        self._node_id = node_id
        self._sink = sink if sink is not None else create_sink(config)
        self._envelope = ENVELOPES[config.format]
        self._stop = threading.Event()
        self._leadership_changed = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.counters = Counters()
        self._pruned_counted_through = 0  # (pruned_unsent_cids: counted up to this cid)
        #: cid after which the reader reads next; None until this node leads
        self._position: int | None = None
        self._hwm = 0
        self._persisted_hwm = 0
        self._last_hwm_write = 0.0
        self._last_error: str | None = None
        #: failure lines left out since the last one logged; the current log window
        self._failures_unlogged = 0
        self._log_window_start = 0.0
        self._log_window_lines = 0
        leadership.add_listener(self._on_leadership)

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="litecdc-cdc", daemon=True)
        self._thread.start()
        log.info(
            "CDC service started: %s (%s envelope)",
            redact_endpoint(self.config.endpoint),
            self.config.format,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sending — a request in flight is ended, not waited for (it is resent after
        a restart) —, then persist the HWM reached so a restart resends as little as
        possible."""
        self._stop.set()
        self._leadership_changed.set()
        abort = getattr(self._sink, "abort", None)  # (optional for a registered sink)
        if abort is not None:
            abort()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._write_hwm(force=True)
        self._sink.close()

    def _on_leadership(self, leader: bool) -> None:
        if not leader:
            with self._lock:
                self._position = None  # resend from the persisted HWM when leading again
                # (QA: a node that lost the lead kept showing its last failure for good,
                # while the new leader delivered everything)
                self._last_error = None
        self._leadership_changed.set()

    # -- the reader ------------------------------------------------------------------------
    def _run(self) -> None:
        failures = 0  # in a row
        last_failure = ""
        while not self._stop.is_set():
            try:
                self._step()
                failures = 0
            except Exception as exc:  # keep delivering: a bug in one batch must not stop CDC
                if self._stop.is_set():
                    break
                failures += 1
                error = f"{exc.__class__.__name__}: {exc}"
                # the retry policy's wait, but never a busy loop (a zero backoff)
                delay = max(self.config.backoff(failures), IDLE_WAIT_SECONDS)
                with self._lock:
                    self.counters.reader_errors += 1
                    self._last_error = f"reader failed: {error}"
                if error != last_failure:  # the traceback once, not at every retry
                    log.exception("CDC reader failed; retrying in %.2fs", delay)
                else:
                    log.error(
                        "CDC reader failed again (%d in a row): %s; retrying in %.2fs",
                        failures,
                        error,
                        delay,
                    )
                last_failure = error
                self._position = None  # resume from the persisted HWM
                self._stop.wait(delay)

    def _step(self) -> None:
        if not self._leadership.is_leader():
            self._position = None
            self._leadership_changed.wait(IDLE_WAIT_SECONDS)
            self._leadership_changed.clear()
            return
        if self._position is None:
            self._take_over()
        batch = self._collect()
        if isinstance(batch, _Large):
            self._deliver_large(batch)
        elif batch:
            self._deliver(batch)
        self._write_hwm()

    def _take_over(self) -> None:
        """Becoming leader: make sure the state table exists, resume above the persisted HWM."""
        hwm = self._feed.cdc_high_watermark()
        if hwm is None:
            # A webhook's first start: it begins with what the change log holds now (the
            # node may have pruned by --retention-cids before). Recorded at once, so that
            # what is pruned later without it (a restart without --cdc-config) is told
            # from what it never had (review: a first start warned of a loss).
            self._leadership.write_internal(CREATE_CDC_STATE)
            start = self._feed.pruned_cid()
            self._leadership.write_internal(high_watermark_sql(start, self._retention_cids))
            hwm = start
        pruned = self._feed.pruned_cid()
        with self._lock:
            self._persisted_hwm = hwm
            # what was pruned counts as passed, like a dropped batch: the next high
            # watermark entry records it, and a later take-over does not count it again
            self._hwm = self._position = max(hwm, pruned)
            counted = max(hwm, self._pruned_counted_through)
            if pruned > counted:
                self.counters.pruned_unsent_cids += pruned - counted
                self._pruned_counted_through = pruned
        if pruned > hwm:
            # (QA: the log said "sending everything above cid 0" and nothing counted the
            # gap) a node run without --cdc-config meanwhile pruned them by --retention-cids
            log.warning(
                "CDC: leading; the changes of cids %d to %d were pruned before this webhook "
                "sent them (the node ran without it meanwhile) and cannot be sent; "
                "sending everything above cid %d",
                hwm + 1,
                pruned,
                pruned,
            )
        else:
            log.info("CDC: leading; sending everything above cid %d", hwm)

    def _collect(self) -> list[RowChange] | _Large:
        """Whole transactions: up to max_batch_size of them, or what came within the delay;
        a transaction of more than max_batch_events changes alone, as a ``_Large``."""
        config = self.config
        position = self._position
        if position is None:  # (the lead was lost since _step looked: it takes over again)
            return []
        events: list[RowChange] = []
        transactions = 0
        first_at: float | None = None
        while not self._stop.is_set() and self._leadership.is_leader():
            seen = self._feed.last_cid()
            new, limited = self._feed.read_transactions(
                position,
                config.max_batch_size - transactions,
                max(config.max_batch_events - len(events), 0),
                oversize_first=False,
            )
            if not new and limited and not events:
                # the next transaction alone has more than max_batch_events changes
                found = self._feed.next_transaction(position)
                if found is not None:
                    return _Large(*found)
            if new:
                events.extend(new)
                transactions += len({change.cid for change in new})
                position = new[-1].cid
                if first_at is None:
                    first_at = time.monotonic()
                if limited:
                    break  # full: send it
                continue
            if limited:
                break  # the next transaction does not fit: send what we have
            if first_at is None:
                # idle: wait for the next commit (or a leadership change) and look again
                self._feed.wait_for_commit_after(seen, IDLE_WAIT_SECONDS)
                return events
            remaining = first_at + config.max_batch_delay - time.monotonic()
            if remaining <= 0:
                break
            # in slices: the loop's check of stop and leadership must come round often
            # (QA: a batch waiting out a 1 min max_batch_delay held shutdown 10 s)
            self._feed.wait_for_commit_after(seen, min(remaining, IDLE_WAIT_SECONDS))
        return events

    def _deliver(self, batch: list[RowChange]) -> None:
        config = self.config
        pattern = config.table_filter
        wanted = batch if pattern is None else [c for c in batch if pattern.fullmatch(c.table)]
        first_cid, last_cid = batch[0].cid, batch[-1].cid
        if wanted:
            body = self._envelope(
                wanted,
                node_id=self._node_id,
                service_id=config.service_id,
                row_ids_only=config.row_ids_only,
            )
            if not self._send(body, first_cid, last_cid, len(wanted), batch[-1].timestamp_ms):
                return  # not delivered: the next leader (or restart) resends it
        self._delivered(last_cid, skipped=len(batch) - len(wanted))

    def _deliver_large(self, large: _Large) -> None:
        """One transaction of more than max_batch_events changes, in one request (a
        transaction is never split: rqlite consumers take its ``index`` as done), its body
        built a page of max_batch_events changes at a time."""
        config = self.config
        pattern = config.table_filter
        page_size = config.max_batch_events
        log.info(
            "CDC: transaction cid %d has %d changes (max_batch_events %d): sent alone",
            large.cid,
            large.changes,
            page_size,
        )

        committed_ms = 0  # (the commit's timestamp, for the message id)

        def pages() -> Iterator[list[RowChange]]:
            nonlocal committed_ms
            after_seq = 0
            while True:
                page = self._feed.transaction_changes(large.cid, after_seq, page_size)
                if not page:
                    return
                after_seq, committed_ms = page[-1].seq, page[-1].timestamp_ms
                yield page if pattern is None else [c for c in page if pattern.fullmatch(c.table)]

        body, wanted = large_transaction_body(
            config.format,
            pages(),
            node_id=self._node_id,
            service_id=config.service_id,
            row_ids_only=config.row_ids_only,
        )
        if wanted and not self._send(body, large.cid, large.cid, wanted, committed_ms):
            return
        self._delivered(large.cid, skipped=large.changes - wanted)

    def _delivered(self, last_cid: int, *, skipped: int) -> None:
        """Everything up to ``last_cid`` was sent (or dropped, or filtered out)."""
        with self._lock:
            self.counters.skipped_events += skipped
            self._hwm = max(self._hwm, last_cid)
            if self._position is not None:  # (None: the lead was lost; take over again)
                self._position = last_cid

    def _send(
        self, body: bytes, first_cid: int, last_cid: int, events: int, last_commit_ms: int
    ) -> bool:
        """Send one batch per the retry policy: True once it is delivered or dropped after
        its last attempt, False when stopping or no longer the leader."""
        config = self.config
        # the same on every retry and resend of the batch; the last commit's time tells a
        # batch of cids numbered again (a restore from an older backup, a power cut under
        # --synchronous below full) from the one sent before (QA: the same webhook-id came
        # with another body, and a receiver deduplicating by it dropped new commits)
        message_id = f"{self._node_id}-{first_cid}-{last_cid}-{last_commit_ms}"
        attempt = 0
        while True:
            if self._stop.is_set() or not self._leadership.is_leader():
                return False
            attempt += 1
            try:
                # asked again once the connection is ready (webhook QA: a leader paused
                # during a TLS handshake sent its batch seconds after it lost the lead)
                self._sink.send(body, message_id, may_send=self._leadership.is_leader)
            except Withdrawn:
                return False
            except TransmitError as exc:
                if self._stop.is_set():
                    return False  # ended by stop(): not a failure; resent after a restart
                with self._lock:
                    self.counters.failed_requests += 1
                    self._last_error = str(exc)
                limit = config.transmit_max_retries
                if limit is not None and attempt >= limit:
                    self._log_failure(
                        logging.ERROR,
                        f"CDC: dropping batch of cids {first_cid}-{last_cid} ({events} events) "
                        f"after {attempt} attempts: {exc}",
                    )
                    with self._lock:
                        self.counters.dropped_batches += 1
                        self.counters.dropped_events += events
                    return True
                delay = config.backoff(attempt)
                self._log_failure(
                    logging.WARNING,
                    f"CDC: delivery of cids {first_cid}-{last_cid} failed (attempt {attempt}): "
                    f"{exc}; retrying in {delay:.2f}s",
                )
                with self._lock:
                    self.counters.retries += 1
                self._write_hwm()  # earlier progress still gets persisted
                self._stop.wait(delay)
                continue
            with self._lock:
                self.counters.sent_batches += 1
                self.counters.sent_events += events
                self._last_error = None
            self._log_recovery(first_cid, last_cid)
            return True

    def _log_failure(self, level: int, line: str) -> None:
        """A failed attempt's (or dropped batch's) line: at most LINES_PER_WINDOW of them
        per RETRY_LOG_INTERVAL, the next one counting those left out (ops QA: a line per
        attempt for as long as the endpoint was down — 86 a second with
        transmit_min_backoff 0; review: with a small transmit_max_retries, drops too)."""
        now = time.monotonic()
        if now - self._log_window_start >= RETRY_LOG_INTERVAL:
            self._log_window_start, self._log_window_lines = now, 0
        if self._log_window_lines >= LINES_PER_WINDOW:
            self._failures_unlogged += 1
            return
        self._log_window_lines += 1
        unlogged, self._failures_unlogged = self._failures_unlogged, 0
        more = f" ({unlogged} more failure(s) not logged since the last line)" if unlogged else ""
        log.log(level, "%s%s", line, more)

    def _log_recovery(self, first_cid: int, last_cid: int) -> None:
        """A batch delivered after failures some of whose lines were left out: say how many
        (review: the count was carried to the next outage's first line)."""
        if self._failures_unlogged:
            unlogged, self._failures_unlogged = self._failures_unlogged, 0
            log.info(
                "CDC: delivered cids %d-%d; %d failure(s) before it were not logged",
                first_cid, last_cid, unlogged,
            )  # fmt: skip

    def _write_hwm(self, *, force: bool = False) -> None:
        """Write the HWM through the log when the interval has passed and it moved."""
        now = time.monotonic()
        with self._lock:
            hwm, persisted = self._hwm, self._persisted_hwm
        if hwm <= persisted or not self._leadership.is_leader():
            return
        if not force and now - self._last_hwm_write < self.config.high_watermark_interval:
            return
        # an attempt counts, failed or not: a full disk failed every step's (10 a second,
        # a warning each: full-disk QA); the interval paces the retries too
        self._last_hwm_write = now
        try:
            self._leadership.write_internal(high_watermark_sql(hwm, self._retention_cids))
        except Exception as exc:  # leadership lost, store closing…: try again next time
            log.warning("CDC: could not persist high watermark %d: %s", hwm, exc)
            return
        with self._lock:
            self._persisted_hwm = max(self._persisted_hwm, hwm)

    # -- reporting ------------------------------------------------------------------------
    def status(self) -> dict[str, object]:
        """The /status "cdc" section. The leader reports its own high watermark (ahead of
        the persisted one between writes); any other node the replicated one. The queue
        is what is still to deliver: the changes above the high watermark (delivered ones
        stay stored until the next high watermark entry prunes them)."""
        leading = self._leadership.is_leader()
        with self._lock:
            counters = asdict(self.counters)
            hwm, persisted, error = self._hwm, self._persisted_hwm, self._last_error
            taken_over = self._position is not None
        if not (leading and taken_over):
            hwm = persisted = self._feed.cdc_high_watermark() or 0
        queued, oldest = self._feed.queue_stats(hwm)  # what is still to deliver
        return {
            "endpoint": redact_endpoint(self.config.endpoint),
            "format": self.config.format,
            "is_leader": leading,
            "hwm": hwm,
            "hwm_persisted": persisted,
            "queue_length": queued,
            "oldest_queued_cid": oldest,
            "last_error": error,
            **counters,
        }
