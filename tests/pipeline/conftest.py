"""Fixtures of the Spark pipeline tests: a real node and one SparkSession per module."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from e2e.litecdc_node import Node

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A ``litecdc serve`` process shared by one test module (tests use their own tables)."""
    n = Node(tmp_path_factory.mktemp("node") / "data").start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """local[2], as on this machine's 2 cores; one session per module (start-up is ~5 s)."""
    # Spark's Python workers must run this interpreter (it has litecdc and pyarrow)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # only loopback here
    from pyspark.sql import SparkSession

    from litecdc.pipeline.datasource import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("litecdc-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
