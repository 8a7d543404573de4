"""The ``parquet:`` sink: a snapshot plus a change log written by Spark's own file sinks.

Against a real node and the ``litecdc pipeline`` CLI: the table rebuilt from
``snapshot/`` and ``changes/`` (read with Spark's file-sink log, so only committed
files count) equals the source, and every change event is there exactly once — across
runs and a ``kill -9`` of ``pipeline run`` in the middle of the stream.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e.litecdc_node import Node
from pipeline_proc import PipelineCLI, execute

from litecdc.pipeline.metadata import sqlite_url

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DDL = "CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, price REAL, tag BLOB)"


def _insert(client: httpx.Client, first: int, count: int) -> None:
    execute(
        client,
        [
            ["INSERT INTO items VALUES(?, ?, ?, ?)", i, f"item {i} é", i / 7, bytes([i % 256])]
            for i in range(first, first + count)
        ],
    )


def _source_rows(client: httpx.Client) -> dict[int, tuple[Any, ...]]:
    r = client.get("/db/query", params={"q": "SELECT id, name, price, hex(tag) FROM items"})
    rows = r.json()["results"][0].get("values", [])
    return {row[0]: (row[1], _bits(row[2]), row[3]) for row in rows}


def _bits(value: Any) -> Any:
    return struct.pack(">d", value) if isinstance(value, float) else value


def _rebuild(spark: Any, log: Path) -> tuple[dict[int, tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The table as the log says it is, and the change events' (cid, seq, op, id)."""
    rows: dict[int, tuple[int, tuple[Any, ...]]] = {}
    for r in spark.read.parquet(str(log / "snapshot")).collect():
        rows[r["id"]] = (r["_litecdc_cid"], (r["name"], _bits(r["price"]), _hex(r["tag"])))
    events = spark.read.parquet(str(log / "changes")).collect()  # committed files only
    events.sort(key=lambda e: (e["_litecdc_cid"], e["_litecdc_seq"], e["_litecdc_op"] != "delete"))
    for e in events:
        version = rows.get(e["id"], (0, None))[0]
        if e["_litecdc_cid"] <= version:
            continue  # the snapshot row already has it
        if e["_litecdc_op"] == "delete":
            rows[e["id"]] = (e["_litecdc_cid"], None)
        else:
            rows[e["id"]] = (
                e["_litecdc_cid"],
                (e["name"], _bits(e["price"]), _hex(e["tag"])),
            )
    table = {k: v for k, (_, v) in rows.items() if v is not None}
    keys = [(e["_litecdc_cid"], e["_litecdc_seq"], e["_litecdc_op"], e["id"]) for e in events]
    return table, keys


def _hex(value: bytes | None) -> str:
    return "" if value is None else value.hex().upper()


@pytest.fixture(scope="module")
def spark() -> Any:
    from litecdc.pipeline.spark import spark_session

    session = spark_session("local[2]", app_name="test-parquet-log")
    yield session
    session.stop()


@pytest.mark.timeout(900)
def test_parquet_log_rebuilds_the_table_with_every_event_once(tmp_path: Path, spark: Any) -> None:
    node = Node(tmp_path / "node").start()
    log = tmp_path / "log"
    try:
        cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
        with node.client() as c:
            execute(c, [DDL])
            _insert(c, 1, 3000)
        cli.subscribe("items-log", node.url, "items", f"parquet:{log}", "--max-events", "500")
        cli.run_until_caught_up()  # the snapshot
        with node.client() as c:
            execute(c, ["UPDATE items SET price = price * 2 WHERE id % 3 = 0"])
            execute(c, ["DELETE FROM items WHERE id % 5 = 0"])
            execute(c, ["UPDATE items SET id = id + 100000 WHERE id % 7 = 0"])  # key changes
            _insert(c, 5000, 200)
        cli.run_until_caught_up()  # the change log
        with node.client() as c:
            source = _source_rows(c)
        table, keys = _rebuild(spark, log)
        assert table == source
        assert len(keys) == len(set(keys)), "an event was written twice"
        first_events = len(keys)

        # kill -9 in the middle of a backlog, then restart: still every event exactly once
        with node.client() as c:
            for k in range(20):
                execute(c, [["UPDATE items SET name = ? WHERE id % 20 = ?", f"round {k}", k]])
        background = cli.start("--poll-interval", "0.2")
        try:
            background.wait_for(
                lambda: (
                    (cli.progress("items-log").last_log_index or 0) > 0
                    and any((log / "changes").glob("*.parquet"))
                ),
                "the stream to commit a batch",
            )
        finally:
            background.kill9()
        cli.run_until_caught_up()
        with node.client() as c:
            source = _source_rows(c)
        table, keys = _rebuild(spark, log)
        assert table == source
        assert len(keys) == len(set(keys)), "an event was written twice"
        assert len(keys) > first_events
        status = cli.ok("status", "items-log")
        assert "stage: incremental" in status, status
        assert re.search(r"source head: cid \d+, lag \d+ cid\(s\), 0\.0 s", status), status
        # a log keeps no rows: verify says so instead of comparing
        done = cli.call("verify", "items-log")
        assert done.returncode == 1 and "keeps no rows" in done.stderr, done.stderr
    finally:
        node.stop()
