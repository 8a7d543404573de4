"""The Spark pipeline against a real three-node cluster, unchanged: the subscription names
every node, its hold lives in the replicated log, and when the leader is killed the
pipeline carries on through the survivors and the mirror is still exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e2e.litecdc_node import Node
from pipeline.pipeline_proc import PipelineCLI, execute
from serve_cluster import leader as find_leader
from serve_cluster import wait

from litecdc.pipeline.metadata import sqlite_url

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _head(node: Node) -> int:
    with node.client() as c:
        return int(c.get("/cdc/subscriptions").json()["last_cid"])


def _holds(node: Node) -> dict[str, Any]:
    with node.client() as c:
        return {h["name"]: h for h in c.get("/cdc/subscriptions").json()["subscriptions"]}


@pytest.mark.timeout(600)
def test_pipeline_follows_a_cluster_through_a_leader_failover(
    nodes: list[Node], tmp_path: Path
) -> None:
    leader = find_leader(nodes)
    with leader.client() as c:
        execute(c, ["CREATE TABLE accounts(id INTEGER PRIMARY KEY, owner TEXT, balance REAL)"])
        for start in range(0, 6000, 2000):
            execute(
                c,
                [
                    ["INSERT INTO accounts VALUES(?, ?, ?)", i, f"owner {i}", i * 1.25]
                    for i in range(start, start + 2000)
                ],
            )
    sources = ",".join(n.url for n in nodes)
    cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
    cli.subscribe("accounts-lake", sources, "accounts", f"delta:{tmp_path / 'lake'}")
    cli.run_until_caught_up()
    cli.assert_verified("accounts-lake")
    # the hold is replicated state: every node has it
    for node in nodes:
        wait(lambda node=node: "accounts-lake" in _holds(node), f"the hold on {node.url}")

    # kill -9 the leader; writes and the pipeline carry on through the survivors
    leader.proc.kill()  # type: ignore[union-attr]
    leader.proc.wait()  # type: ignore[union-attr]
    leader.proc = None
    survivors = [n for n in nodes if n is not leader]
    new_leader = find_leader(survivors)
    with new_leader.client() as c:
        execute(c, ["UPDATE accounts SET balance = balance + 1 WHERE id % 3 = 0"])
        execute(c, ["DELETE FROM accounts WHERE id % 10 = 0"])
        execute(c, ["UPDATE accounts SET id = id + 100000 WHERE id % 7 = 0"])
        execute(c, [["INSERT INTO accounts VALUES(?, ?, ?)", 999_999, "after failover", 0.5]])
    head = _head(new_leader)
    for node in survivors:  # verify reads from whichever node answers first
        wait(lambda node=node: _head(node) >= head, f"{node.url} to apply cid {head}")
    cli.run_until_caught_up()
    cli.assert_verified("accounts-lake")
    progress = cli.progress("accounts-lake")
    assert progress.stage == "incremental" and (progress.last_log_index or 0) >= head - 2
