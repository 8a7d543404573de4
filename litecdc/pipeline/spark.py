"""The pipeline's SparkSession: where it runs and how its Python workers start."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from litecdc.errors import ConfigError, PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("litecdc.pipeline")

DEFAULT_MASTER = "local[*]"

#: the master URLs Spark takes: its own patterns (SparkContext.createTaskScheduler, Spark
#: 4), hosts as java.net.URI reads them (a name without "_", or [an IPv6 address])
_INT_MAX = 2**31 - 1
_HOST_PORT = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]+"
#: a spark:// master's ports (java.net.URI takes any int; the connection then fails)
_SPARK_PORTS = re.compile(r"(?:^spark://|,)(?:\[[^\]]*\]|[^:,]*):([0-9]+)")
_MASTERS = re.compile(
    r"local"
    r"|local\[(?P<threads>[0-9]+|\*)(\s*,\s*[0-9]+)?\]"  # threads[, failures per task]
    r"|local-cluster\[\s*[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\s*\]"
    rf"|spark://{_HOST_PORT}(,{_HOST_PORT})*"  # masters under ZooKeeper: several
    r"|yarn"
    r"|k8s://\S+"
)


def check_master(master: str) -> None:
    """ConfigError unless ``master`` is a Spark master URL (QA: `--master bogus` printed
    the JVM's stack trace, then the error, after Spark took its time to start)."""
    matched = _MASTERS.fullmatch(master)
    threads = matched.group("threads") if matched else None
    numbers = [int(n) for n in re.findall(r"[0-9]+", master)] if matched else []
    ports = [int(p) for p in _SPARK_PORTS.findall(master)] if matched else []
    if (
        matched is None
        or (threads is not None and threads != "*" and int(threads) == 0)
        or any(n > _INT_MAX for n in numbers)  # Spark reads them as Java ints (QA)
        or any(not 0 < port < 65536 for port in ports)
    ):
        raise ConfigError(
            f"--master {master!r} is not a Spark master URL: use local[*], local[N], "
            "spark://HOST:PORT, yarn or k8s://HOST:PORT"
        )


#: the JVM heap of Spark's driver — with a local master, of all of Spark. Spark's own
#: 1g ran out reading three subscriptions' batches of a 1.5M-row transaction at once
#: (each result held several times over on the heap): a step failed with TaskResultLost
#: and was read again, or the JVM died (scale QA). 2g held in every run.
DEFAULT_DRIVER_MEMORY = "2g"
#: the least Spark starts with (it needs 450 MiB: UnifiedMemoryManager)
MIN_DRIVER_MEMORY_MIB = 512
_MEMORY = re.compile(r"(?P<number>[0-9]+)((?P<unit>[kmgt])b?)?", re.IGNORECASE)
_MIB_PER = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def driver_memory_default() -> str:
    """$SPARK_DRIVER_MEMORY (what spark-submit would take) when set, else 2g."""
    return os.environ.get("SPARK_DRIVER_MEMORY", "").strip() or DEFAULT_DRIVER_MEMORY


def check_driver_memory(memory: str) -> None:
    """ConfigError unless ``memory`` is a JVM heap size Spark takes and starts with (a
    bare number is MiB, as Spark reads it)."""
    matched = _MEMORY.fullmatch(memory.strip())
    if matched is None:
        raise ConfigError(
            f"--driver-memory {memory!r} is not a memory size: give a number of MiB, or a "
            "number and a unit, k, m, g or t (512m, 2g, 8g)"
        )
    mib = int(matched["number"]) * _MIB_PER[(matched["unit"] or "m").lower()]
    if mib < MIN_DRIVER_MEMORY_MIB:
        raise ConfigError(
            f"--driver-memory {memory!r} is too little: Spark needs at least "
            f"{MIN_DRIVER_MEMORY_MIB}m"
        )


def spark_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "litecdc-pipeline",
    driver_memory: str | None = None,
) -> SparkSession:
    """A SparkSession with the ``litecdc`` data source registered (a JVM started here
    gets ``driver_memory`` of heap, by default driver_memory_default(); an existing
    session keeps what it has).

    Spark's Python workers run this interpreter (PYSPARK_PYTHON), so they import the same
    litecdc and pyarrow as the driver; Arrow carries the data between Python and the JVM.
    """
    check_master(master)
    driver_memory = driver_memory or driver_memory_default()
    check_driver_memory(driver_memory)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    try:
        from pyspark.sql import SparkSession

        from litecdc.pipeline.datasource import register

        with _jvm_ignoring_sigterm():
            spark = (
                SparkSession.builder.master(master)
                .appName(app_name)
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "4")
                .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.memory", driver_memory.strip())
                .getOrCreate()
            )
    except Exception as exc:  # Java missing, bad master URL…
        raise PipelineError(
            f"could not start Spark (master {master!r}): {exc}; check the master URL "
            "(local[*], local[N], spark://HOST:PORT) and that Java 17 is installed "
            "(`make test`/`make run` install it)"
        ) from exc
    spark.sparkContext.setLogLevel("ERROR")
    _quiet_task_failures(spark)
    register(spark)
    return spark


def jvm_exit_status(spark: SparkSession) -> int | None:
    """The exit status of Spark's JVM once it has ended; None while it runs (or when this
    process did not start it)."""
    gateway = getattr(spark.sparkContext, "_gateway", None)
    process = getattr(gateway, "proc", None)
    status = process.poll() if process is not None else None
    return int(status) if status is not None else None


@contextlib.contextmanager
def _jvm_ignoring_sigterm() -> Iterator[None]:
    """Start Spark's JVM (if this creates it) with SIGTERM ignored, as PySpark starts it
    with SIGINT ignored: the driver decides when the JVM ends (PySpark's JVM exits when
    its stdin pipe from the driver closes, however the driver ended). A SIGTERM to the
    whole process group or cgroup — `timeout`, `kill -TERM -PGID`, systemd's default
    stop — killed the JVM at once, so steps in progress got none of their 10 s and the
    run printed py4j tracebacks (pipeline QA). A signal ignored at exec stays ignored:
    the JVM installs no handler for it (HotSpot's JVM_RegisterSignal)."""
    from pyspark import java_gateway

    popen = getattr(java_gateway, "Popen", None)
    if popen is None:  # another PySpark layout: start it as it starts it
        yield
        return

    def popen_ignoring_sigterm(*args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("preexec_fn")

        def preexec() -> None:  # (in the child, between fork and exec)
            if given is not None:
                given()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        kwargs["preexec_fn"] = preexec
        return popen(*args, **kwargs)

    setattr(java_gateway, "Popen", popen_ignoring_sigterm)  # noqa: B010 - (not exported)
    try:
        yield
    finally:
        setattr(java_gateway, "Popen", popen)  # noqa: B010


#: Loggers that print a failed task's whole Python and JVM stack (70 lines) to stderr. The
#: failure also ends the job with an exception that carries the same error, which the
#: pipeline reports in one line (and stores in the subscription's status): the stack is noise.
#: So are a file write's "Aborting job" (FileFormatWriter) and "Aborting task" (Utils)
#: with their stacks (85 lines when a stop interrupts a Parquet log's micro-batch —
#: retest QA): the write's exception says it too. (Utils also logs an uncaught exception
#: in some of Spark's own threads: a bug of Spark's, which goes unsaid then.) Likewise a
#: stream's "Query … terminated with error" (MicroBatchExecution, ~28 lines): the pipeline
#: takes the error from the query (a Parquet log's, reshaped: it starts over) — pipeline QA.
TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.datasources.FileFormatWriter",
    "org.apache.spark.util.Utils",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
)


def _quiet_task_failures(spark: SparkSession) -> None:
    jvm = getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:  # not a classic (py4j) session: nothing to configure here
        return
    level = jvm.org.apache.logging.log4j.Level.OFF
    for name in TASK_FAILURE_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
