"""Subscriptions as a user manages them (litecdc.pipeline.control), against a real node:
``status`` reports the lag in cids and in seconds, ``subscribe`` checks before it adds,
``unsubscribe`` releases the node's hold (or leaves that to the server when the node is
down)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.litecdc_node import Node
from pipeline_proc import execute

from litecdc.errors import MetadataError, NotFoundError, SinkError, SourceError
from litecdc.pipeline import control
from litecdc.pipeline.metadata import MetadataStore, sqlite_url


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "node").start()
    yield started
    started.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    opened = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    yield opened
    opened.close()


def _holds(node: Node) -> list[str]:
    with node.client() as c:
        return [h["name"] for h in c.get("/cdc/subscriptions").json()["subscriptions"]]


def test_status_reports_lag_in_cids_and_seconds(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)", "CREATE TABLE other(x)"])
        registered = c.post("/cdc/subscriptions", json={"name": "t-lake"}).json()["cid"]
    control.subscribe(
        store, name="t-lake", sources=node.url, table="t", sink=f"delta:{tmp_path / 'lake'}"
    )
    store.start_register("t-lake", registered)
    store.set_ranges("t-lake", [(None, None)])
    store.record_chunk("t-lake", 0, last_key=None, read_cid=registered, rows=0, done=True)
    store.finish_snapshot("t-lake")

    with node.client() as c:
        execute(c, ["INSERT INTO other VALUES (1)"])  # another table's commit is no lag
    (report,) = control.status(store, "t-lake")
    assert report.lag_cids is not None and report.lag_cids >= 1
    assert report.lag_seconds == 0.0

    with node.client() as c:
        execute(c, [["INSERT INTO t VALUES (?, ?)", 1, "one"]])
    time.sleep(1.2)
    (report,) = control.status(store, "t-lake")
    assert report.lag_seconds is not None and report.lag_seconds >= 1.0
    text = report.describe()
    assert "stage: incremental" in text and "lag" in text and " s" in text

    store.record_log_position("t-lake", report.source_cid or 0)  # the sink caught up
    (report,) = control.status(store, "t-lake")
    assert report.lag_cids == 0 and report.lag_seconds == 0.0


def test_status_says_when_the_source_is_unreachable(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    control.subscribe(store, name="s", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    node.stop()
    (report,) = control.status(store, "s")
    assert report.source_error is not None
    assert "source: unreachable" in report.describe()


def test_subscribe_checks_the_sink_and_the_table_first(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    with pytest.raises(SinkError, match="nosuch"):
        control.subscribe(store, name="a", sources=node.url, table="t", sink="nosuch://x")
    with pytest.raises(NotFoundError, match="no table 'missing'"):
        control.subscribe(
            store, name="b", sources=node.url, table="missing", sink=f"delta:{tmp_path}/d"
        )
    with pytest.raises(SinkError, match="absolute"):
        control.subscribe(store, name="c", sources=node.url, table="t", sink="parquet:rel")
    assert store.list_subscriptions(include_cancelled=True) == []
    # one path is one table (or log): a second subscription on it would fight the first
    control.subscribe(store, name="d", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    with pytest.raises(MetadataError, match="already used by subscription d"):
        control.subscribe(store, name="e", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    assert [s.name for s in store.list_subscriptions()] == ["d"]


def test_unsubscribe_releases_the_hold_or_leaves_it_to_the_server(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
        c.post("/cdc/subscriptions", json={"name": "gone"})
        c.post("/cdc/subscriptions", json={"name": "later"})
    for name in ("gone", "later"):
        control.subscribe(
            store, name=name, sources=node.url, table="t", sink=f"delta:{tmp_path}/{name}"
        )
    assert control.unsubscribe(store, "gone") is None  # released
    assert "gone" not in _holds(node)
    assert [s.name for s in store.list_subscriptions(include_cancelled=True)] == ["later"]

    node.stop()
    with pytest.raises(SourceError):
        _raise_unreachable(node)
    problem = control.unsubscribe(store, "later")  # the node is down
    assert problem is not None and "unreachable" in problem
    (left,) = store.list_subscriptions(include_cancelled=True)
    assert left.name == "later" and left.cancel
    # --force: removed all the same (the node drops the hold past its retention cap)
    assert control.unsubscribe(store, "later", force=True) is not None
    assert store.list_subscriptions(include_cancelled=True) == []


def _raise_unreachable(node: Node) -> None:
    from litecdc.pipeline.source_client import SourceClient

    with SourceClient([node.url]) as client:
        client.subscriptions()


def test_passwords_in_sink_urls_are_never_printed(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from litecdc.cli import cli

    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    sink = "postgresql://mirror:s3cret-pw@127.0.0.1:1/db"
    control.subscribe(store, name="pg", sources=node.url, table="t", sink=sink)
    (report,) = control.status(store, "pg")
    assert "s3cret-pw" not in report.describe() and "mirror:***@" in report.describe()
    meta = sqlite_url(tmp_path / "meta.db")
    for args in (["list"], ["status", "pg"]):
        result = CliRunner().invoke(cli, ["pipeline", *args, "--meta", meta])
        assert result.exit_code == 0, result.output
        assert "s3cret-pw" not in result.output and "pg" in result.output
