"""`pipeline run --master spark://…`: the pipeline on a real Spark standalone cluster (a
master and a worker from PySpark's own distribution, executors in their own JVMs and
Python workers), not just local[*] — the data source's readers are pickled to the
executors and read from the node over HTTP, with no driver-local file in their path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from e2e.litecdc_node import Node, free_port
from pipeline_proc import PipelineCLI, execute

from litecdc.pipeline.metadata import sqlite_url

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable)  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def spark_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A master and one worker (2 cores); yields the master URL and the worker's work
    directory (one folder per application, with each executor's logs)."""
    base = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _start(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port())],
        base / "master.log",
    )  # fmt: skip
    procs = [master]
    try:
        _wait_for(base / "master.log", "I have been elected leader", master)
        worker = _start(
            ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
             "--memory", "1g", "--webui-port", str(free_port()), "--work-dir",
             str(base / "work")],
            base / "worker.log",
        )  # fmt: skip
        procs.append(worker)
        _wait_for(base / "worker.log", "Successfully registered with master", worker)
        yield url, base / "work"
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.mark.timeout(600)
def test_pipeline_runs_on_a_standalone_spark_cluster(
    tmp_path: Path, spark_master: tuple[str, Path]
) -> None:
    master, work = spark_master
    node = Node(tmp_path / "node").start()
    try:
        with node.client() as c:
            execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, b BLOB, r REAL)"])
            execute(c, [["INSERT INTO t VALUES(?, ?, ?, ?)", i, f"v{i}", [i % 256], i / 3]
                        for i in range(6000)])  # fmt: skip
        cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
        cli.subscribe("t-lake", node.url, "t", f"delta:{tmp_path / 'lake'}")
        cli.run_until_caught_up("--master", master)
        cli.assert_verified("t-lake")
        with node.client() as c:
            execute(
                c, ["UPDATE t SET v = v || '!' WHERE id % 3 = 0", "DELETE FROM t WHERE id % 4 = 0"]
            )
        cli.run_until_caught_up("--master", master)
        cli.assert_verified("t-lake")
    finally:
        node.stop()
    # both runs were applications of the cluster, their executors the worker's
    assert len(list(work.glob("app-*/*/stderr"))) >= 2
