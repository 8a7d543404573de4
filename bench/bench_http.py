"""HTTP API throughput of a real ``litecdc serve`` process on 127.0.0.1.

Starts ``python -m litecdc serve`` on a free local port with a fresh data directory,
waits for ``GET /readyz`` to answer 200, creates a table, then runs fixed-duration cases:

* ``POST /db/execute`` with one parameterised INSERT per request (each request is
  one journaled, captured, fsync'd commit), with 1 and with ``--clients`` clients;
* ``POST /db/query`` with one primary-key lookup per request, with ``--clients`` clients.

Each client is a thread with its own keep-alive ``httpx.Client`` (one connection);
the clients are spread over ``--processes`` worker processes so that the load
generator's GIL is not the limit. Only answers that complete inside the measured
window (after ``--warmup``) count. Printed for each case: requests/s, latency
percentiles, errors, and CPU use (in cores) of the server, of the load generator
and of the whole machine, so a saturated load generator shows.

    .venv/bin/python bench/bench_http.py
    .venv/bin/python bench/bench_http.py --duration 10 --clients 32 --processes 2 --json

The server is stopped at the end (SIGTERM, then SIGKILL), whatever happens.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from common import (
    CREATE_TABLE,
    TABLE,
    add_output_arguments,
    busy_share,
    cores,
    cpu_cores,
    load_note,
    machine_busy_idle,
    make_rows,
    new_parser,
    platform_json,
    platform_line,
    process_cpu_seconds,
)

from litecdc.demo import free_port

HOST = "127.0.0.1"  # litecdc.demo.free_port finds a free port on this address
INSERT = f"INSERT INTO {TABLE}(name, price, payload, qty) VALUES (?, ?, unhex(?), ?)"
SELECT = f"SELECT id, name, price, payload, qty FROM {TABLE} WHERE id = ?"
READY_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0
BODY_POOL = 2000


# -- request bodies ---------------------------------------------------------------------------
def write_bodies(count: int, seed: int) -> list[bytes]:
    """One-statement /db/execute bodies, the rows of bench_engine.py (blob as hex)."""
    return [
        json.dumps([[INSERT, name, price, payload.hex(), qty]]).encode()
        for name, price, payload, qty in make_rows(count, seed)
    ]


def query_bodies(count: int, seed: int, max_id: int) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps([[SELECT, rng.randint(1, max_id)]]).encode() for _ in range(count)]


# -- the load generator (runs in worker processes) ---------------------------------------------
@dataclass
class WorkerResult:
    ok: int = 0
    errors: int = 0
    first_error: str = ""
    latencies: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0


class _Sender:
    """One client: a keep-alive connection that POSTs a JSON body and returns (ok, reason)."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        parts = urlsplit(url)
        self.url, self.path = url, parts.path
        self.headers = {"Content-Type": "application/json"}
        if kind == "httpx":
            self.client = httpx.Client(
                timeout=REQUEST_TIMEOUT_S, trust_env=False, limits=httpx.Limits(max_connections=1)
            )
        else:
            self.conn = http.client.HTTPConnection(
                parts.hostname or HOST, parts.port, timeout=REQUEST_TIMEOUT_S
            )

    def post(self, body: bytes) -> tuple[bool, str]:
        if self.kind == "httpx":
            try:
                response = self.client.post(self.url, content=body, headers=self.headers)
            except httpx.HTTPError as exc:
                return False, f"{type(exc).__name__}: {exc}"
            status, content = response.status_code, response.content
        else:
            try:
                self.conn.request("POST", self.path, body=body, headers=self.headers)
                reply = self.conn.getresponse()
                status, content = reply.status, reply.read()
            except (OSError, http.client.HTTPException) as exc:
                self.conn.close()  # the next request reconnects
                return False, f"{type(exc).__name__}: {exc}"
        if status != 200 or b'"error"' in content:
            return False, f"HTTP {status}: {content[:200].decode(errors='replace')}"
        return True, ""

    def close(self) -> None:
        if self.kind == "httpx":
            self.client.close()
        else:
            self.conn.close()


def _client_loop(
    kind: str,
    url: str,
    bodies: Sequence[bytes],
    offset: int,
    measure_from: float,
    until: float,
    out: WorkerResult,
    lock: threading.Lock,
) -> None:
    ok = errors = 0
    first_error = ""
    latencies: list[float] = []
    sender = _Sender(kind, url)
    try:
        sender.post(bodies[offset % len(bodies)])  # open the keep-alive connection
        i = offset + 1
        while True:
            started = time.monotonic()
            if started >= until:
                break
            succeeded, reason = sender.post(bodies[i % len(bodies)])
            i += 1
            finished = time.monotonic()
            if finished < measure_from or finished > until:
                continue
            if succeeded:
                ok += 1
                latencies.append(finished - started)
            else:
                errors += 1
                first_error = first_error or reason
    finally:
        sender.close()
    with lock:
        out.ok += ok
        out.errors += errors
        out.first_error = out.first_error or first_error
        out.latencies.extend(latencies)


def worker(
    kind: str,
    url: str,
    bodies: list[bytes],
    threads: int,
    first_client: int,
    warmup: float,
    duration: float,
    ready: Any,
    go: EventType,
    results: Any,
) -> None:
    """A load-generator process: ``threads`` clients, started together on ``go``."""
    out = WorkerResult()
    lock = threading.Lock()
    ready.put(os.getpid())
    go.wait(timeout=READY_TIMEOUT_S)
    start = time.monotonic()
    measure_from, until = start + warmup, start + warmup + duration
    stride = len(bodies) // max(threads, 1)
    pool = [
        threading.Thread(
            target=_client_loop,
            args=(kind, url, bodies, (first_client + n) * stride, measure_from, until, out, lock),
            daemon=True,
        )
        for n in range(threads)
    ]
    for thread in pool:
        thread.start()
    time.sleep(max(0.0, measure_from - time.monotonic()))
    cpu_start = time.process_time()
    time.sleep(max(0.0, until - time.monotonic()))
    out.cpu_seconds = time.process_time() - cpu_start
    for thread in pool:
        thread.join(timeout=REQUEST_TIMEOUT_S + 5)
    results.put(out)


# -- cases -------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    name: str
    clients: int
    processes: int
    requests_per_s: float
    ok: int
    errors: int
    first_error: str
    p50_ms: float
    p99_ms: float
    server_cores: float | None
    loadgen_cores: float
    machine_busy: float | None


@dataclass(frozen=True)
class LoadSettings:
    client: str  # "httpx" or "stdlib"
    warmup: float
    duration: float
    server_pid: int


def run_case(
    name: str, url: str, bodies: list[bytes], clients: int, processes: int, load: LoadSettings
) -> CaseResult:
    kind, warmup, duration, server_pid = load.client, load.warmup, load.duration, load.server_pid
    ctx = mp.get_context("spawn")
    processes = max(1, min(processes, clients))
    ready = ctx.Queue()
    results = ctx.Queue()
    go = ctx.Event()
    per_process = [
        clients // processes + (1 if n < clients % processes else 0) for n in range(processes)
    ]
    procs = []
    first = 0
    for threads in per_process:
        proc = ctx.Process(
            target=worker,
            daemon=True,
            args=(kind, url, bodies, threads, first, warmup, duration, ready, go, results),
        )
        first += threads
        proc.start()
        procs.append(proc)
    try:
        for _ in procs:
            ready.get(timeout=READY_TIMEOUT_S)
        go.set()
        time.sleep(warmup)
        server_before = process_cpu_seconds(server_pid)
        machine_before = machine_busy_idle()
        time.sleep(duration)
        server_after = process_cpu_seconds(server_pid)
        machine_after = machine_busy_idle()
        outs: list[WorkerResult] = [
            results.get(timeout=warmup + duration + REQUEST_TIMEOUT_S + 30) for _ in procs
        ]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    latencies = sorted(x for out in outs for x in out.latencies)
    ok = sum(out.ok for out in outs)

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3
            if latencies
            else float("nan")
        )

    return CaseResult(
        name=name,
        clients=clients,
        processes=len(procs),
        requests_per_s=ok / duration,
        ok=ok,
        errors=sum(out.errors for out in outs),
        first_error=next((out.first_error for out in outs if out.first_error), ""),
        p50_ms=statistics.median(latencies) * 1e3 if latencies else float("nan"),
        p99_ms=pct(0.99),
        server_cores=cpu_cores(server_before, server_after, duration),
        loadgen_cores=sum(out.cpu_seconds for out in outs) / duration,
        machine_busy=busy_share(machine_before, machine_after),
    )


# -- the server --------------------------------------------------------------------------------
# Not litecdc.demo.running_node: that yields only the base URL, and the benchmark needs the
# server's pid (for its CPU use), the time it took to get ready, and its whole output in a file
# whose tail goes into the error message (running_node keeps stderr in an unread pipe).
def start_server(data_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "litecdc",
                "serve",
                "--data-dir",
                str(data_dir),
                "--http-addr",
                f"{HOST}:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    finally:
        log.close()


def wait_ready(base: str, server: subprocess.Popen[bytes], log_path: Path) -> float:
    started = time.monotonic()
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() - started < READY_TIMEOUT_S:
            if server.poll() is not None:
                raise RuntimeError(
                    f"litecdc serve exited with status {server.returncode}:\n"
                    + log_path.read_text(errors="replace")[-2000:]
                )
            try:
                if client.get(f"{base}/readyz").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    raise RuntimeError(
        f"litecdc serve was not ready within {READY_TIMEOUT_S:.0f} s:\n"
        + log_path.read_text(errors="replace")[-2000:]
    )


def stop_server(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def post_json(client: httpx.Client, url: str, doc: Any) -> Any:
    response = client.post(url, json=doc)
    response.raise_for_status()
    body = response.json()
    for result in body.get("results", []):
        if "error" in result:
            raise RuntimeError(f"{url}: {result['error']}")
    return body


# -- output ------------------------------------------------------------------------------------
def print_results(cases: Sequence[CaseResult]) -> None:
    print(
        f"\n  {'case':<30}{'clients':>8}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
        f"{'server CPU':>12}{'loadgen CPU':>13}{'machine busy':>14}"
    )
    for c in cases:
        busy = "n/a" if c.machine_busy is None else f"{c.machine_busy:.0%}"
        print(
            f"  {c.name:<30}{c.clients:>8}{c.requests_per_s:>10,.0f}{c.p50_ms:>9.2f}"
            f"{c.p99_ms:>9.2f}{c.errors:>8}{cores(c.server_cores):>12}"
            f"{cores(c.loadgen_cores):>13}{busy:>14}"
        )
    for c in cases:
        if (
            c.machine_busy is not None
            and c.machine_busy >= 0.8
            and c.server_cores is not None
            and c.loadgen_cores >= c.server_cores
        ):
            print(
                f"  note: {c.name} x{c.clients}: the load generator used more CPU "
                f"({c.loadgen_cores:.2f} cores) than the server ({c.server_cores:.2f}) on a "
                f"{c.machine_busy:.0%} busy machine, so this figure may understate the "
                "server (try --client stdlib, or a second machine)"
            )
    for c in cases:
        if c.first_error:
            print(f"  first error in {c.name!r} ({c.errors} errors): {c.first_error}")
    print(
        "  (CPU columns are in cores: 1.00 = one CPU fully busy; the load generator runs "
        "in the listed processes)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument(
        "--duration", type=float, default=5.0, help="measured seconds per case (default 5)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds of unmeasured load before each case (default 1)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=16,
        help="concurrent clients in the concurrent cases (default 16)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="load-generator processes the concurrent clients are spread over (default 2)",
    )
    parser.add_argument(
        "--client",
        choices=("httpx", "stdlib"),
        default="httpx",
        help="HTTP client of the load generator: httpx.Client, or the "
        "standard library's http.client (about 4x less CPU per request, "
        "so less of the machine is taken from the server); both keep "
        "one connection alive per client (default httpx)",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="port for the server on 127.0.0.1 (default: a free one)"
    )
    add_output_arguments(parser, data_dir="the server's data directory")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or args.clients < 1 or args.processes < 1:
        parser.error("--duration must be > 0, --warmup >= 0, --clients and --processes >= 1")
    if args.duration > 600 or args.warmup > 60:
        parser.error("--duration is at most 600 s and --warmup at most 60 s")

    scratch = Path(tempfile.mkdtemp(prefix="litecdc-bench-http-"))
    data_dir = args.data_dir if args.data_dir is not None else scratch / "data"
    if data_dir.exists() and any(data_dir.iterdir()):
        parser.error(f"--data-dir {data_dir} is not empty")
    port = args.port or free_port()
    base = f"http://{HOST}:{port}"
    log_path = scratch / "server.log"

    print(platform_line("litecdc HTTP benchmark", {"httpx": httpx.__version__}))
    print(load_note())
    server = start_server(data_dir, port, log_path)
    try:
        ready_s = wait_ready(base, server, log_path)
        print(
            f"server: litecdc serve --data-dir {data_dir} --http-addr {HOST}:{port} "
            f"(pid {server.pid}, ready in {ready_s:.1f} s; synchronous=FULL)"
        )
        print(
            f"each case: {args.warmup:g} s warm-up, then {args.duration:g} s measured; "
            f"clients use {'httpx.Client' if args.client == 'httpx' else 'http.client'}, "
            "one keep-alive connection each"
        )
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            post_json(client, f"{base}/db/execute", [CREATE_TABLE])
        execute_url = f"{base}/db/execute"
        query_url = f"{base}/db/query"
        writes = write_bodies(BODY_POOL, seed=1)
        load = LoadSettings(args.client, args.warmup, args.duration, server.pid)
        cases = [
            run_case("write /db/execute", execute_url, writes, 1, 1, load),
            run_case("write /db/execute", execute_url, writes, args.clients, args.processes, load),
        ]
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            body = post_json(client, query_url, [["SELECT max(id) FROM items"]])
            max_id = int(body["results"][0]["values"][0][0])
        reads = query_bodies(BODY_POOL, seed=2, max_id=max_id)
        cases.append(
            run_case(
                "query /db/query (pk lookup)", query_url, reads, args.clients, args.processes, load
            )
        )
        print_results(cases)

        write_16 = cases[1].requests_per_s
        print("\nsummary")
        print(
            f"  writes: {cases[0].requests_per_s:,.0f} req/s with 1 client, {write_16:,.0f} "
            f"req/s with {args.clients} clients (target >= 1,000 with 16: "
            f"{'met' if write_16 >= 1000 else 'NOT met'}); "
            f"queries: {cases[2].requests_per_s:,.0f} req/s with {args.clients} clients"
        )
        print(f"  rows in the table after the run: {max_id:,}")
        if args.json:
            print(
                json.dumps(
                    {
                        **platform_json({}),
                        "client": args.client,
                        "duration_s": args.duration,
                        "warmup_s": args.warmup,
                        "cases": [c.__dict__ for c in cases],
                    },
                    separators=(",", ":"),
                )
            )
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_server(server)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
