"""A member whose data diverged from the cluster's log never leads and is not ready.

Real `litecdc serve --etcd` processes over a real etcd. A follower's data directory is
written to outside the cluster (standalone), then the node rejoins. Before, its apply loop
stalled on the first cid it already had ("this database did not come from this cluster's
log"), yet it campaigned and led once the others stopped: every read on any node returned
its forked row, every write answered 504 after 10 s although committed on the others, and
/readyz said 200 everywhere (cluster QA). A journal *ahead* of the log (no cluster write
since the fork) passed the new leader's "nothing after my last cid" test outright.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from e2e.litecdc_node import Node
from serve_cluster import AnsweringNode, cluster_status
from serve_cluster import leader as _leader
from serve_cluster import wait as _wait


def _values(node: Node, **params: Any) -> list[Any]:
    with node.client() as c:
        r = c.get("/db/query", params={"q": "SELECT v FROM kv ORDER BY id", **params})
        assert r.status_code == 200, r.text
        values: list[Any] = r.json()["results"][0].get("values", [])
        return values


def _fork(node: Node, tmp_path: Path) -> None:
    """Write to the (stopped) node's data directory outside the cluster: run it standalone
    — detached from its cluster the documented way, its DATA_DIR/cluster file set aside —
    then put the file back, as a copy of the directory or an older litecdc would."""
    claim = node.data_dir / "cluster"
    shutil.move(claim, tmp_path / "cluster.aside")
    standalone = Node(node.data_dir).start()
    with standalone.client() as c:
        standalone.execute(c, [["INSERT INTO kv(v) VALUES(?)", "forked"]])
    assert standalone.stop() == 0
    shutil.move(tmp_path / "cluster.aside", claim)


@pytest.mark.parametrize("cluster_writes_after_the_fork", [True, False])
def test_a_diverged_member_never_leads_and_is_not_ready(
    nodes: list[Node], tmp_path: Path, cluster_writes_after_the_fork: bool
) -> None:
    lead = _leader(nodes)
    with lead.client() as c:
        cid = lead.execute(
            c, ["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO kv(v) VALUES('c1')"]
        )["raft_index"]
    forked = next(n for n in nodes if n is not lead)
    others = [n for n in nodes if n is not forked]
    _values(forked, level="none", min_cid=cid)  # it has the cluster's data so far
    assert forked.stop() == 0
    _fork(forked, tmp_path)
    if cluster_writes_after_the_fork:  # the log's next cid is another entry than the fork's
        with lead.client() as c:
            lead.execute(c, [["INSERT INTO kv(v) VALUES(?)", "c2"]])
        problem = "this database did not come from this cluster's log"
        expected = [["c1"], ["c2"]]
    else:  # the journal is one cid ahead of the log
        problem = f"the journal has cids up to {cid + 1}, but the cluster's log ends at cid {cid}"
        expected = [["c1"]]
    nodes[nodes.index(forked)] = forked = AnsweringNode.like(forked).start()  # not ready

    def not_ready() -> str | None:
        with forked.client() as c:
            r = c.get("/readyz")
        return r.text if r.status_code == 503 and problem in r.text else None

    readyz = _wait(not_ready, "the diverged node's readyz to say why it is not ready")
    assert readyz.startswith("[+]node ok\n[+]leader ok\n[-]store not ok: "), readyz
    assert "start it on a new, empty --data-dir" in readyz
    assert problem in str(cluster_status(forked)["apply_error"])

    # alone, it does not campaign (before: it led, serving its fork to every reader)
    for node in others:
        assert node.stop() == 0
    _wait(lambda: "does not campaign for leader" in forked.log(), "the node to hold back")
    status = cluster_status(forked)
    assert (status["is_leader"], status["mode"]) == (False, "follower"), status

    for node in others:
        node.start()
    lead = _leader(nodes)
    assert lead is not forked
    # a write through it is forwarded to the leader, committed and acknowledged, and reads
    # through it (forwarded) see the cluster's data, not its fork
    with forked.client() as c:
        done = forked.execute(c, [["INSERT INTO kv(v) VALUES(?)", "after"]])
    for node in others:
        assert _values(node, level="none", min_cid=done["raft_index"]) == [*expected, ["after"]]
    for level in ("weak", "linearizable"):
        assert _values(forked, level=level) == [*expected, ["after"]]
    assert _values(forked, level="none") == [["c1"], ["forked"]]  # its own, as it is
    with forked.client() as c:
        assert c.get("/readyz").status_code == 503
