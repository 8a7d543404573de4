"""PipelineServer's own decisions, against a real node and metadata store: a failing
subscription backs off and, under ``until_caught_up``, the run gives up with it instead
of waiting forever; the others keep running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.litecdc_node import Node, free_port
from pipeline_proc import execute

from litecdc.pipeline import control
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.server import GIVE_UP_FAILURES, PipelineServer


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "node").start()
    yield started
    started.stop()


def test_until_caught_up_gives_up_on_a_subscription_that_keeps_failing(
    node: Node, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        closed = free_port()  # a PostgreSQL sink nobody listens for
        control.subscribe(
            store, name="down", sources=node.url, table="t",
            sink=f"postgresql://postgres@127.0.0.1:{closed}/x",
        )  # fmt: skip
        # Spark is never reached: the sink fails to open first (hence no session here)
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        failing = server.run(until_caught_up=True)
        assert failing == 1
        state = server.states["down"]
        assert state.failures == GIVE_UP_FAILURES
        assert state.last_error is not None and "postgresql sink" in state.last_error
        assert str(closed) in state.last_error
        assert store.progress("down").stage is None  # nothing recorded for it
    finally:
        store.close()
