"""Writes and failover of a 3-node litecdc cluster over a 3-member etcd, all on 127.0.0.1.

Starts a 3-member etcd (``tests/system/etcd_cluster.py``: Debian's ``etcd`` binary on free
ports) and three ``litecdc serve --etcd … --cluster bench`` nodes in a temporary directory,
then measures:

* write transactions/s (one single-row INSERT per ``POST /db/execute`` to the leader) with
  1 and ``--clients`` clients, p50/p99 latency, and CPU (in cores) of the leader, of the
  followers, of the etcd members and of the load generator. The baseline is a standalone
  ``litecdc serve`` node running the same cases in the same run (``--no-baseline`` skips
  it);
* where the leader spends its time per write: during one more ``--clients`` run, each node
  samples its own threads' Python stacks (``sys._current_frames``, every
  ``--sample-ms``) and reads their CPU time from ``/proc``; the script groups the samples
  into states (etcd append, SQLite COMMIT, applying the entry, waiting…);
* failover, ``--trials`` times: kill -9 the leader's process while writer threads send
  INSERTs to the survivors (a follower forwards to the leader; a failed request is retried
  after 20 ms), and time from the kill to the first acknowledged write sent after it. The
  killed node is restarted and catches up before the next trial.

Clients use the standard library's ``http.client`` with one keep-alive connection each,
spread over ``--processes`` processes (``bench_http.worker``). Each node runs
``litecdc.cli.main`` inside this script (``bench_cluster.py node serve …``), which is
``litecdc serve`` plus an idle thread that starts and stops the sampler when told so on
stdin.

    .venv/bin/python bench/bench_cluster.py            # about 90 s
    .venv/bin/python bench/bench_cluster.py --trials 5 --json

Every process (nodes, etcd members, load generators) is stopped at the end, whatever
happens.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib
import json
import linecache
import multiprocessing as mp
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, cast

import httpx
from bench_http import (
    HOST,
    REQUEST_TIMEOUT_S,
    WorkerResult,
    start_server,
    stop_server,
    wait_ready,
    worker,
    write_bodies,
)
from common import (
    CREATE_TABLE,
    TABLE,
    add_output_arguments,
    busy_share,
    cores,
    cpu_cores,
    data_root,
    load_note,
    machine_busy_idle,
    new_parser,
    platform_json,
    platform_line,
    process_cpu_seconds,
    sqlite_versions,
    stat_cpu_seconds,
)

from litecdc.demo import free_port

SYSTEM_TESTS = Path(__file__).resolve().parent.parent / "tests" / "system"
CLUSTER = "bench"
READY_TIMEOUT_S = 30.0
FAILOVER_TIMEOUT_S = 30.0
CATCH_UP_TIMEOUT_S = 30.0
BODY_POOL = 2000
WRITE_TARGET = 1000.0  # txn/s with 16 clients (issue 4)
FAILOVER_TARGET_S = 3.0  # median, with a 2 s lease (issue 4)


# -- etcd: the system tests' EtcdCluster ---------------------------------------------------------
class EtcdMemberLike(Protocol):
    process: subprocess.Popen[bytes] | None


class EtcdClusterLike(Protocol):
    members: Sequence[EtcdMemberLike]

    @property
    def endpoints(self) -> list[str]: ...

    def start(self) -> EtcdClusterLike: ...

    def close(self) -> None: ...


def etcd_cluster(base_dir: Path, size: int) -> EtcdClusterLike:
    """``tests/system/etcd_cluster.py``'s EtcdCluster (imported from there, untyped)."""
    if str(SYSTEM_TESTS) not in sys.path:
        sys.path.insert(0, str(SYSTEM_TESTS))
    module = importlib.import_module("etcd_cluster")
    return cast(EtcdClusterLike, module.EtcdCluster(base_dir, size=size))


def etcd_version() -> str:
    binary = str(importlib.import_module("etcd_cluster").ETCD_BINARY)
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return "not found"
    return out.split("Version:", 1)[1].split()[0] if "Version:" in out else "unknown"


def _has_tests() -> bool:
    if str(SYSTEM_TESTS) not in sys.path:
        sys.path.insert(0, str(SYSTEM_TESTS))
    return (SYSTEM_TESTS / "etcd_cluster.py").exists()


# -- the sampler (runs inside each node process) --------------------------------------------------
class Sampler:
    """Samples every Python thread's stack while running; CPU per thread from /proc."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0
        self.stacks: dict[str, Counter[str]] = defaultdict(Counter)
        self._cpu_start: dict[str, float] = {}
        self._process_cpu_start = 0.0
        self._started = 0.0

    @staticmethod
    def _thread_cpu() -> dict[str, float]:
        by_name: dict[str, float] = defaultdict(float)
        for thread in threading.enumerate():
            seconds = process_cpu_seconds_of_task(thread.native_id)
            if seconds is not None:
                by_name[_thread_group(thread.name)] += seconds
        return by_name

    def start(self) -> None:
        self._cpu_start = self._thread_cpu()
        self._process_cpu_start = time.process_time()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        names: dict[int, str] = {}
        while not self._stop.wait(self.interval):
            frames = sys._current_frames()
            if any(ident not in names for ident in frames):
                names = {t.ident: _thread_group(t.name) for t in threading.enumerate() if t.ident}
            for ident, frame in frames.items():
                if ident != me and names.get(ident) != "bench-control":
                    self.stacks[names.get(ident, "unnamed")][_stack_key(frame)] += 1
            self.ticks += 1

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        wall = time.monotonic() - self._started
        cpu_end = self._thread_cpu()
        return {
            "wall_s": wall,
            "ticks": self.ticks,
            "process_cpu_s": time.process_time() - self._process_cpu_start,
            "thread_cpu_s": {
                name: cpu_end[name] - self._cpu_start.get(name, 0.0) for name in cpu_end
            },
            "stacks": {name: dict(counter) for name, counter in self.stacks.items()},
        }


def process_cpu_seconds_of_task(native_id: int | None) -> float | None:
    """user+system CPU seconds of one thread of this process (Linux /proc), or None."""
    if native_id is None:
        return None
    return stat_cpu_seconds(f"/proc/self/task/{native_id}/stat")


def _thread_group(name: str) -> str:
    """Threads of one kind share a name: ``AnyIO worker thread``, ``litecdc-apply``…"""
    for prefix in ("litecdc-apply", "litecdc-log-appender", "AnyIO worker thread"):
        if name.startswith(prefix):
            return prefix
    return name


def _stack_key(frame: FrameType | None, depth: int = 14) -> str:
    """``path:function:line`` frames, innermost first, joined by `` < ``."""
    parts: list[str] = []
    while frame is not None and len(parts) < depth:
        code = frame.f_code
        parts.append(f"{code.co_filename}:{code.co_name}:{frame.f_lineno or 0}")
        frame = frame.f_back
    return " < ".join(parts)


def _control(sampler_interval: float) -> None:
    """Reads ``start`` / ``stop PATH`` lines from stdin (EOF: nothing more to do)."""
    sampler: Sampler | None = None
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "start" and sampler is None:
            sampler = Sampler(sampler_interval)
            sampler.start()
        elif command == "stop" and sampler is not None:
            report = sampler.stop()
            sampler = None
            tmp = Path(argument + ".tmp")
            tmp.write_text(json.dumps(report))
            tmp.rename(argument)


def run_node(argv: list[str]) -> None:
    """``bench_cluster.py node [--sample-ms MS] serve …``: litecdc's CLI with the sampler."""
    interval = 0.005
    if argv[:1] == ["--sample-ms"]:
        interval, argv = float(argv[1]) / 1000, argv[2:]
    threading.Thread(target=_control, args=(interval,), name="bench-control", daemon=True).start()
    from litecdc.cli import main as litecdc_main

    sys.argv = ["litecdc", *argv]
    litecdc_main()


# -- classifying the samples ----------------------------------------------------------------------
def _frames(key: str) -> list[tuple[str, str, int]]:
    out = []
    for part in key.split(" < "):
        path, func, line = part.rsplit(":", 2)
        out.append((path, func, int(line)))
    return out


def _source(path: str, line: int) -> str:
    return linecache.getline(path, line).strip()


def classify(key: str) -> str:
    """A state for one sampled stack (the first rule that matches, innermost frame first)."""
    frames = _frames(key)
    innermost_path, innermost, innermost_line = frames[0]
    source = _source(innermost_path, innermost_line)
    if "/litecdc/" in innermost_path and source.startswith("with ") and "lock" in source:
        where = f"{Path(innermost_path).name}:{innermost_line}"
        return f"waiting for a lock: `{source}` in {innermost} ({where})"
    for i, (path, func, _line) in enumerate(frames):
        name = Path(path).name
        if func == "_internal" and name == "engine.py" and i + 1 < len(frames):
            caller = _source(frames[i + 1][0], frames[i + 1][2])
            if '"COMMIT"' in caller:
                return "SQLite COMMIT (fsync of the WAL)"
            if '"BEGIN' in caller:
                return "SQLite BEGIN IMMEDIATE"
        if name == "etcd.py" and func == "txn":
            return "etcd txn: the guarded group append (raft commit, fsync on each member)"
        if name == "log.py" and func == "_take":
            return "waiting for entries to append"
        if (
            name == "etcd.py"
            and func == "get"
            and any(f[1] == "_follow" and Path(f[0]).name == "log.py" for f in frames)
        ):
            return "waiting for the next log watch batch"
        if name == "journal.py" and func == "apply_log_entry":
            return "applying the entry: SQL, capture, journal rows (CPU)"
        if name == "log.py" and func == "_apply":
            return "apply loop bookkeeping (decode, checks)"
        if name == "log.py" and func == "wait_applied":
            return "waiting for its entry to be applied"
        if name == "log.py" and func == "submit":
            return "submitting to the appender (cid, encode)"
        if name == "node.py" and func == "_run_member":
            return "member record refresh"
    if innermost in ("select", "_worker", "wait") or (
        innermost == "get" and "queue" in innermost_path
    ):
        return "idle"
    for path, func, line in frames:
        if "/litecdc/" in path:
            if func == "serve" and Path(path).name == "server.py":
                if path == innermost_path or Path(innermost_path).name == "runners.py":
                    return "event loop in C (uvloop, httptools): HTTP I/O or epoll wait"
                return f"event loop, Python: {innermost} ({Path(innermost_path).name})"
            return f"other: {func} ({Path(path).name}:{line})"
    return f"other: {innermost} ({Path(innermost_path).name})"


@dataclass
class ThreadProfile:
    thread: str
    cpu_cores: float
    states: list[tuple[str, float]]  # (state, threads busy on average), most first


def summarise_profile(report: Mapping[str, Any], top: int = 6) -> list[ThreadProfile]:
    ticks = max(1, int(report["ticks"]))
    wall = float(report["wall_s"]) or 1.0
    cpu: Mapping[str, float] = report["thread_cpu_s"]
    out = []
    for thread, stacks in report["stacks"].items():
        states: Counter[str] = Counter()
        for key, count in stacks.items():
            states[classify(key)] += count
        out.append(
            ThreadProfile(
                thread=thread,
                cpu_cores=cpu.get(thread, 0.0) / wall,
                states=[(s, n / ticks) for s, n in states.most_common(top)],
            )
        )
    out.sort(key=lambda p: (-p.cpu_cores, p.thread))
    return out


# -- node processes ---------------------------------------------------------------------------
class NodeProcess:
    """One litecdc node (``bench_cluster.py node serve …``) on a fixed port and data dir."""

    def __init__(self, root: Path, index: int, etcd: Sequence[str], lease_ttl: int) -> None:
        self.node_id = f"n{index}"
        self.data_dir = root / self.node_id
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.log_path = root / f"{self.node_id}.log"
        self.etcd = list(etcd)
        self.lease_ttl = lease_ttl
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, sample_ms: float) -> NodeProcess:
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable, str(Path(__file__).resolve()), "node",
                    "--sample-ms", str(sample_ms),
                    "serve",
                    "--data-dir", str(self.data_dir),
                    "--http-addr", f"{HOST}:{self.port}",
                    "--node-id", self.node_id,
                    "--etcd", ",".join(self.etcd),
                    "--cluster", CLUSTER,
                    "--lease-ttl", str(self.lease_ttl),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE,
            )  # fmt: skip
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tell(self, line: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._close_stdin()

    def stop(self) -> None:
        """SIGTERM, then kill -9 after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


def get_json(client: httpx.Client, url: str) -> Any:
    response = client.get(url)
    response.raise_for_status()
    return response.json()


def wait_until(what: str, check: Callable[[], Any], timeout: float, poll: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_nodes_ready(client: httpx.Client, nodes: Sequence[NodeProcess]) -> None:
    def ready() -> bool:
        for node in nodes:
            if not node.running():
                raise RuntimeError(f"node {node.node_id} exited:\n{node.log_tail()}")
        return all(client.get(f"{n.url}/readyz").status_code == 200 for n in nodes)

    wait_until("every node ready (a leader known)", ready, READY_TIMEOUT_S)


def find_leader(client: httpx.Client, nodes: Sequence[NodeProcess]) -> NodeProcess:
    def one() -> NodeProcess | None:
        leaders = [n for n in nodes if get_json(client, f"{n.url}/status")["cluster"]["is_leader"]]
        return leaders[0] if len(leaders) == 1 else None

    leader: NodeProcess = wait_until("exactly one leader", one, READY_TIMEOUT_S)
    return leader


def cluster_status(client: httpx.Client, node: NodeProcess) -> dict[str, Any]:
    status: dict[str, Any] = get_json(client, f"{node.url}/status")["cluster"]
    return status


def wait_caught_up(client: httpx.Client, nodes: Sequence[NodeProcess], cid: int) -> None:
    wait_until(
        f"every node applied cid {cid}",
        lambda: all(cluster_status(client, n)["applied_cid"] >= cid for n in nodes),
        CATCH_UP_TIMEOUT_S,
    )


# -- load ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timing:
    warmup: float
    duration: float


@dataclass
class LoadResult:
    name: str
    clients: int
    txn_per_s: float
    ok: int
    errors: int
    first_error: str
    p50_ms: float
    p99_ms: float
    cpu_cores: dict[str, float | None]  # per group of processes
    loadgen_cores: float
    machine_busy: float | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_load(
    name: str,
    url: str,
    bodies: list[bytes],
    clients: int,
    processes: int,
    timing: Timing,
    pids: Mapping[str, Sequence[int]],
    window: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> LoadResult:
    """``clients`` stdlib keep-alive clients (``bench_http.worker``) POSTing ``bodies`` to
    ``url``; CPU of each group of ``pids`` over the measured window. ``window`` is called
    at the start and the end of the measured window."""
    ctx = mp.get_context("spawn")
    processes = max(1, min(processes, clients))
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    per_process = [clients // processes + (n < clients % processes) for n in range(processes)]
    procs = []
    first = 0
    for threads in per_process:
        args = (
            "stdlib", url, bodies, threads, first, timing.warmup, timing.duration,
            ready, go, results,
        )  # fmt: skip
        proc = ctx.Process(target=worker, daemon=True, args=args)
        first += threads
        proc.start()
        procs.append(proc)

    def cpu() -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for group, group_pids in pids.items():
            values = [process_cpu_seconds(pid) for pid in group_pids]
            out[group] = None if None in values else sum(v for v in values if v is not None)
        return out

    try:
        for _ in procs:
            ready.get(timeout=READY_TIMEOUT_S)
        go.set()
        time.sleep(timing.warmup)
        if window is not None:
            window[0]()
        cpu_before, machine_before = cpu(), machine_busy_idle()
        time.sleep(timing.duration)
        cpu_after, machine_after = cpu(), machine_busy_idle()
        if window is not None:
            window[1]()
        outs: list[WorkerResult] = [
            results.get(timeout=timing.warmup + timing.duration + REQUEST_TIMEOUT_S + 30)
            for _ in procs
        ]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    latencies = sorted(x for out in outs for x in out.latencies)
    ok = sum(out.ok for out in outs)
    return LoadResult(
        name=name,
        clients=clients,
        txn_per_s=ok / timing.duration,
        ok=ok,
        errors=sum(out.errors for out in outs),
        first_error=next((out.first_error for out in outs if out.first_error), ""),
        p50_ms=statistics.median(latencies) * 1e3 if latencies else float("nan"),
        p99_ms=percentile(latencies, 0.99) * 1e3,
        cpu_cores={
            group: cpu_cores(cpu_before[group], cpu_after[group], timing.duration) for group in pids
        },
        loadgen_cores=sum(out.cpu_seconds for out in outs) / timing.duration,
        machine_busy=busy_share(machine_before, machine_after),
    )


# -- failover ------------------------------------------------------------------------------------
@dataclass
class FailoverTrial:
    killed: str
    new_leader: str
    leader_known_s: float | None  # kill -> a survivor's /status says it leads
    first_write_s: float  # kill -> first acknowledged write sent after the kill
    failed_requests: int  # answers that were not a success, during the trial
    restart_catch_up_s: float  # restart of the killed node -> it applied the leader's cid


@dataclass
class _Writers:
    """Writer threads sending INSERTs to the survivors, retrying failures after 20 ms."""

    urls: Sequence[str]
    bodies: Sequence[bytes]
    threads: int
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    acks: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered)
    failures: int = 0
    _pool: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for n in range(self.threads):
            thread = threading.Thread(target=self._loop, args=(n,), daemon=True)
            thread.start()
            self._pool.append(thread)

    def _loop(self, n: int) -> None:
        conns: dict[str, http.client.HTTPConnection] = {}
        i = n * 97
        while not self.stop.is_set():
            url = self.urls[(i + n) % len(self.urls)]
            conn = conns.get(url)
            if conn is None:
                port = int(url.rsplit(":", 1)[1])
                conn = conns[url] = http.client.HTTPConnection(HOST, port, timeout=5.0)
            body = self.bodies[i % len(self.bodies)]
            i += 1
            sent = time.monotonic()
            try:
                conn.request(
                    "POST", "/db/execute", body=body,
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                reply = conn.getresponse()
                ok = reply.status == 200 and b'"error"' not in reply.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                conns.pop(url, None)
                ok = False
            answered = time.monotonic()
            with self.lock:
                if ok:
                    self.acks.append((sent, answered))
                else:
                    self.failures += 1
            if not ok:
                self.stop.wait(0.02)
        for conn in conns.values():
            conn.close()

    def first_ack_sent_after(self, moment: float) -> float | None:
        with self.lock:
            answers = [answered for sent, answered in self.acks if sent >= moment]
        return min(answers) if answers else None

    def close(self) -> None:
        self.stop.set()
        for thread in self._pool:
            thread.join(timeout=10)


def failover_trial(
    client: httpx.Client,
    nodes: list[NodeProcess],
    bodies: Sequence[bytes],
    sample_ms: float,
    writer_threads: int,
) -> FailoverTrial:
    leader = find_leader(client, nodes)
    survivors = [n for n in nodes if n is not leader]
    writers = _Writers([n.url for n in survivors], bodies, writer_threads)
    writers.start()
    leader_known: list[float] = []
    try:
        time.sleep(0.5)  # steady writes before the kill
        failures_before = writers.failures
        killed_at = time.monotonic()
        leader.kill()

        def poll_leader() -> None:
            with httpx.Client(timeout=1.0, trust_env=False) as poller:
                while not writers.stop.is_set() and not leader_known:
                    for node in survivors:
                        try:
                            if cluster_status(poller, node)["is_leader"]:
                                leader_known.append(time.monotonic())
                                return
                        except (httpx.HTTPError, KeyError):
                            pass
                    time.sleep(0.05)

        poller = threading.Thread(target=poll_leader, daemon=True)
        poller.start()
        first = wait_until(
            "the first acknowledged write after the kill",
            lambda: writers.first_ack_sent_after(killed_at),
            FAILOVER_TIMEOUT_S,
            poll=0.01,
        )
        time.sleep(0.2)
        poller.join(timeout=5)
    finally:
        writers.close()
    new_leader = find_leader(client, survivors)
    leader_cid = int(cluster_status(client, new_leader)["applied_cid"])
    restarted = time.monotonic()
    leader.start(sample_ms)
    wait_nodes_ready(client, [leader])
    wait_caught_up(client, [leader], leader_cid)
    return FailoverTrial(
        killed=leader.node_id,
        new_leader=new_leader.node_id,
        leader_known_s=leader_known[0] - killed_at if leader_known else None,
        first_write_s=first - killed_at,
        failed_requests=writers.failures - failures_before,
        restart_catch_up_s=time.monotonic() - restarted,
    )


# -- the profile ----------------------------------------------------------------------------------
def profile_leader(
    client: httpx.Client,
    leader: NodeProcess,
    followers: Sequence[NodeProcess],
    root: Path,
    run: Callable[[tuple[Callable[[], None], Callable[[], None]]], LoadResult],
) -> tuple[LoadResult, dict[str, dict[str, Any]], dict[str, int]]:
    """Runs ``run`` with the sampler on in every node; returns the load result, each
    node's sampler report and the leader's log counters over the window."""
    counters: dict[str, dict[str, int]] = {}
    nodes = [leader, *followers]

    def begin() -> None:
        counters["before"] = cluster_status(client, leader)["log"]
        for node in nodes:
            node.tell("start")

    def end() -> None:
        for node in nodes:
            node.tell(f"stop {root / f'profile-{node.node_id}.json'}")
        counters["after"] = cluster_status(client, leader)["log"]

    result = run((begin, end))
    reports: dict[str, dict[str, Any]] = {}
    for node in nodes:
        path = root / f"profile-{node.node_id}.json"
        wait_until(f"the profile of {node.node_id}", path.exists, 10.0)
        reports[node.node_id] = json.loads(path.read_text())
    delta = {k: counters["after"][k] - counters["before"][k] for k in counters["after"]}
    return result, reports, delta


# -- output --------------------------------------------------------------------------------------
def print_loads(loads: Sequence[LoadResult]) -> None:
    groups = list(dict.fromkeys(g for load in loads for g in load.cpu_cores))
    header = f"  {'case':<28}{'clients':>8}{'txn/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
    header += "".join(f"{g + ' CPU':>15}" for g in groups)
    print(header + f"{'loadgen CPU':>13}{'machine':>9}")
    for load in loads:
        busy = "n/a" if load.machine_busy is None else f"{load.machine_busy:.0%}"
        line = (
            f"  {load.name:<28}{load.clients:>8}{load.txn_per_s:>9,.0f}{load.p50_ms:>9.2f}"
            f"{load.p99_ms:>9.2f}{load.errors:>8}"
        )
        line += "".join(
            f"{cores(load.cpu_cores[g]) if g in load.cpu_cores else '':>15}" for g in groups
        )
        print(line + f"{cores(load.loadgen_cores):>13}{busy:>9}")
    for load in loads:
        if load.first_error:
            print(f"  first error in {load.name!r} ({load.errors} errors): {load.first_error}")
    print("  (CPU in cores over the measured window: 1.00 = one CPU fully busy)")


def print_profile(
    reports: Mapping[str, Mapping[str, Any]],
    leader_id: str,
    counters: Mapping[str, int],
    load: LoadResult,
    duration: float,
) -> None:
    applied = counters.get("entries_applied", 0)
    txns = counters.get("append_txns", 0)
    appended = counters.get("entries_appended", 0)
    print(
        f"  leader {leader_id}: {appended:,} entries in {txns:,} etcd txns "
        f"({appended / txns if txns else 0:.1f} entries per txn), {applied:,} entries applied "
        f"({applied / duration:,.0f}/s, one SQLite transaction each); load: "
        f"{load.txn_per_s:,.0f} txn/s, p50 {load.p50_ms:.1f} ms"
    )
    for node_id, report in sorted(reports.items(), key=lambda kv: kv[0] != leader_id):
        role = "leader" if node_id == leader_id else "follower"
        wall = float(report["wall_s"]) or 1.0
        print(
            f"\n  {node_id} ({role}): process {float(report['process_cpu_s']) / wall:.2f} cores; "
            f"{report['ticks']} samples over {wall:.1f} s"
        )
        profiles = summarise_profile(report)
        named_cpu = sum(p.cpu_cores for p in profiles)
        for profile in profiles:
            if role == "follower" and profile.thread != "litecdc-apply":
                continue
            busy = [(s, share) for s, share in profile.states if s != "idle" and share >= 0.005]
            if not busy and profile.cpu_cores < 0.02:
                continue
            print(f"    thread {profile.thread!r}: {profile.cpu_cores:.2f} cores CPU")
            for state, share in busy:
                print(f"      {share:>6.0%}  {state}")
        if role == "leader":
            other = float(report["process_cpu_s"]) / wall - named_cpu
            print(f"    threads without a Python frame (gRPC's own, …): {other:.2f} cores CPU")
    print(
        "  (a state's share is the average number of that thread group's threads in it, over "
        "wall time: 100% = one thread all the time, including waits for the GIL; idle states "
        "are not shown)"
    )
    lead = reports[leader_id]
    apply_wait = state_share(lead, "litecdc-apply", "waiting for the next log watch")
    begin_commit = state_share(lead, "litecdc-apply", "SQLite ")
    applying = state_share(lead, "litecdc-apply", "applying")
    apply_lock = state_share(lead, "litecdc-apply", "waiting for a lock")
    etcd = state_share(lead, "litecdc-log-appender", "etcd txn")
    appender_lock = state_share(lead, "litecdc-log-appender", "waiting for a lock")
    http_lock = state_share(lead, "AnyIO worker thread", "waiting for a lock")
    print(
        f"  leader: apply thread busy {1 - apply_wait:.0%} of the time (SQLite BEGIN + COMMIT "
        f"{begin_commit:.0%}, the entry's SQL and capture {applying:.0%}, waiting for the journal "
        f"lock {apply_lock:.0%}); appender thread in etcd txns {etcd:.0%}, waiting for its lock "
        f"{appender_lock:.0%}; HTTP worker threads waiting for the appender or journal lock: "
        f"{http_lock:.1f} on average"
    )
    if 1 - apply_wait > etcd:
        print(
            "  -> the limit is the leader's apply loop (one SQLite transaction per entry, under "
            "the journal lock that cid allocation also needs), not the etcd appends"
        )
    else:
        print("  -> the limit is the etcd appends, not the leader's apply loop")


def state_share(report: Mapping[str, Any], thread: str, state_prefix: str) -> float:
    for profile in summarise_profile(report, top=100):
        if profile.thread == thread:
            return sum(share for s, share in profile.states if s.startswith(state_prefix))
    return 0.0


# -- main ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument("--duration", type=float, default=5.0, help="measured s (default 5)")
    parser.add_argument("--warmup", type=float, default=1.0, help="warm-up s (default 1)")
    parser.add_argument(
        "--clients", type=int, default=16, help="clients in the concurrent case (default 16)"
    )
    parser.add_argument(
        "--processes", type=int, default=2, help="load-generator processes (default 2)"
    )
    parser.add_argument("--trials", type=int, default=3, help="failover trials (default 3)")
    parser.add_argument(
        "--lease-ttl", type=int, default=2, help="the leader's lease in seconds (default 2)"
    )
    parser.add_argument(
        "--failover-writers",
        type=int,
        default=4,
        help="writer threads during a failover trial (default 4)",
    )
    parser.add_argument(
        "--sample-ms", type=float, default=5.0, help="stack sampling interval (default 5 ms)"
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the standalone node's cases"
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled run")
    add_output_arguments(parser, data_dir="the etcd and node data directories")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.warmup < 0 or args.duration > 120 or args.warmup > 30:
        parser.error("--duration must be in (0, 120] and --warmup in [0, 30]")
    if min(args.clients, args.processes, args.trials, args.failover_writers) < 1:
        parser.error("--clients, --processes, --trials and --failover-writers must be >= 1")
    if args.trials > 20 or args.lease_ttl < 2 or args.sample_ms < 1:
        parser.error("--trials is at most 20, --lease-ttl at least 2, --sample-ms at least 1")
    if not _has_tests():
        parser.error(f"{SYSTEM_TESTS / 'etcd_cluster.py'} is missing (run from a checkout)")

    root, cleanup = data_root(parser, args.data_dir, "litecdc-bench-cluster-")
    timing = Timing(args.warmup, args.duration)
    bodies = write_bodies(BODY_POOL, seed=1)
    versions = {"etcd": etcd_version(), **sqlite_versions(), "httpx": httpx.__version__}
    print(platform_line("litecdc cluster benchmark", versions))
    print(load_note())
    started = time.monotonic()
    loads: list[LoadResult] = []
    nodes: list[NodeProcess] = []
    etcd: EtcdClusterLike | None = None
    try:
        if not args.no_baseline:
            loads += run_baseline(root, bodies, args, timing)
        etcd = etcd_cluster(root / "etcd", size=3).start()
        etcd_pids = [m.process.pid for m in etcd.members if m.process is not None]
        nodes = [NodeProcess(root, i, etcd.endpoints, args.lease_ttl) for i in range(3)]
        for node in nodes:
            node.start(args.sample_ms)
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            wait_nodes_ready(client, nodes)
            leader = find_leader(client, nodes)
            followers = [n for n in nodes if n is not leader]
            print(
                f"cluster: 3-member etcd {', '.join(etcd.endpoints)}; nodes "
                + ", ".join(f"{n.node_id} {n.url}" for n in nodes)
                + f"; leader {leader.node_id}; lease {args.lease_ttl} s; synchronous=FULL"
            )
            print(
                f"each load case: {args.warmup:g} s warm-up, then {args.duration:g} s measured; "
                "single-row INSERT per POST /db/execute to the leader; http.client keep-alive"
            )
            response = client.post(f"{leader.url}/db/execute", json=[CREATE_TABLE])
            response.raise_for_status()
            pids = {
                "leader": [leader.pid],
                "followers": [n.pid for n in followers],
                "etcd": etcd_pids,
            }
            url = f"{leader.url}/db/execute"
            for clients, processes in ((1, 1), (args.clients, args.processes)):
                loads.append(
                    run_load(
                        "cluster, to the leader", url, bodies, clients, processes, timing, pids
                    )
                )
            print()
            print_loads(loads)

            profile: dict[str, Any] = {}
            if not args.no_profile:
                print(
                    f"\nwhere the time goes: {args.clients} clients again, every node sampling "
                    f"its threads every {args.sample_ms:g} ms during the measured window"
                )
                profiled, reports, counters = profile_leader(
                    client,
                    leader,
                    followers,
                    root,
                    lambda window: run_load(
                        "cluster, profiled",
                        url,
                        bodies,
                        args.clients,
                        args.processes,
                        timing,
                        pids,
                        window,
                    ),
                )
                print_profile(reports, leader.node_id, counters, profiled, args.duration)
                lead = reports[leader.node_id]
                profile = {
                    "load": asdict(profiled),
                    "leader_counters": counters,
                    "leader_apply_commit_share": state_share(
                        lead, "litecdc-apply", "SQLite COMMIT"
                    ),
                    "leader_apply_idle_share": state_share(
                        lead, "litecdc-apply", "waiting for the next log watch"
                    ),
                    "leader_appender_etcd_share": state_share(
                        lead, "litecdc-log-appender", "etcd txn"
                    ),
                    "threads": {
                        node_id: [asdict(p) for p in summarise_profile(r)]
                        for node_id, r in reports.items()
                    },
                }

            print(
                f"\nfailover: {args.trials} trials; kill -9 the leader while "
                f"{args.failover_writers} writer threads send INSERTs to the survivors"
            )
            trials = []
            for n in range(args.trials):
                trial = failover_trial(client, nodes, bodies, args.sample_ms, args.failover_writers)
                trials.append(trial)
                known = "n/a" if trial.leader_known_s is None else f"{trial.leader_known_s:.2f} s"
                print(
                    f"  trial {n + 1}: killed {trial.killed} -> leader {trial.new_leader}: "
                    f"leader known after {known}, first acknowledged write after "
                    f"{trial.first_write_s:.2f} s ({trial.failed_requests} failed requests "
                    f"meanwhile); {trial.killed} restarted and caught up in "
                    f"{trial.restart_catch_up_s:.1f} s"
                )
            leader = find_leader(client, nodes)
            cid = int(cluster_status(client, leader)["applied_cid"])
            wait_caught_up(client, nodes, cid)
            counts = [
                get_json(
                    client,
                    f"{n.url}/db/query?level=none&min_cid={cid}&q=SELECT+count(*)+FROM+{TABLE}",
                )["results"][0]["values"][0][0]
                for n in nodes
            ]
        print_summary(loads, trials, counts, args)
        print(f"  total time: {time.monotonic() - started:.0f} s")
        if args.json:
            doc = {
                **platform_json(versions),
                "duration_s": args.duration,
                "warmup_s": args.warmup,
                "lease_ttl_s": args.lease_ttl,
                "cases": [asdict(load) for load in loads],
                "failover": [asdict(t) for t in trials],
                "failover_median_s": statistics.median(t.first_write_s for t in trials),
                "rows_per_node": counts,
                "profile": profile,
            }
            print(json.dumps(doc, separators=(",", ":")))
    except (RuntimeError, httpx.HTTPError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        for node in nodes:
            if node.proc is not None and node.proc.poll() is not None:
                print(f"{node.node_id} log tail:\n{node.log_tail()}", file=sys.stderr)
        return 1
    finally:
        for node in nodes:
            node.stop()
        if etcd is not None:
            etcd.close()
        cleanup()
    return 0


def run_baseline(root: Path, bodies: list[bytes], args: Any, timing: Timing) -> list[LoadResult]:
    """The same two cases against a standalone node (no etcd), stopped afterwards."""
    port = free_port()
    log_path = root / "standalone.log"
    server = start_server(root / "standalone", port, log_path)
    try:
        ready_s = wait_ready(f"http://{HOST}:{port}", server, log_path)
        print(f"baseline: standalone litecdc serve on {HOST}:{port} (ready in {ready_s:.1f} s)")
        with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client:
            client.post(f"http://{HOST}:{port}/db/execute", json=[CREATE_TABLE]).raise_for_status()
        url = f"http://{HOST}:{port}/db/execute"
        pids = {"leader": [server.pid]}
        return [
            run_load("standalone node (baseline)", url, bodies, clients, processes, timing, pids)
            for clients, processes in ((1, 1), (args.clients, args.processes))
        ]
    finally:
        stop_server(server)


def print_summary(
    loads: Sequence[LoadResult], trials: Sequence[FailoverTrial], counts: Sequence[Any], args: Any
) -> None:
    cluster = [load for load in loads if load.name.startswith("cluster, to")]
    baseline = [load for load in loads if load.name.startswith("standalone")]
    one, many = cluster[0], cluster[1]
    print("\nsummary")
    line = (
        f"  writes: {one.txn_per_s:,.0f} txn/s with 1 client (p50 {one.p50_ms:.1f} ms, "
        f"p99 {one.p99_ms:.1f} ms), {many.txn_per_s:,.0f} txn/s with {many.clients} clients "
        f"(p50 {many.p50_ms:.1f} ms, p99 {many.p99_ms:.1f} ms)"
    )
    print(line)
    if baseline:
        print(
            f"  vs a standalone node in the same run: {one.txn_per_s / baseline[0].txn_per_s:.2f}"
            f" with 1 client ({baseline[0].txn_per_s:,.0f} txn/s), "
            f"{many.txn_per_s / baseline[1].txn_per_s:.2f} with {many.clients} clients "
            f"({baseline[1].txn_per_s:,.0f} txn/s)"
        )
    met = "met" if many.txn_per_s >= WRITE_TARGET else "NOT met"
    note = "" if many.clients == 16 else f" (measured with {many.clients}, not 16)"
    print(f"  target >= {WRITE_TARGET:,.0f} txn/s with 16 clients: {met}{note}")
    times = sorted(t.first_write_s for t in trials)
    median = statistics.median(times)
    print(
        f"  failover (kill -9 leader -> first acknowledged write): median {median:.2f} s over "
        f"{len(times)} trials (min {times[0]:.2f}, max {times[-1]:.2f}); lease {args.lease_ttl} s"
    )
    met = "met" if median <= FAILOVER_TARGET_S else "NOT met"
    note = "" if args.lease_ttl == 2 else f" (measured with a {args.lease_ttl} s lease)"
    print(f"  target <= {FAILOVER_TARGET_S:g} s median with a 2 s lease: {met}{note}")
    same = "identical" if len(set(counts)) == 1 else "DIFFERENT"
    print(f"  rows on each node at the end: {' / '.join(map(str, counts))} ({same})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        run_node(sys.argv[2:])
    else:
        sys.exit(main())
