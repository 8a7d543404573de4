"""The ``parquet:`` sink: a snapshot plus a change log written by Spark's own file sinks.

Against a real node and the ``litecdc pipeline`` CLI: the table rebuilt from
``snapshot/`` and ``changes/`` (read with Spark's file-sink log, so only committed
files count) equals the source, and every change event is there exactly once — across
runs and a ``kill -9`` of ``pipeline run`` in the middle of the stream.
"""

from __future__ import annotations

import re
import sqlite3
import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e.litecdc_node import Node, free_port
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
    """The table as the log says it is, and the change events' (cid, seq, op, id)
    (the events read through the file sink's log: committed files only)."""
    rows: dict[int, tuple[int, tuple[Any, ...]]] = {}
    for r in spark.read.parquet(str(log / "snapshot")).collect():
        rows[r["id"]] = (r["_litecdc_cid"], (r["name"], _bits(r["price"]), _hex(r["tag"])))
    changes = log / "changes"  # none yet after a snapshot taken again
    events = spark.read.parquet(str(changes)).collect() if changes.exists() else []
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

        # the stream moves the hold (the node prunes to it) as Spark commits a batch, before
        # `run` records the position: a run killed in between restarts from an older one.
        # Its changes were gone: the whole log started over (its change files deleted; CI,
        # after a query started again for an added column). It goes on from its checkpoint.
        registered = cli.progress("items-log").init_snapshot_version or 0
        with node.client() as c:
            r = c.get("/cdc/subscriptions")
            held = {h["name"]: h["cid"] for h in r.json()["subscriptions"]}["items-log"]
            assert held > registered, r.text
            assert c.get("/cdc/changes", params={"after": registered}).status_code == 410
        with sqlite3.connect(tmp_path / "meta.db") as meta:
            meta.execute(
                "UPDATE litecdc_progress SET last_log_index = ? WHERE subscription = ?",
                (registered, "items-log"),
            )

        # kill -9 in the middle of a backlog, then restart: still every event exactly once
        with node.client() as c:
            for k in range(20):
                execute(c, [["UPDATE items SET name = ? WHERE id % 20 = ?", f"round {k}", k]])
        background = cli.start("--poll-interval", "0.2")
        try:
            background.wait_for(
                lambda: (cli.progress("items-log").last_log_index or 0) > held,
                "the stream to commit a batch",
            )
        finally:
            background.kill9()
        assert "starting over" not in background.log(), background.log()
        assert cli.progress("items-log").init_snapshot_version == registered
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

        # QA: commits of other tables made an idle log's lag in seconds grow (to 30 s,
        # until the stream's next idle batch) while no change of its table waited
        port = free_port()
        background = cli.start("--metrics-port", str(port))
        try:
            lag = re.compile(r'litecdc_pipeline_lag_seconds\{subscription="items-log"\} (\S+)')

            def lag_seconds() -> float | None:
                try:  # (none until Spark started and the metrics server listens)
                    found = lag.search(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
                except httpx.TransportError:
                    return None
                return float(found[1]) if found else None

            background.wait_for(lambda: lag_seconds() is not None, "the lag metric")
            with node.client() as c:
                execute(c, ["CREATE TABLE other(x)"])
                seen = []
                for k in range(12):
                    execute(c, [["INSERT INTO other VALUES(?)", k]])
                    time.sleep(0.25)
                    seen.append(lag_seconds())
            assert seen == [0.0] * 12, seen
        finally:
            background.kill9()
        # a log keeps no rows: verify says so instead of comparing
        done = cli.call("verify", "items-log")
        assert done.returncode == 2 and "keeps no rows" in done.stderr, done.stderr
    finally:
        node.stop()


def _head(client: httpx.Client) -> int:
    r = client.get("/cdc/subscriptions")
    assert r.status_code == 200, r.text
    return int(r.json()["last_cid"])


@pytest.mark.timeout(900)
def test_columns_added_while_running_reach_the_log(tmp_path: Path, spark: Any) -> None:
    """Before, a running `pipeline run` went on with the columns its query started with:
    events after an ALTER TABLE … ADD COLUMN were written without the column (its values
    lost), and a column with a DEFAULT did not start the log over until a restart."""
    node = Node(tmp_path / "node").start()
    log = tmp_path / "log"
    try:
        cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
        with node.client() as c:
            execute(c, ["CREATE TABLE pqa(id INTEGER PRIMARY KEY, a TEXT)",
                        "INSERT INTO pqa VALUES (1, 'a'), (2, 'b')"])  # fmt: skip
        cli.subscribe("pqa-log", node.url, "pqa", f"parquet:{log}")
        run = cli.start("--poll-interval", "0.2")
        try:

            def applied_through(cid: int) -> bool:
                progress = cli.progress("pqa-log")
                return progress.stage == "incremental" and (progress.last_log_index or 0) >= cid

            # (a fixed target: the stream's own hold moves are commits too)
            with node.client() as c:
                target = _head(c)
                run.wait_for(lambda: applied_through(target), "the snapshot")
                # the query runs (it has written a batch) when the column comes
                execute(c, ["INSERT INTO pqa VALUES (4, 'before')"])
                target = _head(c)
                run.wait_for(lambda: applied_through(target), "the stream")
                execute(c, ["ALTER TABLE pqa ADD COLUMN c TEXT"])
                execute(c, ["INSERT INTO pqa VALUES (3, 'e', 'NEWCOL')"])
                execute(c, ["UPDATE pqa SET c = 'set' WHERE id = 1"])
                target = _head(c)
            run.wait_for(lambda: applied_through(target), "the changes after the ALTER")
            changes = spark.read.option("mergeSchema", "true").parquet(str(log / "changes"))
            assert "c" in changes.columns, changes.columns
            events = sorted((e["_litecdc_cid"], e["id"], e["a"], e["c"]) for e in changes.collect())
            assert [e[1:] for e in events] == [
                (4, "before", None), (3, "e", "NEWCOL"), (1, "a", "set")
            ], events  # fmt: skip
            registered = cli.progress("pqa-log").init_snapshot_version or 0

            # a column with a DEFAULT: existing rows hold it without any change, so the log
            # starts over (a new snapshot with the column)
            with node.client() as c:
                execute(c, ["ALTER TABLE pqa ADD COLUMN d TEXT DEFAULT 'dflt'"])

            def started_over() -> bool:
                progress = cli.progress("pqa-log")
                again = (progress.init_snapshot_version or 0) > registered
                return again and applied_through(progress.init_snapshot_version or 0)

            run.wait_for(started_over, "the log to start over")
            snapshot = spark.read.parquet(str(log / "snapshot")).collect()
            assert sorted((r["id"], r["a"], r["c"], r["d"]) for r in snapshot) == [
                (1, "a", "set", "dflt"), (2, "b", None, "dflt"), (3, "e", "NEWCOL", "dflt"),
                (4, "before", None, "dflt"),
            ]  # fmt: skip
            assert "starting over" in run.log() and "re-snapshotting" in run.log()
        finally:
            run.kill9()
    finally:
        node.stop()


@pytest.mark.timeout(900)
def test_parquet_log_past_the_retention_cap_starts_over_and_converges(
    tmp_path: Path, spark: Any
) -> None:
    """Before, the stream's "position no longer available" came back wrapped as a sink
    error: the log was retried forever instead of taking a new snapshot."""
    capped = Node(tmp_path / "node", "--retention-cids", "20").start()
    log = tmp_path / "log"
    try:
        cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
        with capped.client() as c:
            execute(c, [DDL])
            _insert(c, 1, 300)
        cli.subscribe("capped-log", capped.url, "items", f"parquet:{log}")
        cli.run_until_caught_up()
        with capped.client() as c:
            for k in range(30):  # more than 20 commits behind, deletes among them
                execute(
                    c,
                    [
                        ["DELETE FROM items WHERE id % 30 = ?", k],
                        ["UPDATE items SET name = ? WHERE id % 31 = ?", f"gap {k}", k],
                    ],
                )
            _insert(c, 1000, 5)
            # the node's retention keeper (every 5 s) expires the hold
            deadline = time.monotonic() + 30
            while not c.get("/cdc/subscriptions").json()["subscriptions"][0]["expired"]:
                assert time.monotonic() < deadline, "the hold did not expire"
                time.sleep(0.2)
        done = cli.run_until_caught_up()
        assert "re-snapshotting" in done.stderr, done.stderr[-4000:]
        with capped.client() as c:
            source = _source_rows(c)
        table, keys = _rebuild(spark, log)
        assert table == source
        assert len(keys) == len(set(keys)), "an event was written twice"
    finally:
        capped.stop()


class _NeverConnects:
    """Stands in for a change log's streaming query whose Python worker never connects
    back (Spark waits 10 s for it, a fixed time): running when started, failed when
    looked at again — as a loaded machine's queries were (scale QA)."""

    lastProgress = None

    def __init__(self) -> None:
        self.looked = 0

    def exception(self) -> Exception | None:
        self.looked += 1
        return None if self.looked == 1 else RuntimeError("Python worker failed to connect back.")

    def stop(self) -> None:
        pass


def test_a_change_log_query_that_keeps_failing_backs_off(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale QA: twelve logs' queries failed ~20 s after each start on a loaded machine and
    were started again every 0.5 s: each start counted as a success and reset the back-off,
    and their Python processes piled up. A query started again after a failure has not
    recovered until it has run a while: the failures add up, the back-off grows."""
    from litecdc.pipeline import control
    from litecdc.pipeline import server as server_module
    from litecdc.pipeline.metadata import MetadataStore
    from litecdc.pipeline.server import PipelineServer

    node = Node(tmp_path / "node").start()
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        with node.client() as c:
            execute(c, [DDL])
            _insert(c, 1, 10)
        control.subscribe(
            store, name="l", sources=node.url, table="items", sink=f"parquet:{tmp_path / 'log'}"
        )
        started: list[_NeverConnects] = []

        def start_changes(*args: Any, **kwargs: Any) -> _NeverConnects:
            started.append(_NeverConnects())
            return started[-1]

        monkeypatch.setattr(server_module.parquet_log, "start_changes", start_changes)
        seen: list[int] = []
        for _ in range(100):  # (a bound: the snapshot takes a few rounds, then 5 starts)
            if len(started) >= 5:
                break
            server.run_round()  # (the snapshot first: a Spark job of its own)
            state = server.states["l"]
            seen.append(state.failures)
            time.sleep(max(state.retry_at - time.monotonic(), 0))
        assert max(seen) >= 4, seen  # (it was 0, 1, 0, 1, …)
        assert "Python worker failed to connect back" in (server.states["l"].last_error or "")
        assert store.failure("l") is not None  # `status` says FAILING throughout
    finally:
        server.close()
        store.close()
        node.stop()
