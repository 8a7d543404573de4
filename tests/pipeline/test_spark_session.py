"""What ``litecdc.pipeline.spark.spark_session`` prints, seen from outside: Spark's JVM
writes to the stderr it was started with, so this runs the session in its own process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e.litecdc_node import Node
from pipeline_proc import execute

#: reads a table whose rows fail in the Spark worker (a TEXT value in an INTEGER column),
#: with explicit ranges so that the failure happens in a task, not while planning
FAILING_READ = """
    import sys
    from litecdc.pipeline.spark import spark_session

    spark = spark_session("local[2]")
    # the JVM got the driver memory asked for (scale QA: Spark's 1g ran out)
    print("MAX HEAP MIB:", spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() >> 20)
    df = (
        spark.read.format("litecdc").option("url", sys.argv[1]).option("table", "w")
        .option("ranges", "[[null, null, null]]").load()
    )
    try:
        df.collect()
    except Exception as exc:
        print("FAILED AS EXPECTED:", str(exc).splitlines()[-1])
    try:  # a file write whose task fails: its job is aborted (retest QA: 85 lines)
        df.write.parquet("written")
    except Exception as exc:
        print("WRITE FAILED AS EXPECTED:", str(exc).splitlines()[-1])
    # a stream that fails (here: without mode=changes); the pipeline's Parquet log
    # handles such a failure (a reshape: it starts over), yet Spark logged 28 lines (QA)
    stream = spark.readStream.format("litecdc").option("url", sys.argv[1]).option("table", "w")
    try:
        stream.load().writeStream.format("noop").start().awaitTermination(60)
    except Exception as exc:
        print("STREAM FAILED AS EXPECTED:", "mode" in str(exc))
    spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
def test_a_failing_task_does_not_print_spark_stacks(node: Node, tmp_path: Path) -> None:
    """Before, each failed task printed ~70 lines (the worker's traceback and the JVM's
    stack, twice over) from Spark's Executor and TaskSetManager loggers, although the
    job's exception carries the error and the pipeline reports it in one line."""
    with node.client() as c:
        execute(c, ["CREATE TABLE w(id INTEGER PRIMARY KEY, n INTEGER)",
                    "INSERT INTO w VALUES (1, 5), (2, 'not a number')"])  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAILING_READ), node.url],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "FAILED AS EXPECTED:" in done.stdout, done.stdout + done.stderr[-4000:]
    assert "a TEXT value at key [2]" in done.stdout, done.stdout
    heap = int(done.stdout.split("MAX HEAP MIB:", 1)[1].split()[0])
    assert 1800 <= heap <= 2048, done.stdout  # 2g, less what the JVM keeps for itself
    assert "WRITE FAILED AS EXPECTED:" in done.stdout, done.stdout
    assert "STREAM FAILED AS EXPECTED: True" in done.stdout, done.stdout
    for logger in ("FileFormatWriter", "Utils", "MicroBatchExecution"):
        assert f"ERROR {logger}" not in done.stderr, done.stderr[-4000:]
    assert "ERROR Executor" not in done.stderr, done.stderr[-4000:]
    assert "ERROR TaskSetManager" not in done.stderr, done.stderr[-4000:]
    assert "\tat org.apache.spark" not in done.stderr, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
