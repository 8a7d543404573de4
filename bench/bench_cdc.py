"""CDC push service: events/s delivered to a local webhook, and commit-to-receipt latency.

The litecdc side runs in this process, as ``litecdc serve`` runs it: a ``Store`` in a
fresh data directory per case (WAL, ``synchronous=FULL``), a ``CDCService`` configured
from a JSON file through ``parse_cdc_config``, and ``StandaloneLeadership``. The GIL
switch interval is set as ``litecdc serve`` sets it. The webhook receiver is a real
HTTP server on 127.0.0.1 in a separate process (stdlib ``ThreadingHTTPServer``,
HTTP/1.1 keep-alive). It parses every rqlite-format body, records (cid, events,
arrival time) and hands its records to this process at the end of each case.

Two workloads:

* **throughput**: ``--events`` single-row inserts in ``--txn-rows``-row transactions,
  with ``max_batch_size`` 100 and 1000 (``--batch-sizes``; it counts transactions per
  POST, as rqlite counts log entries, so the events per POST are printed). *drain*: the
  rows are written with CDC not running, then the service starts; timed from start until
  the receiver holds every event. *concurrent*: the service runs while the rows are
  written; timed from the first write until the last event arrives.
* **latency**: single-row transactions at a steady ``--rate`` per second for
  ``--duration`` seconds (after a warm-up), on an absolute schedule that does not
  drift. Latency = receiver arrival time - the time ``Store.execute`` returned that
  cid. With the default batching (``max_batch_size`` 10, ``max_batch_delay`` 200ms) and
  with ``max_batch_delay`` 20ms.

Every case checks that every event arrived (distinct (cid, new_row_id) pairs, each
cid's event count, the row ids) and prints duplicates.

    .venv/bin/python bench/bench_cdc.py
    .venv/bin/python bench/bench_cdc.py --events 20000 --duration 5 --json
    .venv/bin/python bench/bench_cdc.py --profile   # plus where the CDC thread spends its time
"""

from __future__ import annotations

import cProfile
import http.client
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from common import (
    CREATE_TABLE,
    INSERT,
    add_output_arguments,
    busy_share,
    committed_cid,
    cores,
    cpu_cores,
    data_root,
    function_place,
    load_note,
    machine_busy_idle,
    make_rows,
    new_parser,
    platform_json,
    platform_line,
    process_cpu_seconds,
    profile_entries,
    require_at_least_one,
    sqlite_versions,
    stat_cpu_seconds,
    top_by_own_time,
)

from litecdc import NodeConfig, Statement, Store
from litecdc.cdc import CDCService, ChangeFeed, Leadership, Sink, parse_cdc_config
from litecdc.cdc.sinks import create_sink
from litecdc.http.server import GIL_SWITCH_INTERVAL_S
from litecdc.leadership import StandaloneLeadership
from litecdc.results import RowChange

HOST = "127.0.0.1"
HOOK_PATH = "/hook"
CONTROL_TIMEOUT_S = 30.0  # answers from the receiver's control endpoints
RECEIVER_START_TIMEOUT_S = 30.0
TARGET_EVENTS_PER_S = 20_000
TARGET_P99_MS = 250.0


# -- the webhook receiver (runs in its own process) ---------------------------------------------
class HookEvent(msgspec.Struct):
    op: str
    table: str
    new_row_id: int | None = None
    old_row_id: int | None = None


class HookTransaction(msgspec.Struct):
    index: int
    commit_timestamp: int
    events: list[HookEvent]


class HookBody(msgspec.Struct):
    """rqlite's CDC envelope; before/after images are parsed (validated) but not kept."""

    node_id: str
    payload: list[HookTransaction]


_decode_body = msgspec.json.Decoder(HookBody).decode


class Recorder:
    """What the receiver has seen since the last reset. Guarded by ``lock``."""

    def __init__(self, done: EventType) -> None:
        self.lock = threading.Lock()
        self.done = done
        self.reset(0)

    def reset(self, expect: int) -> None:
        self.expect = expect
        self.requests = 0
        self.bad_requests = 0
        self.first_error = ""
        self.body_bytes = 0
        self.events = 0
        self.seen: set[tuple[int, int]] = set()
        self.row_ids: set[int] = set()
        #: cid -> [events in the first delivery, first arrival, deliveries]
        self.cids: dict[int, list[float]] = {}
        self.first_arrival = 0.0
        self.last_arrival = 0.0

    def record(self, body: bytes, arrival: float) -> str | None:
        try:
            doc = _decode_body(body)
        except msgspec.DecodeError as exc:
            with self.lock:
                self.bad_requests += 1
                self.first_error = self.first_error or f"bad body: {exc}"
            return str(exc)
        with self.lock:
            self.requests += 1
            self.body_bytes += len(body)
            if not self.first_arrival:
                self.first_arrival = arrival
            self.last_arrival = arrival
            for txn in doc.payload:
                known = self.cids.get(txn.index)
                if known is None:
                    self.cids[txn.index] = [float(len(txn.events)), arrival, 1.0]
                else:
                    known[2] += 1
                for event in txn.events:
                    row_id = event.new_row_id if event.new_row_id is not None else event.old_row_id
                    key = (txn.index, -1 if row_id is None else row_id)
                    self.seen.add(key)
                    if row_id is not None:
                        self.row_ids.add(row_id)
                self.events += len(txn.events)
            if self.expect and len(self.seen) >= self.expect:
                self.done.set()
        return None

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": self.requests,
                "bad_requests": self.bad_requests,
                "first_error": self.first_error,
                "body_bytes": self.body_bytes,
                "events": self.events,
                "distinct": len(self.seen),
                "row_ids": len(self.row_ids),
                "row_id_min": min(self.row_ids, default=0),
                "row_id_max": max(self.row_ids, default=0),
                "cids": [[cid, int(v[0]), v[1], int(v[2])] for cid, v in self.cids.items()],
                "first_arrival": self.first_arrival,
                "last_arrival": self.last_arrival,
            }


class HookHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the service reuses one connection
    disable_nagle_algorithm = True
    recorder: Recorder  # set on the class by receiver_main

    def _answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        body = self._body()
        arrival = time.time()
        if parts.path == HOOK_PATH:
            error = self.recorder.record(body, arrival)
            self._answer(400 if error else 200)
        elif parts.path == "/reset":
            expect = int(parse_qs(parts.query).get("expect", ["0"])[0])
            with self.recorder.lock:
                self.recorder.done.clear()
                self.recorder.reset(expect)
            self._answer(200)
        else:
            self._answer(404)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/stats":
            self._answer(200, msgspec.json.encode(self.recorder.stats()))
        else:
            self._answer(404)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: it would cost the receiver CPU per request


def receiver_main(port_out: Connection, done: EventType) -> None:
    """The receiver process: serve until killed."""
    HookHandler.recorder = Recorder(done)
    server = ThreadingHTTPServer((HOST, 0), HookHandler)
    server.daemon_threads = True
    port_out.send(server.server_address[1])
    port_out.close()
    server.serve_forever(poll_interval=0.5)


class Receiver:
    """The parent's handle on the receiver process."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.done = ctx.Event()
        parent_end, child_end = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=receiver_main, args=(child_end, self.done), name="bench-cdc-receiver"
        )
        self.process.daemon = True
        self.process.start()
        child_end.close()
        if not parent_end.poll(RECEIVER_START_TIMEOUT_S):
            self.close()
            raise RuntimeError("the webhook receiver did not start in time")
        self.port = int(parent_end.recv())
        parent_end.close()
        self.url = f"http://{HOST}:{self.port}{HOOK_PATH}"

    def _call(self, method: str, path: str) -> bytes:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=CONTROL_TIMEOUT_S)
        try:
            conn.request(method, path, body=b"" if method == "POST" else None)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"receiver {method} {path}: HTTP {response.status}")
            return body
        finally:
            conn.close()

    def reset(self, expect: int) -> None:
        self._call("POST", f"/reset?expect={expect}")

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._call("GET", "/stats"))
        return doc

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)


# -- CPU accounting -----------------------------------------------------------------------------
def thread_cpu_seconds(native_id: int | None) -> float | None:
    """user+system CPU seconds of one thread of this process (Linux /proc), or None."""
    return None if native_id is None else stat_cpu_seconds(f"/proc/self/task/{native_id}/stat")


def cdc_thread_id() -> int | None:
    for thread in threading.enumerate():
        if thread.name == "litecdc-cdc":
            return thread.native_id
    return None


# -- the litecdc side ---------------------------------------------------------------------------
@dataclass
class Bench:
    root: Path
    receiver: Receiver
    timeout: float
    cases_made: int = 0

    def open_store(self, name: str) -> Store:
        self.cases_made += 1
        path = self.root / f"{self.cases_made:02d}-{name}"
        store = Store(NodeConfig(data_dir=path))
        outcome = store.execute([Statement(CREATE_TABLE)])
        if outcome.cid is None:
            raise RuntimeError(f"create table failed: {outcome.results}")
        return store

    def config_file(self, name: str, **settings: object) -> Path:
        """The service's configuration as a JSON file, the way an operator writes it."""
        path = self.root / f"cdc-{name}.json"
        path.write_text(json.dumps({"endpoint": self.receiver.url, **settings}, indent=2))
        return path

    def service(
        self,
        store: Store,
        config_path: Path,
        *,
        factory: type[CDCService] = CDCService,
        wrap: Callable[[Store, Leadership, Sink], tuple[ChangeFeed, Leadership, Sink]]
        | None = None,
    ) -> CDCService:
        config = parse_cdc_config(str(config_path))
        feed: ChangeFeed = store
        leadership: Leadership = StandaloneLeadership(store.journal)
        sink = create_sink(config)
        if wrap is not None:
            feed, leadership, sink = wrap(store, leadership, sink)
        return factory(config, feed, leadership, node_id="bench", sink=sink)


def write_transaction(store: Store, statements: Sequence[Statement]) -> int:
    return committed_cid(store.execute(statements, transaction=True), "write failed")


@dataclass
class Check:
    """Did every event arrive, exactly as committed?"""

    expected_events: int
    distinct: int
    received: int
    duplicates: int
    lost_events: int
    missing_cids: int
    unexpected_cids: int
    wrong_counts: int
    redelivered_cids: int
    row_ids_ok: bool
    bad_requests: int

    @property
    def ok(self) -> bool:
        return (
            self.lost_events == 0
            and self.missing_cids == 0
            and self.unexpected_cids == 0
            and self.wrong_counts == 0
            and self.row_ids_ok
            and self.bad_requests == 0
        )

    def problems(self) -> str:
        parts = []
        if self.lost_events:
            parts.append(f"{self.lost_events} events missing")
        if self.missing_cids:
            parts.append(f"{self.missing_cids} cids never arrived")
        if self.unexpected_cids:
            parts.append(f"{self.unexpected_cids} cids that were not written")
        if self.wrong_counts:
            parts.append(f"{self.wrong_counts} cids with the wrong number of events")
        if not self.row_ids_ok:
            parts.append("row ids are not exactly 1..N")
        if self.bad_requests:
            parts.append(f"{self.bad_requests} unparseable bodies")
        if self.duplicates:
            parts.append(
                f"{self.duplicates} duplicate events ({self.redelivered_cids} cids delivered "
                "more than once)"
            )
        return "; ".join(parts) or "all events arrived once"


def check_delivery(stats: dict[str, Any], committed: dict[int, int], first_row: int) -> Check:
    """``committed``: cid -> events written; row ids first_row.. are expected."""
    expected = sum(committed.values())
    got = {int(c[0]): int(c[1]) for c in stats["cids"]}
    redelivered = sum(1 for c in stats["cids"] if c[3] > 1)
    return Check(
        expected_events=expected,
        distinct=stats["distinct"],
        received=stats["events"],
        duplicates=stats["events"] - stats["distinct"],
        lost_events=max(0, expected - stats["distinct"]),
        missing_cids=len(committed.keys() - got.keys()),
        unexpected_cids=len(got.keys() - committed.keys()),
        wrong_counts=sum(1 for cid, n in got.items() if cid in committed and committed[cid] != n),
        row_ids_ok=(
            stats["row_ids"] == expected
            and stats["row_id_min"] == first_row
            and stats["row_id_max"] == first_row + expected - 1
        ),
        redelivered_cids=redelivered,
        bad_requests=stats["bad_requests"],
    )


def service_notes(status: dict[str, Any], received_events: int, queued_after_stop: int) -> str:
    """What the service's own counters say, when it is not the plain story."""
    notes = []
    if status.get("sent_events") != received_events:
        notes.append(
            f"the service counted {status.get('sent_events')} events sent, the receiver "
            f"got {received_events}"
        )
    for key in ("retries", "failed_requests", "dropped_events"):
        if status.get(key):
            notes.append(f"{key.replace('_', ' ')} {status[key]}")
    if status.get("last_error"):
        notes.append(f"last error: {status['last_error']}")
    if queued_after_stop:
        notes.append(f"{queued_after_stop} changes still queued after stop")
    return "; ".join(notes)


# -- throughput ---------------------------------------------------------------------------------
@dataclass
class ThroughputResult:
    mode: str  # "drain" or "concurrent"
    max_batch_size: int
    events: int
    seconds: float
    events_per_s: float
    write_seconds: float
    lag_after_last_commit_s: float | None
    requests: int
    events_per_request: float
    bytes_per_event: float
    litecdc_cores: float
    cdc_thread_cores: float | None
    cdc_thread_cpu_us_per_event: float | None
    receiver_cores: float | None
    machine_busy: float | None
    timed_out: bool
    check: Check
    queued_after_stop: int
    status: dict[str, Any] = field(default_factory=dict)


def run_throughput(
    bench: Bench,
    mode: str,
    batch_size: int,
    transactions: Sequence[list[Statement]],
) -> ThroughputResult:
    total = sum(len(t) for t in transactions)
    store = bench.open_store(f"{mode}-{batch_size}")
    config = bench.config_file(
        f"throughput-{batch_size}",
        max_batch_size=batch_size,
        max_batch_delay="50ms",
        high_watermark_interval="1s",
    )
    service = bench.service(store, config)
    committed: dict[int, int] = {}
    bench.receiver.reset(expect=total)
    write_seconds = 0.0
    last_commit = 0.0
    try:
        if mode == "drain":
            w0 = time.perf_counter()
            for statements in transactions:
                committed[write_transaction(store, statements)] = len(statements)
            write_seconds = time.perf_counter() - w0
        busy0, cpu0 = machine_busy_idle(), time.process_time()
        receiver0 = process_cpu_seconds(bench.receiver.process.pid)
        start = time.time()
        service.start()
        tid = cdc_thread_id()
        thread0 = thread_cpu_seconds(tid)
        if mode == "concurrent":
            w0 = time.perf_counter()
            for statements in transactions:
                committed[write_transaction(store, statements)] = len(statements)
            last_commit = time.time()
            write_seconds = time.perf_counter() - w0
        done = bench.receiver.wait(bench.timeout)
        cpu1, busy1 = time.process_time(), machine_busy_idle()
        thread1 = thread_cpu_seconds(tid)
        receiver1 = process_cpu_seconds(bench.receiver.process.pid)
        stats = bench.receiver.stats()
        done = done or stats["distinct"] >= total
    finally:
        service.stop()
        status = service.status()
        queued_after_stop = store.queue_stats()[0]
        store.close()
    end = stats["last_arrival"] if done else time.time()
    seconds = max(end - start, 1e-9)
    check = check_delivery(stats, committed, first_row=1)
    thread_cpu = None if thread0 is None or thread1 is None else thread1 - thread0
    return ThroughputResult(
        mode=mode,
        max_batch_size=batch_size,
        events=total,
        seconds=seconds,
        events_per_s=check.distinct / seconds,
        write_seconds=write_seconds,
        lag_after_last_commit_s=(end - last_commit) if mode == "concurrent" else None,
        requests=stats["requests"],
        events_per_request=stats["events"] / max(stats["requests"], 1),
        bytes_per_event=stats["body_bytes"] / max(stats["events"], 1),
        litecdc_cores=(cpu1 - cpu0) / seconds,
        cdc_thread_cores=None if thread_cpu is None else thread_cpu / seconds,
        cdc_thread_cpu_us_per_event=(
            None if thread_cpu is None else thread_cpu / max(check.distinct, 1) * 1e6
        ),
        receiver_cores=cpu_cores(receiver0, receiver1, seconds),
        machine_busy=busy_share(busy0, busy1),
        timed_out=not done,
        check=check,
        queued_after_stop=queued_after_stop,
        status=status,
    )


# -- latency ------------------------------------------------------------------------------------
@dataclass
class LatencyResult:
    max_batch_size: int
    max_batch_delay_ms: float
    rate: float
    achieved_rate: float
    transactions: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    late_starts: int  # transactions started more than one interval behind schedule
    max_behind_ms: float
    execute_p50_ms: float  # how long Store.execute took: the writer's own latency
    execute_p99_ms: float
    execute_max_ms: float
    requests: int
    events_per_request: float
    litecdc_cores: float
    cdc_thread_cores: float | None
    receiver_cores: float | None
    machine_busy: float | None
    timed_out: bool
    check: Check
    queued_after_stop: int
    status: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_latency(
    bench: Bench, delay_ms: float, rate: float, duration: float, warmup: float
) -> LatencyResult:
    batch_size = 10
    warm_n = int(rate * warmup)
    measured_n = max(1, int(rate * duration))
    rows = make_rows(warm_n + measured_n, seed=int(delay_ms))
    statements = [[Statement(INSERT, row)] for row in rows]
    store = bench.open_store(f"latency-{delay_ms:g}ms")
    settings: dict[str, object] = {"max_batch_delay": f"{delay_ms:g}ms"}
    config = bench.config_file(f"latency-{delay_ms:g}ms", **settings)
    service = bench.service(store, config)
    bench.receiver.reset(expect=len(rows))
    returned: dict[int, float] = {}  # cid -> time.time() when Store.execute returned
    measured: list[int] = []
    execute_s: list[float] = []
    late, max_behind = 0, 0.0
    interval = 1.0 / rate
    try:
        service.start()
        tid = cdc_thread_id()
        # wait until the service leads (its state table exists), so the first writes
        # are not timed against the take-over
        deadline = time.monotonic() + 10
        while store.cdc_high_watermark() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.perf_counter()
        for i, stmts in enumerate(statements):
            if i == warm_n:
                busy0, cpu0 = machine_busy_idle(), time.process_time()
                thread0 = thread_cpu_seconds(tid)
                receiver0 = process_cpu_seconds(bench.receiver.process.pid)
                m0 = time.perf_counter()
            target = t0 + i * interval  # absolute schedule: no drift
            behind = time.perf_counter() - target
            if behind < 0:
                time.sleep(-behind)
            elif i >= warm_n:
                max_behind = max(max_behind, behind)
                late += behind > interval
            x0 = time.perf_counter()
            cid = write_transaction(store, stmts)
            returned[cid] = time.time()
            if i >= warm_n:
                execute_s.append(time.perf_counter() - x0)
                measured.append(cid)
        m1 = time.perf_counter()
        cpu1, busy1 = time.process_time(), machine_busy_idle()
        thread1 = thread_cpu_seconds(tid)
        receiver1 = process_cpu_seconds(bench.receiver.process.pid)
        done = bench.receiver.wait(bench.timeout)
        stats = bench.receiver.stats()
        done = done or stats["distinct"] >= len(rows)
    finally:
        service.stop()
        status = service.status()
        queued_after_stop = store.queue_stats()[0]
        store.close()
    window = m1 - m0
    arrivals = {int(c[0]): float(c[2]) for c in stats["cids"]}
    latencies = [(arrivals[c] - returned[c]) * 1000 for c in measured if c in arrivals]
    check = check_delivery(stats, dict.fromkeys(returned, 1), first_row=1)
    thread_cpu = None if thread0 is None or thread1 is None else thread1 - thread0
    return LatencyResult(
        max_batch_size=batch_size,
        max_batch_delay_ms=delay_ms,
        rate=rate,
        achieved_rate=measured_n / window,
        transactions=measured_n,
        p50_ms=percentile(latencies, 0.50),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=max(latencies, default=float("nan")),
        late_starts=late,
        max_behind_ms=max_behind * 1000,
        execute_p50_ms=percentile(execute_s, 0.50) * 1000,
        execute_p99_ms=percentile(execute_s, 0.99) * 1000,
        execute_max_ms=max(execute_s, default=float("nan")) * 1000,
        requests=stats["requests"],
        events_per_request=stats["events"] / max(stats["requests"], 1),
        litecdc_cores=(cpu1 - cpu0) / window,
        cdc_thread_cores=None if thread_cpu is None else thread_cpu / window,
        receiver_cores=cpu_cores(receiver0, receiver1, window),
        machine_busy=busy_share(busy0, busy1),
        timed_out=not done,
        check=check,
        queued_after_stop=queued_after_stop,
        status=status,
    )


# -- where the CDC thread spends its time (--profile) -------------------------------------------
@dataclass
class Stage:
    calls: int = 0
    wall: float = 0.0
    cpu: float = 0.0


class Stages:
    """Wall and CPU time of the CDC thread in each call it makes out of the service."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stages: dict[str, Stage] = {}

    def timed(self, name: str, call: Callable[[], Any]) -> Any:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return call()
        finally:
            wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
            with self._lock:
                stage = self.stages.setdefault(name, Stage())
                stage.calls += 1
                stage.wall += wall
                stage.cpu += cpu

    def snapshot(self) -> dict[str, Stage]:
        with self._lock:
            return {name: Stage(s.calls, s.wall, s.cpu) for name, s in self.stages.items()}


class TimedFeed:
    def __init__(self, store: Store, stages: Stages) -> None:
        self._store, self._stages = store, stages

    def read_transactions(
        self,
        after: int,
        max_transactions: int,
        max_events: int | None = None,
        *,
        oversize_first: bool = True,
    ) -> tuple[list[RowChange], bool]:
        result: tuple[list[RowChange], bool] = self._stages.timed(
            "feed.read_transactions (SQL + decode)",
            lambda: self._store.read_transactions(
                after, max_transactions, max_events, oversize_first=oversize_first
            ),
        )
        return result

    def wait_for_commit_after(self, cid: int, timeout: float) -> bool:
        result: bool = self._stages.timed(
            "feed.wait_for_commit_after (idle)",
            lambda: self._store.wait_for_commit_after(cid, timeout),
        )
        return result

    def next_transaction(self, after: int) -> tuple[int, int] | None:
        return self._store.next_transaction(after)

    def transaction_changes(self, cid: int, after_seq: int, limit: int) -> list[RowChange]:
        result: list[RowChange] = self._stages.timed(
            "feed.transaction_changes (a large transaction's page)",
            lambda: self._store.transaction_changes(cid, after_seq, limit),
        )
        return result

    def last_cid(self) -> int:
        return self._store.last_cid()

    def cdc_high_watermark(self) -> int | None:
        return self._store.cdc_high_watermark()

    def pruned_cid(self) -> int:
        return self._store.pruned_cid()

    def queue_stats(self, after: int = 0) -> tuple[int, int | None]:
        return self._store.queue_stats(after)


class TimedLeadership:
    def __init__(self, inner: Leadership, stages: Stages) -> None:
        self._inner, self._stages = inner, stages

    def is_leader(self) -> bool:
        return self._inner.is_leader()

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        self._inner.add_listener(callback)

    def write_internal(self, query: str) -> int:
        cid: int = self._stages.timed(
            "leadership.write_internal (HWM + prune)", lambda: self._inner.write_internal(query)
        )
        return cid


SEND_STAGE = "sink.send (HTTP POST, incl. receiver)"


class TimedSink:
    def __init__(self, inner: Sink, stages: Stages) -> None:
        self._inner, self._stages = inner, stages

    def send(
        self, body: bytes, message_id: str, *, may_send: Callable[[], bool] | None = None
    ) -> None:
        self._stages.timed(
            SEND_STAGE, lambda: self._inner.send(body, message_id, may_send=may_send)
        )

    def abort(self) -> None:
        self._inner.abort()

    def close(self) -> None:
        self._inner.close()


class ProfiledCDCService(CDCService):
    """The service with cProfile running in its reader thread."""

    profiler: cProfile.Profile | None = None

    def _run(self) -> None:
        profiler = cProfile.Profile()
        ProfiledCDCService.profiler = profiler
        profiler.enable()
        try:
            super()._run()
        finally:
            profiler.disable()


def drain_once(
    bench: Bench,
    transactions: Sequence[list[Statement]],
    batch_size: int,
    factory: type[CDCService],
    wrap: Callable[[Store, Leadership, Sink], tuple[ChangeFeed, Leadership, Sink]] | None,
    on_done: Callable[[], None] | None = None,
) -> tuple[float, float, int]:
    """Write, then drain with the given service; (seconds, CDC thread CPU s, events)."""
    total = sum(len(t) for t in transactions)
    store = bench.open_store(f"profile-{batch_size}")
    config = bench.config_file(
        f"profile-{batch_size}", max_batch_size=batch_size, max_batch_delay="50ms"
    )
    service = bench.service(store, config, factory=factory, wrap=wrap)
    bench.receiver.reset(expect=total)
    try:
        for statements in transactions:
            write_transaction(store, statements)
        start = time.time()
        service.start()
        tid = cdc_thread_id()
        thread0 = thread_cpu_seconds(tid) or 0.0
        if not bench.receiver.wait(bench.timeout):
            print(f"  (profile drain timed out after {bench.timeout:.0f} s)")
        if on_done is not None:
            on_done()
        thread1 = thread_cpu_seconds(tid) or 0.0
        stats = bench.receiver.stats()
    finally:
        service.stop()
        store.close()
    return max(stats["last_arrival"] - start, 1e-9), thread1 - thread0, int(stats["distinct"])


#: cProfile's entry for blocking on a lock: the reader idling in Condition.wait
IDLE_FUNCTION = "<method 'acquire' of '_thread.lock' objects>"


def profile_drain(
    bench: Bench, transactions: Sequence[list[Statement]], batch_size: int, top: int
) -> dict[str, Any]:
    stages = Stages()
    done_stages: dict[str, Stage] = {}

    def wrap(
        store: Store, leadership: Leadership, sink: Sink
    ) -> tuple[ChangeFeed, Leadership, Sink]:
        return (
            TimedFeed(store, stages),
            TimedLeadership(leadership, stages),
            TimedSink(sink, stages),
        )

    def snapshot() -> None:
        # the calls made by the time the last event arrived, once the POST that carried it
        # has returned (the receiver records a batch before it answers)
        requests = bench.receiver.stats()["requests"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            taken = stages.snapshot()
            send = taken.get(SEND_STAGE)
            if send is not None and send.calls >= requests:
                break
            time.sleep(0.001)
        done_stages.update(taken)

    seconds, thread_cpu, events = drain_once(
        bench, transactions, batch_size, CDCService, wrap, snapshot
    )
    per = 1e6 / max(events, 1)
    print(
        f"\nwhere the CDC thread's time goes: drain of {events:,} events, max_batch_size "
        f"{batch_size}, no profiler ({events / seconds:,.0f} events/s, thread CPU "
        f"{thread_cpu * per:.1f} us/event)"
    )
    print(f"  {'call':<44}{'calls':>7}{'wall us/event':>15}{'CPU us/event':>14}{'wall share':>12}")
    accounted_wall = accounted_cpu = 0.0
    for name, stage in sorted(done_stages.items(), key=lambda kv: -kv[1].wall):
        accounted_wall += stage.wall
        accounted_cpu += stage.cpu
        print(
            f"  {name:<44}{stage.calls:>7}{stage.wall * per:>15.2f}{stage.cpu * per:>14.2f}"
            f"{stage.wall / seconds:>12.0%}"
        )
    rest_wall = max(seconds - accounted_wall, 0.0)
    print(
        f"  {'the rest: envelope, batching, start-up':<44}{'':>7}{rest_wall * per:>15.2f}"
        f"{max(thread_cpu - accounted_cpu, 0.0) * per:>14.2f}{rest_wall / seconds:>12.0%}"
    )
    print(
        "  (wall includes waiting: for the GIL, for the disk, and in sink.send for the "
        "receiver's answer)"
    )

    ProfiledCDCService.profiler = None
    seconds, _cpu, events = drain_once(bench, transactions, batch_size, ProfiledCDCService, None)
    profiler = ProfiledCDCService.profiler
    if profiler is None:
        return {}
    raw = profile_entries(profiler)
    idle = sum(v[2] for k, v in raw.items() if k[2] == IDLE_FUNCTION)
    grand = sum(v[2] for v in raw.values()) - idle
    per = 1e6 / max(events, 1)
    print(
        f"\ncProfile of the CDC thread, same drain ({events / seconds:,.0f} events/s under the "
        f"profiler), top {top} by own time, without waiting on locks ({idle * per:.1f} us/event, "
        "mostly idle after the drain). Profiling slows Python code more than C: compare shares"
    )
    print(f"  {'own us/event':>12} {'share':>6} {'cum us/event':>12} {'calls/event':>11}  function")
    busy = [kv for kv in raw.items() if kv[0][2] != IDLE_FUNCTION]
    ranked = top_by_own_time(busy, top)
    for (filename, line, func), (_cc, ncalls, tottime, cumtime, _callers) in ranked:
        where = function_place(filename, line)
        print(
            f"  {tottime * per:>12.2f} {tottime / grand:>6.1%} {cumtime * per:>12.2f} "
            f"{ncalls / max(events, 1):>11.3f}  {func} ({where})"
        )
    print(f"  total profiled time, without waiting on locks: {grand * per:.1f} us/event")
    return {
        "calls_us_per_event": {
            name: {"wall": st.wall * per, "cpu": st.cpu * per} for name, st in done_stages.items()
        },
        "cdc_thread_cpu_us_per_event": thread_cpu * per,
    }


# -- output -------------------------------------------------------------------------------------
def group_runs(results: Sequence[ThroughputResult]) -> list[list[ThroughputResult]]:
    """Runs of the same case together (in first-run order), each sorted by events/s."""
    groups: dict[tuple[str, int], list[ThroughputResult]] = {}
    for r in results:
        groups.setdefault((r.mode, r.max_batch_size), []).append(r)
    return [sorted(g, key=lambda r: r.events_per_s) for g in groups.values()]


def median_run(runs: Sequence[ThroughputResult]) -> ThroughputResult:
    """The run with the median events/s (the lower middle one for an even count)."""
    return runs[(len(runs) - 1) // 2]


def print_throughput(results: Sequence[ThroughputResult], events: int, txn_rows: int) -> None:
    groups = group_runs(results)
    repeats = max(len(g) for g in groups)
    print(
        f"\nthroughput: {events:,} single-row inserts in {txn_rows}-row transactions, "
        f"delivered to the receiver; median of {repeats} runs per case, interleaved"
    )
    print(
        f"  {'case':<32}{'events/s':>10}{'min-max':>18}{'seconds':>8}{'POSTs':>6}{'ev/POST':>8}"
        f"{'B/event':>8}{'litecdc CPU':>12}{'CDC thread':>11}{'us/event':>9}"
        f"{'receiver CPU':>13}{'machine':>8}"
    )
    for runs in groups:
        r = median_run(runs)
        name = f"{r.mode}, max_batch_size {r.max_batch_size}"
        spread = f"{runs[0].events_per_s:,.0f}-{runs[-1].events_per_s:,.0f}"
        us = (
            "n/a"
            if r.cdc_thread_cpu_us_per_event is None
            else f"{r.cdc_thread_cpu_us_per_event:.1f}"
        )
        busy = "n/a" if r.machine_busy is None else f"{r.machine_busy:.0%}"
        print(
            f"  {name:<32}{r.events_per_s:>10,.0f}{spread:>18}{r.seconds:>8.2f}{r.requests:>6}"
            f"{r.events_per_request:>8.0f}{r.bytes_per_event:>8.0f}{cores(r.litecdc_cores):>12}"
            f"{cores(r.cdc_thread_cores):>11}{us:>9}{cores(r.receiver_cores):>13}{busy:>8}"
        )
    for runs in groups:
        r = median_run(runs)
        name = f"{r.mode}, max_batch_size {r.max_batch_size}"
        rates = [x.events / x.write_seconds for x in runs if x.write_seconds]
        rows_s = statistics.median(rates) if rates else 0.0
        if r.mode == "concurrent":
            lags = [x.lag_after_last_commit_s or 0.0 for x in runs]
            extra = (
                f"writing with CDC running: {rows_s:,.0f} rows/s; the last event arrived "
                f"{statistics.median(lags) * 1000:,.0f} ms after the last commit"
            )
        else:
            extra = f"writing beforehand, CDC stopped: {rows_s:,.0f} rows/s"
        problems = []
        for n, x in enumerate(runs, 1):
            notes = service_notes(x.status, x.check.received, x.queued_after_stop)
            if x.timed_out or not x.check.ok or x.check.duplicates or notes:
                flag = "TIMED OUT, " if x.timed_out else ""
                problems.append(
                    f"run {n}: {flag}{x.check.problems()}" + (f"; {notes}" if notes else "")
                )
        verdict = "; ".join(problems) or (
            f"every event arrived exactly once in all {len(runs)} runs, queue empty after stop"
        )
        print(f"  {name}: {verdict}; {extra} (median)")
    print(
        "  (events/s = distinct events received / time from service start (drain) or from the "
        "first write (concurrent) to the last arrival. CPU in cores, 1.00 = one CPU busy; "
        "litecdc CPU includes the writer in concurrent cases; us/event = CDC thread CPU per "
        "event; machine = share of all CPUs busy)"
    )


def print_latency(results: Sequence[LatencyResult], warmup: float) -> None:
    if not results:
        return
    r0 = results[0]
    print(
        f"\nlatency: single-row transactions at {r0.rate:g}/s for {r0.transactions / r0.rate:g} s "
        f"(after {warmup:g} s warm-up), from Store.execute returning the cid to its arrival"
    )
    print(
        f"  {'case':<24}{'txn/s':>7}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'max ms':>8}"
        f"{'POSTs':>7}{'ev/POST':>9}{'late':>6}{'litecdc CPU':>13}{'CDC thread':>12}"
        f"{'receiver CPU':>14}{'machine':>9}"
    )
    for r in results:
        name = f"batch {r.max_batch_size}, delay {r.max_batch_delay_ms:g}ms"
        busy = "n/a" if r.machine_busy is None else f"{r.machine_busy:.0%}"
        print(
            f"  {name:<24}{r.achieved_rate:>7,.0f}{r.p50_ms:>8.1f}{r.p90_ms:>8.1f}"
            f"{r.p99_ms:>8.1f}{r.max_ms:>8.1f}{r.requests:>7}{r.events_per_request:>9.1f}"
            f"{r.late_starts:>6}{cores(r.litecdc_cores):>13}{cores(r.cdc_thread_cores):>12}"
            f"{cores(r.receiver_cores):>14}{busy:>9}"
        )
    for r in results:
        name = f"batch {r.max_batch_size}, delay {r.max_batch_delay_ms:g}ms"
        flag = "TIMED OUT: " if r.timed_out else ""
        notes = service_notes(r.status, r.check.received, r.queued_after_stop)
        queued = f"; {notes}" if notes else ""
        print(
            f"  {name}: {flag}{r.check.problems()}; Store.execute took p50 "
            f"{r.execute_p50_ms:.2f} / p99 {r.execute_p99_ms:.2f} / max "
            f"{r.execute_max_ms:.1f} ms; most behind schedule {r.max_behind_ms:.1f} ms{queued}"
        )
    print(
        "  (late = transactions started more than one interval behind their slot on the "
        "absolute schedule, which does not drift; litecdc CPU includes the writer)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument(
        "--events", type=int, default=100_000, help="rows per throughput case (default 100000)"
    )
    parser.add_argument(
        "--txn-rows", type=int, default=1000, help="rows per transaction (default 1000)"
    )
    parser.add_argument(
        "--batch-sizes",
        default="100,1000",
        help="max_batch_size values for the throughput cases (default 100,1000)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each throughput case, interleaved; the median is reported (default 3)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=500.0,
        help="transactions/s in the latency cases (default 500)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=10.0,
        help="measured seconds per latency case (default 10)",
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="latency warm-up seconds, not counted (default 1)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="longest wait for the last event of a case, in seconds (default 30)",
    )
    add_output_arguments(
        parser,
        data_dir="where the databases go",
        json="also print the figures as one JSON line at the end",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also time the CDC thread's calls and cProfile it during a drain",
    )
    parser.add_argument(
        "--profile-batch-size",
        type=int,
        default=10,
        help="max_batch_size of the profiled drain (default 10, the service's default, so "
        "that the drain takes several POSTs)",
    )
    args = parser.parse_args(argv)
    require_at_least_one(parser, args, ("events", "txn_rows", "repeats", "profile_batch_size"))
    for name in ("rate", "duration", "timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be more than zero")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    try:
        batch_sizes = [int(v) for v in args.batch_sizes.split(",") if v.strip()]
    except ValueError:
        parser.error(
            f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}"
        )
    if not batch_sizes or min(batch_sizes) < 1:
        parser.error("--batch-sizes must list at least one size, each at least 1")

    root, cleanup = data_root(parser, args.data_dir, prefix="litecdc-bench-cdc-")

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as `litecdc serve` runs the service
    started = time.perf_counter()
    print(platform_line("litecdc CDC benchmark", sqlite_versions()))
    print(
        f"databases in {root} (WAL, synchronous=FULL, a fresh one per case); GIL switch "
        f"interval {GIL_SWITCH_INTERVAL_S * 1000:g} ms as in litecdc serve"
    )
    receiver = Receiver()
    try:
        print(
            f"receiver: stdlib ThreadingHTTPServer (HTTP/1.1 keep-alive, msgspec parsing) in "
            f"process {receiver.process.pid} at {receiver.url}"
        )
        print(load_note())
        bench = Bench(root=root, receiver=receiver, timeout=args.timeout)
        rows = make_rows(args.events, seed=1)
        transactions = [
            [Statement(INSERT, row) for row in rows[i : i + args.txn_rows]]
            for i in range(0, len(rows), args.txn_rows)
        ]
        throughput: list[ThroughputResult] = []
        for _ in range(args.repeats):
            for size in batch_sizes:
                for mode in ("drain", "concurrent"):
                    throughput.append(run_throughput(bench, mode, size, transactions))
        print_throughput(throughput, args.events, args.txn_rows)

        latency = [
            run_latency(bench, delay, args.rate, args.duration, args.warmup)
            for delay in (200.0, 20.0)
        ]
        print_latency(latency, args.warmup)

        print("\nsummary")
        for runs in group_runs(throughput):
            r = median_run(runs)
            met = r.events_per_s >= TARGET_EVENTS_PER_S and all(
                x.check.ok and not x.timed_out for x in runs
            )
            print(
                f"  events/s delivered, {r.mode + ',':<11} max_batch_size {r.max_batch_size:<5} "
                f"{r.events_per_s:>9,.0f}   target >= {TARGET_EVENTS_PER_S:,}: "
                f"{'met' if met else 'NOT met'}"
            )
        for lr in latency:
            met = lr.p99_ms <= TARGET_P99_MS and lr.check.ok and not lr.timed_out
            print(
                f"  p99 latency at {lr.rate:g} txn/s, max_batch_delay "
                f"{lr.max_batch_delay_ms:>4g}ms  {lr.p99_ms:>7.1f} ms   "
                f"(p50 {lr.p50_ms:.1f}, max {lr.max_ms:.1f})   target <= {TARGET_P99_MS:g} ms: "
                f"{'met' if met else 'NOT met'}"
            )
        cases: list[ThroughputResult | LatencyResult] = [*throughput, *latency]
        lost = [r for r in cases if not r.check.ok or r.timed_out]
        dups = sum(r.check.duplicates for r in cases)
        print(
            "  delivery: "
            + (
                "every event arrived"
                if not lost
                else f"{len(lost)} cases INCOMPLETE (events missing or timed out)"
            )
            + f", {dups} duplicates"
        )
        print(f"  total {time.perf_counter() - started:.1f} s")

        profile: dict[str, Any] = {}
        if args.profile:
            profile = profile_drain(bench, transactions, args.profile_batch_size, top=25)

        if args.json:
            doc = {
                **platform_json(sqlite_versions()),
                "throughput_median_events_per_s": {
                    f"{runs[0].mode}_{runs[0].max_batch_size}": median_run(runs).events_per_s
                    for runs in group_runs(throughput)
                },
                "throughput": [
                    {k: v for k, v in asdict(r).items() if k != "status"} for r in throughput
                ],
                "latency": [asdict(r) for r in latency],
                "targets": {"events_per_s": TARGET_EVENTS_PER_S, "p99_ms": TARGET_P99_MS},
                **({"profile": profile} if profile else {}),
            }
            print(json.dumps(doc, separators=(",", ":")))
    finally:
        receiver.close()
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
