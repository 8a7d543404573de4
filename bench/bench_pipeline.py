"""Spark pipeline: snapshot rows/s vs Spark's JDBC reader, events/s into Delta and PostgreSQL, lag.

Everything runs on this machine, Spark ``local[2]``:

* a real ``litecdc serve`` process on a free 127.0.0.1 port with a fresh data directory;
  tables are filled over HTTP with multi-row INSERTs (each one transaction);
* **snapshot**: a ``--rows``-row table (id INTEGER PRIMARY KEY, a TEXT, b REAL, c INTEGER)
  read through ``spark.read.format("litecdc")`` with 2 partitions, written to Spark's
  ``noop`` sink, against Spark's JDBC reader over the SAME SQLite file (the node's
  ``db.sqlite``, opened read-only, Debian's sqlite-jdbc driver, ``customSchema`` so that
  INTEGER is read as BIGINT) with ``partitionColumn id``, 2 partitions and 1 partition.
  Each reader runs twice to warm up (the JVM's compiler is still at work on the Arrow path
  in the second run), then the best and the median of ``--repeats`` runs are reported. A
  Spark-free line shows what the node serves by itself: the same two key ranges paged
  with ``SourceClient.rows`` from two threads of this process;
* **incremental**: a ``--events`` backlog (500 inserts, 350 updates, 150 deletes per
  transaction, every event on a different key of a seeded table, so no sink can net
  events out) written while the pipeline is stopped, then ``PipelineServer.run(
  until_caught_up=True)`` on a subscription whose snapshot is done (done beforehand on
  the empty table) — one for a Delta table (delta-rs) and one for a throwaway PostgreSQL
  server (``tests/servers``, Debian's binaries). Timed from the start of ``run`` to its
  return: read through Spark (``mode=changes``) + ``sink.write_changes``, both timed too;
* **lag**: single-row transactions (3 inserts : 1 update) at a steady ``--rate`` per second
  for ``--duration`` seconds (after ``--warmup`` s) from a separate process, on an
  absolute schedule, while a ``PipelineServer`` (``poll_interval`` ``--poll``) mirrors the
  table into Delta. Lag of a write = time the sink commit holding its cid returned -
  time the node acknowledged the write (both CLOCK_MONOTONIC, system-wide on Linux).

The bench imports ``tests.servers`` for PostgreSQL, so it puts the repository root on
``sys.path`` itself (the script runs as ``.venv/bin/python bench/bench_pipeline.py``).
Every process it starts (node, PostgreSQL, the writer, Spark's JVM) is stopped at the end.

    .venv/bin/python bench/bench_pipeline.py
    .venv/bin/python bench/bench_pipeline.py --rows 200000 --events 20000 --duration 5
    .venv/bin/python bench/bench_pipeline.py --profile   # plus where the snapshot time goes

``--profile`` adds Spark's Python data source with a source that costs nothing (ready-made
Arrow batches), and the node's snapshot path timed step by step in this process.
"""

from __future__ import annotations

import bisect
import importlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
from common import (
    add_output_arguments,
    busy_share,
    cores,
    cpu_cores,
    data_root,
    descendants,
    load_note,
    machine_busy_idle,
    new_parser,
    platform_json,
    platform_line,
    process_cpu_seconds,
    process_table,
    require_at_least_one,
    sqlite_versions,
)

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.servers (the throwaway PostgreSQL server)

from litecdc.pipeline.metadata import MetadataStore, sqlite_url  # noqa: E402
from litecdc.pipeline.server import PipelineServer, SubscriptionState  # noqa: E402
from litecdc.pipeline.sinks.base import ChangeBatch, Sink  # noqa: E402
from litecdc.pipeline.source_client import SourceClient  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from litecdc.pipeline.metadata import Subscription

HOST = "127.0.0.1"
MASTER = "local[2]"
READY_TIMEOUT_S = 60.0
SNAPSHOT_TABLE = "snap"
INCREMENTAL_TABLE = "inc"
LAG_TABLE = "lagt"
COLUMNS = "id INTEGER PRIMARY KEY, a TEXT, b REAL, c INTEGER"
INSERT_ROWS_PER_STATEMENT = 20_000  # one transaction per HTTP request while loading
CATCH_UP_TIMEOUT_S = 120.0

# Debian's sqlite-jdbc: the jar, and the JNI library it loads (libxerial-sqlite-jdbc-jni)
SQLITE_JDBC_JAR = "/usr/share/java/sqlite-jdbc.jar"
SQLITE_JNI_DIR = "/usr/lib/x86_64-linux-gnu/jni"

TARGET_SNAPSHOT_RATIO = 1.0
WARMUP_RUNS = 2  # untimed runs of each snapshot reader
TARGET_DELTA_EVENTS_PER_S = 20_000
TARGET_LAG_P99_S = 10.0


# -- the node -----------------------------------------------------------------------------------
class Node:
    """``python -m litecdc serve`` on a free port; stopped (SIGTERM, then SIGKILL) by close."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind((HOST, 0))
            self.port = int(sock.getsockname()[1])
        self.data_dir = data_dir
        self.log_path = log_path
        self.url = f"http://{HOST}:{self.port}"
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "litecdc", "serve"),
                    *("--data-dir", str(data_dir), "--http-addr", f"{HOST}:{self.port}"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.http = httpx.Client(timeout=300.0, trust_env=False)
        self._wait_ready()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "db.sqlite"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litecdc serve exited: {self.log_tail()}")
            try:
                if self.http.get(f"{self.url}/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"litecdc serve not ready in {READY_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def execute(self, statements: list[Any]) -> list[dict[str, Any]]:
        """Run statements in one request; RuntimeError on any statement error."""
        response = self.http.post(f"{self.url}/db/execute", json=statements)
        response.raise_for_status()
        results: list[dict[str, Any]] = response.json()["results"]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise RuntimeError(f"node: {errors[0]}")
        return results

    def close(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)


def row_sql(i: int) -> str:
    return f"({i},'row-{i:09d}-{'abcdefghij'[i % 10] * 12}',{i * 0.25},{i * 7919 % 1000003})"


def fill_snapshot_table(node: Node, rows: int) -> float:
    """Insert ``rows`` rows in multi-row INSERTs; returns rows/s."""
    node.execute([f"CREATE TABLE {SNAPSHOT_TABLE}({COLUMNS})"])
    started = time.perf_counter()
    for lo in range(1, rows + 1, INSERT_ROWS_PER_STATEMENT):
        hi = min(lo + INSERT_ROWS_PER_STATEMENT, rows + 1)
        values = ",".join(row_sql(i) for i in range(lo, hi))
        node.execute([f"INSERT INTO {SNAPSHOT_TABLE} VALUES {values}"])
    return rows / (time.perf_counter() - started)


EVENTS_PER_ROUND = 1000  # 500 inserts, 350 updates, 150 deletes: one transaction


def seed_rows(events: int) -> int:
    """Rows the incremental table starts with: enough that no backlog event touches a key
    another event touched (nothing for a sink to net out)."""
    return -(-events // EVENTS_PER_ROUND) * 500


def seed_incremental_table(node: Node, rows: int) -> None:
    for lo in range(1, rows + 1, INSERT_ROWS_PER_STATEMENT):
        hi = min(lo + INSERT_ROWS_PER_STATEMENT, rows + 1)
        values = ",".join(row_sql(i) for i in range(lo, hi))
        node.execute([f"INSERT INTO {INCREMENTAL_TABLE} VALUES {values}"])


def write_backlog(node: Node, events: int) -> tuple[int, dict[str, int], float]:
    """Rounds of 500 inserts of new rows, 350 updates and 150 deletes of seeded rows, each
    round one request (one transaction); every event touches a different key. Returns
    (events, per op, seconds)."""
    counts = {"insert": 0, "update": 0, "delete": 0}
    seeded = seed_rows(events)
    started = time.perf_counter()
    for r in range(-(-events // EVENTS_PER_ROUND)):
        first = seeded + 1 + 500 * r
        values = ",".join(row_sql(i) for i in range(first, first + 500))
        results = node.execute(
            [
                f"INSERT INTO {INCREMENTAL_TABLE} VALUES {values}",
                f"UPDATE {INCREMENTAL_TABLE} SET b = b + 1, c = c + 1, a = a || 'u' "
                f"WHERE id > {350 * r} AND id <= {350 * (r + 1)}",
                f"DELETE FROM {INCREMENTAL_TABLE} "
                f"WHERE id > {seeded - 150 * (r + 1)} AND id <= {seeded - 150 * r}",
            ]
        )
        for op, result in zip(("insert", "update", "delete"), results, strict=True):
            counts[op] += int(result.get("rows_affected", 0))
    return sum(counts.values()), counts, time.perf_counter() - started


# -- Spark ---------------------------------------------------------------------------------------
def start_spark() -> SparkSession:
    """litecdc's own session (``spark_session``), with Debian's sqlite-jdbc on the driver's
    class path and its JNI library on java.library.path (local mode: the driver is the
    executor)."""
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--jars {SQLITE_JDBC_JAR} --driver-class-path {SQLITE_JDBC_JAR} "
        f"--driver-java-options -Djava.library.path={SQLITE_JNI_DIR} pyspark-shell"
    )
    from litecdc.pipeline.spark import spark_session

    return spark_session(MASTER, app_name="litecdc-bench-pipeline")


@dataclass
class ReadResult:
    name: str
    rows: int
    runs_s: list[float]
    node_cores: float | None = None  # the node's CPU during the best run
    machine_busy: float | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU by process group, best run

    @property
    def best_s(self) -> float:
        return min(self.runs_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.best_s


def time_reads(
    name: str, rows: int, run: Callable[[], None], repeats: int, node_pid: int | None
) -> ReadResult:
    for _ in range(WARMUP_RUNS):  # JIT, Python workers, page cache
        run()
    result = ReadResult(name, rows, [])
    for _ in range(repeats):
        cpu0, busy0 = process_cpu_seconds(node_pid), machine_busy_idle()
        groups0 = cpu_by_group(node_pid)
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
        if not result.runs_s or seconds < result.best_s:
            result.node_cores = cpu_cores(cpu0, process_cpu_seconds(node_pid), seconds)
            result.machine_busy = busy_share(busy0, machine_busy_idle())
            groups = cpu_by_group(node_pid)
            result.cpu_s = {
                group: sum(cpu - groups0.get(group, {}).get(pid, 0.0) for pid, cpu in pids.items())
                for group, pids in groups.items()
            }
        result.runs_s.append(seconds)
    return result


CPU_GROUPS = ("node main", "node workers", "Spark JVM", "Spark Python workers", "this process")


def cpu_by_group(node_pid: int | None) -> dict[str, dict[int, float]]:
    """CPU seconds of every process of the run, by pid, in CPU_GROUPS: the node, the
    node's worker processes, and below this process the JVM (``java``) and everything
    else (Spark's Python workers), and this process (the Spark driver; the client of the
    "node alone" read). Empty without Linux /proc."""
    table = process_table()
    node_tree = descendants(table, node_pid) if node_pid is not None else set()
    groups: dict[str, dict[int, float]] = {g: {} for g in CPU_GROUPS}
    if os.getpid() in table:
        groups["this process"][os.getpid()] = table[os.getpid()][2]
    for pid in descendants(table, os.getpid()):
        _, name, cpu = table[pid]
        if pid == node_pid:
            groups["node main"][pid] = cpu
        elif pid in node_tree:
            groups["node workers"][pid] = cpu
        else:
            groups["Spark JVM" if name == "java" else "Spark Python workers"][pid] = cpu
    return groups if table else {}


def snapshot_readers(spark: SparkSession, node: Node, rows: int) -> dict[str, Callable[[], None]]:
    def litecdc_read() -> None:
        (
            spark.read.format("litecdc")
            .option("url", node.url)
            .option("table", SNAPSHOT_TABLE)
            .option("partitions", 2)
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        )

    def jdbc_read(partitions: int) -> Callable[[], None]:
        def run() -> None:
            reader = (
                spark.read.format("jdbc")
                .option("url", f"jdbc:sqlite:file:{node.db_path}?mode=ro")
                .option("driver", "org.sqlite.JDBC")
                .option("dbtable", SNAPSHOT_TABLE)
                .option("customSchema", "id BIGINT, a STRING, b DOUBLE, c BIGINT")
            )
            if partitions > 1:
                reader = (
                    reader.option("partitionColumn", "id")
                    .option("lowerBound", 1)
                    .option("upperBound", rows)
                    .option("numPartitions", partitions)
                )
            reader.load().write.format("noop").mode("overwrite").save()

        return run

    return {
        "litecdc": litecdc_read,
        "jdbc": jdbc_read(2),
        "jdbc, 1 partition": jdbc_read(1),
    }


def node_only_read(node: Node) -> None:
    """The two key ranges the litecdc source reads, paged by SourceClient from two threads
    of this process: what the node serves (and Arrow IPC decodes) without Spark."""
    with SourceClient(node.url) as client:
        ranges = client.splits(SNAPSHOT_TABLE, 2).ranges()

    def page_through(bounds: tuple[Any, Any]) -> int:
        after, until = bounds
        count = 0
        with SourceClient(node.url) as client:
            while True:
                page = client.rows(SNAPSHOT_TABLE, after_key=after, until_key=until, limit=50_000)
                count += int(page.table.num_rows)
                if page.done or page.last_key is None:
                    return count
                after = page.last_key

    with ThreadPoolExecutor(len(ranges)) as pool:
        sum(pool.map(page_through, ranges))


# -- where the snapshot time goes (--profile) ----------------------------------------------------
PAGE_ROWS = 50_000  # the data source's default page_rows


def profile_node_rows(db_path: Path) -> dict[str, float]:
    """The node's snapshot path for the whole table, in this process on one core, on the
    node's file opened read-only: ``litecdc.db.source.read_rows`` (what the node runs per
    page) and ``wire.to_ipc`` (its answer body), then read_rows' steps redone one by one.
    Returns seconds per step."""
    import apsw

    from litecdc.db import source
    from litecdc.wire import to_ipc

    conn = apsw.Connection(
        f"file:{db_path}?mode=ro", flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
    )
    try:
        spec = source.describe(conn, SNAPSHOT_TABLE)
        types = [pa.int64(), pa.string(), pa.float64(), pa.int64()]
        sql = f"SELECT id, a, b, c FROM {SNAPSHOT_TABLE} WHERE id > ? ORDER BY id LIMIT ?"
        took = dict.fromkeys(
            ("read_rows", "to_ipc", "sqlite_step", "fetchall", "transpose", "pa_array"), 0.0
        )
        after: list[Any] | None = None
        while True:
            t0 = time.perf_counter()
            page = source.read_rows(conn, spec, after, None, PAGE_ROWS)
            t1 = time.perf_counter()
            to_ipc(page.rows)
            t2 = time.perf_counter()
            bound = (after[0] if after else 0, PAGE_ROWS)
            for _ in conn.execute(sql, bound):
                pass
            t3 = time.perf_counter()
            rows = conn.execute(sql, bound).fetchall()
            t4 = time.perf_counter()
            columns = list(zip(*rows, strict=True))
            t5 = time.perf_counter()
            for column, kind in zip(columns, types, strict=False):  # none: an empty page
                pa.array(column, kind)
            t6 = time.perf_counter()
            for name, seconds in zip(
                took, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True
            ):
                took[name] += seconds
            if page.done or page.last_key is None:
                return took
            after = page.last_key
    finally:
        conn.close()


def spark_arrow_ceiling(spark: SparkSession, rows: int) -> Callable[[], None]:
    """A Python data source that yields ready-made Arrow batches (the snapshot table's
    shape, 50k rows each, built once per partition) in 2 partitions: what Spark's Python
    data source path itself moves per second, with a source that costs nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingReader(DataSourceReader):
        def __init__(self, total: int) -> None:
            self.total = total

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            n = PAGE_ROWS
            batch = pa.RecordBatch.from_arrays(
                [
                    pa.array(range(n), pa.int64()),
                    pa.array([f"row-{i:09d}-cccccccccccc" for i in range(n)], pa.string()),
                    pa.array([i * 0.25 for i in range(n)], pa.float64()),
                    pa.array(range(n), pa.int64()),
                ],
                names=["id", "a", "b", "c"],
            )
            for _ in range(self.total // 2 // n):
                yield batch

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "litecdc_bench_ceiling"

        def schema(self) -> str:
            return "id BIGINT, a STRING, b DOUBLE, c BIGINT"

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader(int(self.options.get("rows", "0")))

    spark.dataSource.register(CeilingSource)

    def run() -> None:
        (
            spark.read.format("litecdc_bench_ceiling")
            .option("rows", str(rows))
            .load()
            .write.format("noop")
            .mode("overwrite")
            .save()
        )

    return run


def print_profile(rows: int, took: dict[str, float]) -> None:
    print(
        f"\nprofile: the node's snapshot path over all {rows:,} rows, in this process on one "
        f"core ({PAGE_ROWS:,}-row pages, read-only on the node's file)"
    )
    notes = {
        "read_rows": "litecdc.db.source.read_rows, the whole page (what the node runs)",
        "to_ipc": "litecdc.wire.to_ipc, the answer body",
        "sqlite_step": "  of which: SQLite stepping the SELECT, rows discarded",
        "fetchall": "  apsw fetchall: SQLite + a Python tuple per row",
        "transpose": "  zip(*rows): Python rows to Python columns",
        "pa_array": "  pa.array per column, from Python objects",
    }
    for name, seconds in took.items():
        print(
            f"  {name:<12}{seconds:>7.2f} s {seconds / rows * 1e6:>7.2f} us/row "
            f"{rows / seconds if seconds else 0:>12,.0f} rows/s   {notes[name]}"
        )


# -- the pipeline, timed -------------------------------------------------------------------------
@dataclass
class Applied:
    """One sink commit of a change batch."""

    finished: float  # time.monotonic() when write_changes returned
    end_cid: int
    events: int
    seconds: float


@dataclass
class PipelineTimes:
    reads: list[float] = field(default_factory=list)  # Spark read (toArrow) per batch
    commits: list[Applied] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class TimedSink(Sink):
    """Delegates to the real sink; records when each change batch's commit returned."""

    def __init__(self, inner: Sink, times: PipelineTimes) -> None:
        super().__init__(inner.url, inner.spec, inner.subscription)
        self.kind = inner.kind
        self.inner = inner
        self.times = times

    def prepare(self) -> None:
        self.inner.prepare()

    def write_snapshot(self, rows: pa.Table) -> None:
        self.inner.write_snapshot(rows)

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        started = time.monotonic()
        applied = self.inner.write_changes(events, batch)
        finished = time.monotonic()
        with self.times.lock:
            self.times.commits.append(
                Applied(finished, batch.end_cid, events.num_rows, finished - started)
            )
        return applied

    def finish_snapshot(self, init_cid: int) -> int:
        return self.inner.finish_snapshot(init_cid)

    def applied_cid(self) -> int:
        return self.inner.applied_cid()

    def read_rows(self) -> pa.Table:
        return self.inner.read_rows()

    def evolve(self, spec: Any) -> None:
        self.inner.evolve(spec)
        self.spec = spec

    def close(self) -> None:
        self.inner.close()


class TimedServer(PipelineServer):
    """A PipelineServer whose Spark reads and sink commits are timed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.times = PipelineTimes()

    def _start(self, sub: Subscription, state: SubscriptionState) -> Any:
        running = super()._start(sub, state)
        if running.sink is not None:
            running.sink = TimedSink(running.sink, self.times)
        return running

    def _read(self, running: Any, options: dict[str, str]) -> pa.Table:
        started = time.perf_counter()
        table = super()._read(running, options)
        if options.get("mode") == "changes":
            self.times.reads.append(time.perf_counter() - started)
        return table


def new_server(meta: MetadataStore, spark: SparkSession, owner: str, poll: float) -> TimedServer:
    return TimedServer(meta, spark, owner=owner, poll_interval=poll)


def run_until_caught_up(server: PipelineServer, what: str) -> None:
    failing = server.run(until_caught_up=True)
    if failing:
        errors = [s.last_error for s in server.states.values() if s.last_error]
        raise RuntimeError(f"{what}: pipeline failed: {errors[:1]}")


@dataclass
class IncrementalResult:
    sink: str  # delta, postgresql
    events: int
    seconds: float
    batches: int
    read_s: float
    apply_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def run_incremental(
    meta: MetadataStore, spark: SparkSession, owner: str, sink: str, events: int
) -> IncrementalResult:
    server = new_server(meta, spark, owner, poll=0.2)
    started = time.perf_counter()
    run_until_caught_up(server, f"incremental into {sink}")
    seconds = time.perf_counter() - started
    applied = sum(c.events for c in server.times.commits)
    if applied < events:
        raise RuntimeError(f"incremental into {sink}: {applied} of {events} events applied")
    return IncrementalResult(
        owner,
        applied,
        seconds,
        len(server.times.commits),
        sum(server.times.reads),
        sum(c.seconds for c in server.times.commits),
    )


# -- the lag writer (a separate process) ---------------------------------------------------------
LATE_S = 0.1  # a write that starts this much behind its slot counts as late
WRITER_THREADS = 4  # one sequential client cannot hold 500 txn/s on a busy 2-core machine


def lag_writer(url: str, rate: float, seconds: float, out: Connection) -> None:
    """Single-row transactions at ``rate``/s for ``seconds`` on an absolute schedule that
    does not drift, slot n taken by thread n % WRITER_THREADS; sends back
    [(cid, ack monotonic time, started late)]. Slot n inserts row n, except every 4th,
    which updates the latest row inserted at least 100 slots earlier."""
    interval = 1.0 / rate
    slots = int(seconds * rate)
    begin = time.monotonic() + 0.2
    records: list[tuple[int, float, bool]] = []
    lock = threading.Lock()
    failures: list[str] = []

    def statement(n: int) -> str:
        if n % 4 != 3 or n < 100:
            return f"INSERT INTO {LAG_TABLE} VALUES {row_sql(n + 1)}"
        target = n - 100
        while target % 4 == 3:
            target -= 1
        return f"UPDATE {LAG_TABLE} SET c = c + 1 WHERE id = {target + 1}"

    def work(first: int) -> None:
        mine: list[tuple[int, float, bool]] = []
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            for n in range(first, slots, WRITER_THREADS):
                slot = begin + n * interval
                now = time.monotonic()
                if slot > now:
                    time.sleep(slot - now)
                late = time.monotonic() - slot > LATE_S
                try:
                    response = client.post(f"{url}/db/execute?raft_index", json=[statement(n)])
                    ack = time.monotonic()
                    response.raise_for_status()
                    mine.append((int(response.json()["raft_index"]), ack, late))
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    with lock:
                        failures.append(f"{type(exc).__name__}: {exc}")
        with lock:
            records.extend(mine)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WRITER_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records.sort(key=lambda r: r[1])
    out.send((records, failures[:3], len(failures)))
    out.close()


@dataclass
class LagResult:
    rate: float
    achieved_rate: float
    writes: int
    late: int
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float
    commits: int
    events_per_commit: float
    read_mean_s: float
    apply_mean_s: float
    missing: int
    machine_busy: float | None
    node_cores: float | None


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def run_lag(
    meta: MetadataStore,
    spark: SparkSession,
    node: Node,
    rate: float,
    duration: float,
    warmup: float,
    poll: float,
) -> LagResult:
    server = new_server(meta, spark, "lag", poll=poll)
    thread = threading.Thread(target=server.run, name="pipeline", daemon=True)
    thread.start()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    writer = ctx.Process(
        target=lag_writer, args=(node.url, rate, warmup + duration, child), daemon=True
    )
    try:
        # the server is caught up on the empty table already; give it a round to start
        time.sleep(1.0)
        cpu0, busy0 = process_cpu_seconds(node.proc.pid), machine_busy_idle()
        writer.start()
        child.close()
        if not parent.poll(warmup + duration + 60.0):
            raise RuntimeError("lag writer: no answer")
        records, failures, failed = parent.recv()
        if failed:
            raise RuntimeError(f"lag writer: {failed} writes failed, e.g. {failures}")
        writer.join(timeout=10)
        write_end = time.monotonic()
        busy = busy_share(busy0, machine_busy_idle())
        node_cores = cpu_cores(cpu0, process_cpu_seconds(node.proc.pid), warmup + duration)
        last_cid = max(cid for cid, _, _ in records)
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            with server.times.lock:
                if server.times.commits and server.times.commits[-1].end_cid >= last_cid:
                    break
            if not thread.is_alive():
                raise RuntimeError("lag: the pipeline thread stopped")
            time.sleep(0.05)
    finally:
        server.stop()
        thread.join(timeout=60)
        if writer.is_alive():
            writer.terminate()
            writer.join(timeout=10)
    with server.times.lock:
        commits = list(server.times.commits)
    ends = [c.end_cid for c in commits]
    begin = records[0][1] if records else write_end
    measured = [(cid, ack, late) for cid, ack, late in records if ack - begin >= warmup]
    measured.sort()
    lags: list[float] = []
    missing = 0
    for cid, ack, _late in measured:
        i = bisect.bisect_left(ends, cid)
        if i == len(ends):
            missing += 1
            continue
        lags.append(commits[i].finished - ack)
    lags.sort()
    acks = sorted(ack for _, ack, _ in measured)
    span = acks[-1] - acks[0] if len(acks) > 1 else 0.0
    in_window = [c for c in commits if c.finished >= begin + warmup]
    return LagResult(
        rate=rate,
        achieved_rate=(len(measured) - 1) / span if span else 0.0,
        writes=len(measured),
        late=sum(1 for _, _, late in measured if late),
        p50_s=percentile(lags, 0.50),
        p90_s=percentile(lags, 0.90),
        p99_s=percentile(lags, 0.99),
        max_s=lags[-1] if lags else float("nan"),
        commits=len(in_window),
        events_per_commit=statistics.mean(c.events for c in in_window) if in_window else 0.0,
        read_mean_s=statistics.mean(server.times.reads[-len(in_window) :])
        if in_window and server.times.reads
        else 0.0,
        apply_mean_s=statistics.mean(c.seconds for c in in_window) if in_window else 0.0,
        missing=missing,
        machine_busy=busy,
        node_cores=node_cores,
    )


def postgresql_server() -> Any:
    """A throwaway PostgreSQL server object (not started): litecdc.localservers where the
    tree has it, else the older tests/servers module (hence the sys.path line on top)."""
    try:
        module = importlib.import_module("litecdc.localservers")
    except ImportError:
        module = importlib.import_module("tests.servers.postgresql_server")
    return module.PostgreSQLServer()


# -- main ----------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument(
        "--rows", type=int, default=2_000_000, help="rows of the snapshot table (default 2000000)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs per snapshot reader, after two warm-up runs (default 3)",
    )
    parser.add_argument(
        "--events", type=int, default=200_000, help="incremental backlog events (default 200000)"
    )
    parser.add_argument(
        "--rate", type=float, default=500.0, help="transactions/s in the lag case (default 500)"
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="measured seconds of the lag case (default 30)"
    )
    parser.add_argument(
        "--warmup", type=float, default=3.0, help="lag warm-up seconds, not counted (default 3)"
    )
    parser.add_argument(
        "--poll",
        type=float,
        default=0.2,
        help="pipeline poll interval in the lag case, in seconds (default 0.2)",
    )
    parser.add_argument(
        "--skip-postgres", action="store_true", help="leave out the PostgreSQL sink"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also time the node's snapshot path step by step, and Spark's Python data "
        "source with a source that costs nothing",
    )
    add_output_arguments(parser, data_dir="where the node's data, the metadata and Delta go")
    args = parser.parse_args(argv)
    require_at_least_one(parser, args, ("rows", "repeats", "events"))
    for name in ("rate", "duration", "poll"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be more than zero")

    root, cleanup = data_root(parser, args.data_dir, prefix="litecdc-bench-pipeline-")
    started = time.perf_counter()
    import deltalake
    import pyspark

    versions = {
        **sqlite_versions(),
        "PySpark": pyspark.__version__,
        "deltalake": deltalake.__version__,
    }
    print(platform_line("litecdc pipeline benchmark", versions))
    print(f"Spark {MASTER}; data in {root}")
    print(load_note())
    node: Node | None = None
    spark: SparkSession | None = None
    meta: MetadataStore | None = None
    pg_server: Any = None
    doc: dict[str, Any] = {}
    try:
        node = Node(root / "node", root / "node.log")
        print(f"node: litecdc serve at {node.url} (pid {node.proc.pid}), {node.db_path}")
        load_rate = fill_snapshot_table(node, args.rows)
        size_mb = node.db_path.stat().st_size / 1e6
        print(
            f"loaded {args.rows:,} rows over HTTP ({INSERT_ROWS_PER_STATEMENT:,}-row INSERTs): "
            f"{load_rate:,.0f} rows/s; db.sqlite {size_mb:,.0f} MB (with its change log)"
        )

        spark = start_spark()
        print(
            f"\nsnapshot: {args.rows:,} rows, 4 columns, to Spark's noop sink; best and median "
            f"of {args.repeats} runs after {WARMUP_RUNS} warm-up runs"
        )
        readers = snapshot_readers(spark, node, args.rows)
        reads = {
            name: time_reads(name, args.rows, run, args.repeats, node.proc.pid)
            for name, run in readers.items()
        }
        reads["node alone"] = time_reads(
            "node alone", args.rows, lambda: node_only_read(node), args.repeats, node.proc.pid
        )
        for r in reads.values():
            runs = ", ".join(f"{s:.2f}" for s in r.runs_s)
            busy = "n/a" if r.machine_busy is None else f"{r.machine_busy:.0%}"
            print(
                f"  snapshot {r.name}: {r.rows_per_s:,.0f} rows/s  (runs {runs} s; node CPU "
                f"{cores(r.node_cores)} cores, machine {busy})"
            )
            if r.cpu_s:
                per_m = {g: s * 1e6 / r.rows for g, s in r.cpu_s.items()}
                print(
                    "    CPU s per million rows (best run): "
                    + ", ".join(f"{g} {v:.2f}" for g, v in per_m.items() if v >= 0.005)
                    + f"; total {sum(per_m.values()):.2f}"
                )
        ratio = reads["litecdc"].rows_per_s / reads["jdbc"].rows_per_s
        ratio1 = reads["litecdc"].rows_per_s / reads["jdbc, 1 partition"].rows_per_s
        median_ratio = reads["jdbc"].median_s / reads["litecdc"].median_s
        print(
            f"  ratio: {ratio:.2f} best to best (litecdc / jdbc, both 2 partitions), "
            f"{median_ratio:.2f} median to median; {ratio1:.2f} vs jdbc with 1 partition"
        )
        print(
            "  (node alone = SourceClient.rows over the same 2 key ranges, 50k-row pages, "
            "from 2 threads of this process, no Spark)"
        )
        if args.profile:
            ceiling = time_reads(
                "spark python source ceiling",
                args.rows,
                spark_arrow_ceiling(spark, args.rows),
                args.repeats,
                None,
            )
            reads[ceiling.name] = ceiling
            print(
                f"  snapshot {ceiling.name}: {ceiling.rows_per_s:,.0f} rows/s  (a Python data "
                "source yielding ready-made Arrow batches, 2 partitions: Spark's own cost)"
            )
            print_profile(args.rows, profile_node_rows(node.db_path))

        # -- incremental -------------------------------------------------------------------
        meta = MetadataStore.open(sqlite_url(root / "meta.db"))
        node.execute(
            [f"CREATE TABLE {INCREMENTAL_TABLE}({COLUMNS})", f"CREATE TABLE {LAG_TABLE}({COLUMNS})"]
        )
        seed_incremental_table(node, seed_rows(args.events))
        sinks = {"delta": f"delta:{root / 'lake' / INCREMENTAL_TABLE}"}
        if not args.skip_postgres:
            pg_server = postgresql_server()
            pg_server.start()
            sinks["postgresql"] = pg_server.create_database("bench")
        for owner, sink in sinks.items():
            meta.add_subscription(
                f"inc-{owner}",
                table_name=INCREMENTAL_TABLE,
                sources=[node.url],
                sink=sink,
                owner=owner,
            )
            run_until_caught_up(new_server(meta, spark, owner, 0.2), f"snapshot of {owner}")
        meta.add_subscription(
            "lag-delta",
            table_name=LAG_TABLE,
            sources=[node.url],
            sink=f"delta:{root / 'lake' / LAG_TABLE}",
            owner="lag",
        )
        run_until_caught_up(new_server(meta, spark, "lag", 0.2), "snapshot of lag")
        events, ops, backlog_s = write_backlog(node, args.events)
        print(
            f"\nincremental: a backlog of {events:,} events ({ops['insert']:,} inserts, "
            f"{ops['update']:,} updates, {ops['delete']:,} deletes, each on its own key, "
            f"{EVENTS_PER_ROUND} per transaction; table seeded with "
            f"{seed_rows(args.events):,} rows, "
            f"written in {backlog_s:.1f} s), applied by PipelineServer.run(until_caught_up) "
            "on a subscription whose snapshot is done"
        )
        incremental = [
            run_incremental(meta, spark, owner, sink, events) for owner, sink in sinks.items()
        ]
        for inc in incremental:
            other = inc.seconds - inc.read_s - inc.apply_s
            print(
                f"  incremental {inc.sink}: {inc.events_per_s:,.0f} events/s  ({inc.events:,} "
                f"events in {inc.seconds:.2f} s, {inc.batches} batches: Spark read "
                f"{inc.read_s:.2f} s, sink write_changes {inc.apply_s:.2f} s, rest {other:.2f} s)"
            )

        # -- lag ---------------------------------------------------------------------------
        print(
            f"\nlag: single-row transactions at {args.rate:g}/s for {args.duration:g} s (after "
            f"{args.warmup:g} s warm-up) from another process, PipelineServer poll "
            f"{args.poll:g} s into Delta; lag = sink commit returned - write acknowledged"
        )
        lag = run_lag(meta, spark, node, args.rate, args.duration, args.warmup, args.poll)
        busy = "n/a" if lag.machine_busy is None else f"{lag.machine_busy:.0%}"
        print(
            f"  lag p50: {lag.p50_s:.2f} s, p90: {lag.p90_s:.2f} s, p99: {lag.p99_s:.2f} s, "
            f"max: {lag.max_s:.2f} s  ({lag.writes:,} writes at {lag.achieved_rate:,.0f}/s, "
            f"{lag.late} started late, {lag.missing} never applied)"
        )
        print(
            f"  {lag.commits} sink commits, {lag.events_per_commit:,.0f} events each; mean "
            f"Spark read {lag.read_mean_s:.2f} s, mean write_changes {lag.apply_mean_s:.2f} s; "
            f"node CPU {cores(lag.node_cores)} cores, machine {busy}"
        )

        print("\nsummary")
        delta = next(i for i in incremental if i.sink == "delta")
        checks = [
            (
                f"snapshot ratio litecdc/jdbc {median_ratio:.2f} (median; best {ratio:.2f})",
                f">= {TARGET_SNAPSHOT_RATIO:g}",
                median_ratio >= TARGET_SNAPSHOT_RATIO,
            ),
            (
                f"events/s into Delta {delta.events_per_s:,.0f}",
                f">= {TARGET_DELTA_EVENTS_PER_S:,}",
                delta.events_per_s >= TARGET_DELTA_EVENTS_PER_S,
            ),
            (
                f"lag p99 {lag.p99_s:.2f} s",
                f"<= {TARGET_LAG_P99_S:g} s",
                lag.p99_s <= TARGET_LAG_P99_S and lag.missing == 0,
            ),
        ]
        for what, target, met in checks:
            print(f"  {what:<54} target {target:<10} {'met' if met else 'NOT met'}")
        for inc in incremental:
            if inc.sink != "delta":
                print(f"  events/s into {inc.sink} {inc.events_per_s:,.0f} (no target)")
        print(f"  total {time.perf_counter() - started:.1f} s")
        doc = {
            **platform_json(versions),
            "master": MASTER,
            "snapshot_rows_per_s": {name: r.rows_per_s for name, r in reads.items()},
            "snapshot_ratio": ratio,
            "snapshot_median_ratio": median_ratio,
            "incremental_events_per_s": {i.sink: i.events_per_s for i in incremental},
            "lag_s": {"p50": lag.p50_s, "p90": lag.p90_s, "p99": lag.p99_s, "max": lag.max_s},
        }
        if args.json:
            print(json.dumps(doc, separators=(",", ":")))
    finally:
        if meta is not None:
            meta.close()
        if spark is not None:
            spark.stop()
        if pg_server is not None:
            pg_server.stop()
        if node is not None:
            node.close()
        cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
