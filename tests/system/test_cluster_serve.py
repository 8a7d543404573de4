"""Three real `litecdc serve --etcd` processes over a real etcd: one replicated database.

Writes to any node reach the leader (forwarded), every node ends with the same data,
and killing the leader (kill -9) moves leadership to another node with no acknowledged
write lost; the killed node restarts and catches up.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e.litecdc_node import Node, free_port, serve_cli
from etcd_cluster import EtcdCluster
from serve_cluster import AnsweringNode, start_nodes
from serve_cluster import leader as _leader
from serve_cluster import rows as _rows
from serve_cluster import wait as _wait

from litecdc.cluster.etcd import EtcdClient, EtcdSettings


def _status(node: Node) -> dict[str, Any]:
    with node.client() as c:
        doc: dict[str, Any] = c.get("/status").json()
        return doc


def test_three_nodes_one_database(nodes: list[Node]) -> None:
    leader = _leader(nodes)
    follower = next(n for n in nodes if n is not leader)
    with follower.client() as c:  # a write on a follower is forwarded to the leader
        r = c.post(
            "/db/execute",
            params={"raft_index": ""},
            json=[
                "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
                ["INSERT INTO kv(v) VALUES(?)", "one"],
            ],
        )
        assert r.status_code == 200, r.text
        assert r.json()["results"][1] == {"last_insert_id": 1, "rows_affected": 1}
        cid = r.json()["raft_index"]
        assert r.json()["log_revision"] > 0  # acknowledged once committed in etcd
        plain = c.post("/db/execute", json=[["INSERT INTO kv(v) VALUES(?)", "two"]]).json()
        assert plain["raft_index"] == cid + 1 and plain["log_revision"] > r.json()["log_revision"]
        # a write that commits nothing still took its place in the log, and says which
        # (docs QA: raft_index was left out, so a client had no min_cid to read with)
        for params in ({"raft_index": ""}, {"queue": ""}):
            failed = c.post("/db/execute", params=params, json=["INSERT INTO nosuch VALUES(1)"])
            assert failed.status_code == 200, failed.text
            assert failed.json()["raft_index"] == plain["raft_index"] + 1, failed.text
            plain = failed.json()
        cid = plain["raft_index"]
        redirect = c.post("/db/execute", params={"redirect": ""}, json=["SELECT 1"])
        assert redirect.status_code == 301
        assert redirect.headers["location"].startswith(leader.url)
    for node in nodes:
        assert _rows(node, cid) == [[1, "one"], [2, "two"]]
    with leader.client() as c:
        nodes_doc = c.get("/nodes", params={"ver": "2"}).json()["nodes"]
        assert sorted(n["id"] for n in nodes_doc) == ["n0", "n1", "n2"]
        assert [n["id"] for n in nodes_doc if n["leader"]] == [_status(leader)["node"]["id"]]
        assert c.get("/readyz").status_code == 200
    # rqlite's store.leader on every node (gorqlite's Open() finds the leader there)
    leader_addr = leader.url.split("://", 1)[-1]
    for node in nodes:
        assert _status(node)["store"]["leader"] == {
            "node_id": _status(leader)["node"]["id"],
            "addr": leader_addr,
        }
    # a weak read on a follower is served by the leader; none reads locally
    with follower.client() as c:
        assert c.get("/db/query", params={"q": "SELECT count(*) FROM kv"}).status_code == 200
    journals = []
    for node in nodes:
        with node.client() as c:
            journals.append(c.get("/journal", params={"after": 1}).json()["entries"])
    assert journals[0] == journals[1] == journals[2]
    # what to alert on, for Prometheus (ops QA: /metrics had no cluster figures at all)
    for node in nodes:
        with node.client() as c:
            metrics = _metric_values(c.get("/metrics").text)
        leads = node is leader
        assert metrics["litecdc_cluster_is_leader"] == (1 if leads else 0)
        for healthy in ("leader_known", "etcd_reachable", "applying"):
            assert metrics[f"litecdc_cluster_{healthy}"] == 1, node.url
        assert metrics["litecdc_cluster_needs_snapshot"] == 0
        assert metrics["litecdc_cluster_applied_revision"] >= r.json()["log_revision"]
        assert metrics["litecdc_cluster_entries_applied_total"] >= 4  # (those above)
        assert metrics["litecdc_last_cid"] >= cid
        if leads:
            assert metrics["litecdc_cluster_entries_appended_total"] >= 4


def _metric_values(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text exposition, by name."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_reads_that_wait_long_do_not_hold_up_writes(nodes: list[Node]) -> None:
    """HTTP QA: 45 reads waiting for a cid that never comes (min_cid, 10 s each) held all
    of anyio's 40 threads, and a plain write waited for them. Writes have threads of their
    own: this write is answered while every one of those reads is still waiting. (On a
    cluster's leader: a standalone node answers such a cid at once, 409 — it writes its
    history alone.)"""
    node = _leader(nodes)

    answered: list[int] = []

    def wait_for_a_cid_never_written() -> None:
        with node.client() as c:
            r = c.get("/db/query", params={"q": "SELECT 1", "min_cid": "999999999"})
            answered.append(r.status_code)

    with node.client() as c:
        before = int(c.get("/debug/vars").json()["http"]["queries"])
        waiters = [threading.Thread(target=wait_for_a_cid_never_written) for _ in range(45)]
        for t in waiters:
            t.start()
        while int(c.get("/debug/vars").json()["http"]["queries"]) < before + 45:
            threading.Event().wait(0.05)  # every read has reached the node
        r = c.post("/db/execute", json=["CREATE TABLE not_held_up(x)"])
        assert r.status_code == 200, r.text
        assert answered == []  # none of the reads has come back yet
    for t in waiters:
        t.join(60)
    assert answered == [503] * 45


def test_a_statement_sqlite_calls_a_full_disk_fails_alone_and_the_cluster_goes_on(
    nodes: list[Node],
) -> None:
    """Determinism QA: an insert into an AUTOINCREMENT table with no rowid left fails with
    SQLITE_FULL, which every node took for its own full disk: each retried the log entry
    forever, none could lead, every later write was refused (503) — from one request.
    Also: parameters next to a word (`?AND`) and prefixed names reach the log as the node
    reads them."""
    leader = _leader(nodes)
    with leader.client() as c:
        r = c.post(
            "/db/execute",
            json=[
                "CREATE TABLE ff(id INTEGER PRIMARY KEY AUTOINCREMENT, x)",
                ["INSERT INTO ff(id, x) VALUES (?, 1)", 2**63 - 1],
            ],
        )
        assert r.status_code == 200 and "error" not in r.text, r.text
        r = c.post("/db/execute", json=[["INSERT INTO ff(x) VALUES (?)", 2]])
        assert r.status_code == 200, r.text
        assert "has no rowid left" in r.json()["results"][0]["error"]
        r = c.post(
            "/db/execute",
            json=[
                "CREATE TABLE kv(id INTEGER PRIMARY KEY, v)",
                ["INSERT INTO kv VALUES (1, 'a'), (2, 'b')"],
                ["UPDATE kv SET v = 'c' WHERE id=?AND v=?", 1, "a"],
                ["INSERT INTO kv VALUES (:id, #v)", {":id": 3, "v": "d"}],
            ],
        )
        assert r.status_code == 200 and "error" not in r.text, r.text
        # too few values: that statement's error, the others run (was a 400 for all)
        r = c.post(
            "/db/execute",
            json=[["INSERT INTO kv VALUES (?, ?)", 4], ["INSERT INTO kv VALUES (?, ?)", 4, "e"]],
        )
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert results[0] == {"error": "not enough args to execute query: want 2 got 1"}
        assert "error" not in results[1]
        cid = r.json()["raft_index"]
    for node in nodes:
        assert _rows(node, cid) == [[1, "c"], [2, "b"], [3, "d"], [4, "e"]]
        with node.client() as c:
            assert c.get("/readyz").status_code == 200


def test_nodes_lists_a_stopped_member_as_unreachable_until_it_is_removed(
    nodes: list[Node], etcd: EtcdCluster, cluster_name: str
) -> None:
    """A member that stopped vanished from /nodes as soon as its etcd record went (cluster
    QA). As rqlite lists a configured node that is down, it stays listed — not reachable,
    with the reason — until ``DELETE /remove`` forgets it."""
    leader = _leader(nodes)
    index = nodes.index(next(n for n in nodes if n is not leader))
    stopped, stopped_id = nodes[index], f"n{index}"
    assert stopped.stop() == 0  # its member record (lease) is revoked as it leaves
    with leader.client() as c:
        listed = {n["id"]: n for n in c.get("/nodes", params={"ver": "2"}).json()["nodes"]}
        assert sorted(listed) == ["n0", "n1", "n2"]
        down = listed.pop(stopped_id)
        assert down["reachable"] is False and down["leader"] is False
        assert down["api_addr"] == stopped.url
        assert "no live member record in etcd" in down["error"]
        assert "DELETE /remove" in down["error"]
        assert all(n["reachable"] and "error" not in n for n in listed.values())
        legacy = c.get("/nodes").json()  # rqlite's default shape: keyed by id
        assert legacy[stopped_id]["reachable"] is False and "error" in legacy[stopped_id]
        assert c.get("/leader").json() == next(n for n in listed.values() if n["leader"])

        # bad input changes nothing: a running member, an unknown id, a malformed body
        running = _status(leader)["node"]["id"]
        r = c.request("DELETE", "/remove", json={"id": running})
        assert r.status_code == 409, r.text
        assert r.text.startswith(f"node {running!r} is running")
        r = c.request("DELETE", "/remove", json={"id": "n9"})
        assert (r.status_code, r.text) == (404, "node 'n9' is not a member of this cluster\n")
        for body in ({"node": stopped_id}, {"id": 3}, [stopped_id], {"id": stopped_id, "x": 1}):
            assert c.request("DELETE", "/remove", json=body).status_code == 400, body
        assert c.post("/remove", json={"id": stopped_id}).status_code == 405
        assert sorted(c.get("/nodes").json()) == ["n0", "n1", "n2"]

        r = c.request("DELETE", "/remove", json={"id": stopped_id})
        assert (r.status_code, r.text) == (200, "")
        assert stopped_id not in c.get("/nodes").json()
    # started again, the node joins again
    nodes[index] = Node(stopped.data_dir, *stopped.extra, port=stopped.port).start()
    with leader.client() as c:
        _wait(lambda: c.get("/nodes").json()[stopped_id]["reachable"], "the node listed again")

        # review: removed while its member record had lapsed (here: deleted), a running
        # node wrote only its member record again and vanished from /nodes once stopped
        with EtcdClient(EtcdSettings(endpoints=etcd.endpoints)) as client:
            client.delete(f"/litecdc/{cluster_name}/members/{stopped_id}")
        r = c.request("DELETE", "/remove", json={"id": stopped_id})
        assert (r.status_code, r.text) == (200, "")
        _wait(lambda: stopped_id in c.get("/nodes").json(), "the running node to rejoin")
        assert nodes[index].stop() == 0
        down = c.get("/nodes").json()[stopped_id]
        assert down["reachable"] is False and "no live member record" in down["error"]


def test_nodes_contacts_each_member(nodes: list[Node]) -> None:
    """Review: after kill -9 a node kept its member record until the lease expired (up to
    10 s) and /nodes called it reachable — and still the leader, by its record's mode. As
    rqlite does, /nodes now asks every member."""
    leader = _leader(nodes)
    index = nodes.index(next(n for n in nodes if n is not leader))
    killed, killed_id = nodes[index], f"n{index}"
    assert killed.proc is not None
    killed.proc.kill()
    killed.proc.wait(timeout=10)
    with leader.client() as c:
        listed = {n["id"]: n for n in c.get("/nodes", params={"ver": "2"}).json()["nodes"]}
    down = listed.pop(killed_id)
    assert down["reachable"] is False and down["leader"] is False
    assert down["error"].startswith(f"node {killed_id} at {killed.url} does not answer")
    assert all(n["reachable"] and "error" not in n for n in listed.values()), listed
    assert [n["mode"] for n in listed.values() if n["leader"]] == ["leader"]


def test_an_os_chosen_http_port_is_refused_in_a_cluster(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str
) -> None:
    """With ``--http-addr 127.0.0.1:0`` the node id and advertised URL said port 0, and
    the other nodes forwarded writes there (cluster QA)."""
    data_dir = tmp_path / "n0"
    proc = serve_cli(
        "--data-dir", str(data_dir), "--http-addr", "127.0.0.1:0",
        "--etcd", etcd.endpoints[0], "--cluster", cluster_name,
        env={"PATH": "/usr/bin:/bin"},  # no LITECDC_* from outside
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "error: --http-addr 127.0.0.1:0 lets the system choose the port, which the other "
        "nodes of a cluster cannot know: give a fixed port, such as 127.0.0.1:4001\n"
    )
    assert not data_dir.exists()  # refused before anything was opened


@pytest.mark.slow
def test_leader_kill_moves_leadership_and_loses_no_acknowledged_write(
    nodes: list[Node],
) -> None:
    leader = _leader(nodes)
    with leader.client() as c:
        r = c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
        assert r.status_code == 200, r.text
    acknowledged: list[str] = []
    last_cid = 0
    survivors = [n for n in nodes if n is not leader]

    def write(node: Node, value: str) -> bool:
        nonlocal last_cid
        try:
            with node.client() as c:
                r = c.post(
                    "/db/execute",
                    params={"raft_index": ""},
                    json=[["INSERT INTO kv(v) VALUES(?)", value]],
                )
        except httpx.HTTPError:
            return False
        if r.status_code == 200 and "error" not in r.json()["results"][0]:
            acknowledged.append(value)
            last_cid = max(last_cid, r.json()["raft_index"])
            return True
        return False

    for i in range(20):
        assert write(survivors[i % 2], f"before-{i}")
    assert leader.proc is not None
    leader.proc.kill()  # kill -9
    leader.proc.wait()
    # writes resume on a new leader (how fast is measured by bench/, not asserted here)
    _wait(lambda: write(survivors[0], "after-0"), "a write on the new leader", timeout=30)
    for i in range(1, 10):
        _wait(lambda i=i: write(survivors[i % 2], f"after-{i}"), "writes after failover")
    new_leader = _leader(survivors)
    assert new_leader is not leader
    expected = sorted(acknowledged)
    for node in survivors:
        assert sorted(v for _, v in _rows(node, last_cid)) == expected
    # the killed node restarts and catches up
    leader.proc = None
    restarted = Node(leader.data_dir, *leader.extra, port=leader.port).start()
    nodes[nodes.index(leader)] = restarted
    assert sorted(v for _, v in _rows(restarted, last_cid)) == expected


@pytest.mark.slow
@pytest.mark.parametrize("share", [0.1, 0.5])
def test_cdc_follows_the_leader_through_two_leader_kills(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str, share: float
) -> None:
    import json

    from fakes import WebhookReceiver

    with WebhookReceiver(fail_share=share, seed=3) as receiver:
        config = tmp_path / "cdc.json"
        config.write_text(
            json.dumps(
                {
                    "endpoint": receiver.url,
                    "max_batch_delay": "20ms",
                    "high_watermark_interval": "100ms",
                    "transmit_min_backoff": "20ms",
                    "transmit_max_backoff": "100ms",
                }
            )
        )
        started = start_nodes(
            tmp_path, etcd.endpoints[0], cluster_name, "--cdc-config", str(config)
        )
        cids: list[int] = []

        def insert(node: Node, value: int) -> httpx.Response | None:
            with node.client() as c:
                r = c.post(
                    "/db/execute",
                    params={"raft_index": ""},
                    json=[["INSERT INTO kv(v) VALUES(?)", value]],
                )
            return r if r.status_code == 200 else None

        try:
            leader = _leader(started)
            with leader.client() as c:
                c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v)"])
            value = 0
            for _kill in range(2):
                for _ in range(10):
                    r = _wait(lambda v=value, at=leader: insert(at, v), "a write")
                    cids.append(r.json()["raft_index"])
                    value += 1
                assert leader.proc is not None
                leader.proc.kill()  # kill -9 the leader, then bring it back as a follower
                leader.proc.wait()
                leader.proc = None
                index = started.index(leader)
                survivors = [n for n in started if n is not leader]
                new_leader = _leader(survivors)
                started[index] = Node(leader.data_dir, *leader.extra, port=leader.port).start()
                leader = new_leader
            for _ in range(10):
                r = _wait(lambda v=value: insert(leader, v), "a write")
                cids.append(r.json()["raft_index"])
                value += 1

            def delivered() -> set[int]:
                return {p["index"] for b in receiver.batches for p in b["payload"]}

            _wait(lambda: set(cids) <= delivered(), "every cid delivered", timeout=60)
            assert {b["node_id"] for b in receiver.batches} <= {"n0", "n1", "n2"}
        finally:
            for node in started:
                node.stop()


@pytest.mark.slow
def test_a_paused_leader_cannot_append_once_another_leads(nodes: list[Node]) -> None:
    import signal

    old = _leader(nodes)
    with old.client() as c:
        c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
    assert old.proc is not None
    old.proc.send_signal(signal.SIGSTOP)  # frozen: its lease runs out, it does not know
    try:
        survivors = [n for n in nodes if n is not old]
        new = _leader(survivors)
        with new.client() as c:
            r = c.post(
                "/db/execute",
                params={"raft_index": ""},
                json=[["INSERT INTO kv(v) VALUES(?)", "from the new leader"]],
            )
            assert r.status_code == 200, r.text
            cid = r.json()["raft_index"]
    finally:
        old.proc.send_signal(signal.SIGCONT)

    # woken up, the old leader's write must not land in the log: it is fenced and steps down
    def write_via_old() -> bool:
        with old.client() as c:
            r = c.post("/db/execute", json=[["INSERT INTO kv(v) VALUES(?)", "via the old one"]])
        # 503 + Retry-After while it learns who leads; then forwarded to the new leader
        assert r.status_code in (200, 503), r.text
        return r.status_code == 200

    _wait(write_via_old, "a write through the old leader")
    _wait(lambda: not _status(old)["cluster"]["is_leader"], "the old leader to step down")
    _wait(lambda: all(len(_rows(n, cid)) == 2 for n in nodes), "both rows everywhere")
    rows = [_rows(n, cid) for n in nodes]
    assert rows[0] == rows[1] == rows[2]


@pytest.mark.slow
def test_restarting_every_node_keeps_identical_data(nodes: list[Node]) -> None:
    leader = _leader(nodes)
    with leader.client() as c:
        c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
        r = c.post(
            "/db/execute",
            params={"raft_index": ""},
            json=[["INSERT INTO kv(v) VALUES(?)", f"v{i}"] for i in range(30)],
        )
        cid = r.json()["raft_index"]
    for i, node in enumerate(nodes):
        assert node.stop() == 0
        nodes[i] = Node(node.data_dir, *node.extra, port=node.port)
    for node in nodes:
        node.start()
    _leader(nodes)
    rows = [_rows(n, cid) for n in nodes]
    assert len(rows[0]) == 30 and rows[0] == rows[1] == rows[2]
    journals = []
    for node in nodes:
        with node.client() as c:
            journals.append(c.get("/journal", params={"after": 1}).json()["entries"])
    assert journals[0] == journals[1] == journals[2]


def test_a_node_joining_a_grown_cluster_copies_the_founders_data_before_anything(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str
) -> None:
    """QA: a cluster grown from a standalone node has the founder's data in no log entry.
    A node joining before the first write found an empty log and took itself for caught
    up: it said ready, served reads without the founder's tables — and, the founder
    stopped, led and wrote cid 2 over them (the founder was then refused as diverged).
    It now waits, not ready and not leading, until a snapshot brings the founding data."""
    founder_dir = tmp_path / "n0"
    standalone = Node(founder_dir).start()
    with standalone.client() as c:
        standalone.execute(
            c,
            [
                "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
                ["INSERT INTO kv(v) VALUES(?)", "founder"],
            ],
        )
    assert standalone.stop() == 0
    cluster = ("--etcd", etcd.endpoints[0], "--cluster", cluster_name)
    founder = Node(founder_dir, *cluster, "--node-id", "n0").start()
    assert founder.stop() == 0  # founded; down before the next node comes
    joiner = AnsweringNode(tmp_path / "n1", *cluster, "--node-id", "n1").start()
    nodes = [joiner]
    try:
        time.sleep(3)  # elections and catch-up had time to go wrong
        with joiner.client() as c:
            ready = c.get("/readyz")
            assert ready.status_code == 503 and "[-]store not ok" in ready.text, ready.text
            status = _status(joiner)["cluster"]
            assert status["needs_snapshot"] is True and status["leader"] is None, status
            assert "founding node's own data" in status["last_error"], status
            write = c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v)"])
            assert write.status_code == 503, write.text
        founder.start()
        nodes.append(founder)
        assert _rows(joiner, 2) == [[1, "founder"]]
        _wait(lambda: joiner.client().get("/readyz").status_code == 200, "the joiner ready")
        with founder.client() as c:
            cid = founder.execute(c, [["INSERT INTO kv(v) VALUES(?)", "clustered"]])["raft_index"]
        assert _rows(joiner, cid) == _rows(founder, cid) == [[1, "founder"], [2, "clustered"]]
    finally:
        for node in nodes:
            node.stop()


def test_a_standalone_node_founds_a_cluster_with_its_data_but_cannot_join_one(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str
) -> None:
    """A node new to a running cluster that brings data of its own was started, served its
    own rows as a follower and logged "this database did not come from this cluster's log"
    every 2 s (cluster QA; a plain SQLite file's tables made the log's CREATE TABLE fail
    there and succeed elsewhere). It is refused at start; the founder may bring data, and
    an empty node copies it (snapshot)."""
    founder_dir, stranger_dir = tmp_path / "n0", tmp_path / "n1"
    for data_dir, value in ((founder_dir, "founder"), (stranger_dir, "stranger")):
        standalone = Node(data_dir).start()
        with standalone.client() as c:
            standalone.execute(
                c,
                [
                    "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
                    ["INSERT INTO kv(v) VALUES(?)", value],
                ],
            )
        assert standalone.stop() == 0
    cluster = ("--etcd", etcd.endpoints[0], "--cluster", cluster_name)
    founder = Node(founder_dir, *cluster, "--node-id", "n0").start()
    nodes = [founder]
    try:
        with founder.client() as c:
            cid = founder.execute(c, [["INSERT INTO kv(v) VALUES(?)", "clustered"]])["raft_index"]
        assert _rows(founder, cid) == [[1, "founder"], [2, "clustered"]]
        proc = serve_cli(
            "--data-dir", str(stranger_dir), "--http-addr", f"127.0.0.1:{free_port()}",
            *cluster, "--node-id", "n1", env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"error: data directory {stranger_dir} already holds data (journal up to cid 2, "
            f"1 table(s)) that did not come from cluster {cluster_name!r}: a node joins a "
            "running cluster with an empty data directory and copies the data from the "
            "others; give it a new --data-dir (to replace the cluster's data with this data, POST "
            "its /db/backup to the leader's /db/load)\n"
        )
        assert not (stranger_dir / "cluster").exists()  # still free to be used elsewhere
        newcomer = Node(tmp_path / "n2", *cluster, "--node-id", "n2").start()
        nodes.append(newcomer)
        assert _rows(newcomer, cid) == [[1, "founder"], [2, "clustered"]]
        # the founder restarts as a member (its directory is tied to the cluster now)
        assert founder.stop() == 0
        founder.start()
        assert _rows(founder, cid) == [[1, "founder"], [2, "clustered"]]
    finally:
        for node in nodes:
            node.stop()
