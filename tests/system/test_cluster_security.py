"""Cluster security with real `litecdc serve --etcd` processes: nodes serving HTTPS with an
auth file forward writes to the leader with the client's credentials, catch up by
downloading a peer's snapshot over HTTPS with their own credentials, and reach an etcd
that serves TLS and requires client certificates.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.litecdc_node import Node
from etcd_cluster import EtcdCluster
from fakes import CertFiles, make_certs
from serve_cluster import WAIT, cluster_status, journal, leader, rows, wait

pytestmark = pytest.mark.slow

ADMIN = ("admin", "admin-secret")
READER = ("reader", "reader-secret")
NODE = ("node", "node-secret")
USERS = [
    {"username": ADMIN[0], "password": ADMIN[1], "perms": ["all"]},
    {"username": READER[0], "password": READER[1], "perms": ["query"]},
    {"username": NODE[0], "password": NODE[1], "perms": ["backup"]},
]


def _local_user(i: int) -> tuple[str, str]:
    """A user that only node ``i``'s auth file lets write (to see the leader check again)."""
    return (f"local-n{i}", "local-secret")


def _wait(predicate: Any, what: str, timeout: float = WAIT) -> Any:
    return wait(predicate, what, timeout)


def _status(node: Node) -> dict[str, Any]:
    return cluster_status(node, ADMIN)


def _leader(nodes: list[Node]) -> Node:
    return leader(nodes, ADMIN)


def _rows(node: Node, cid: int) -> list[Any]:
    return rows(node, cid, ADMIN)


def _journal(node: Node) -> list[Any]:
    return journal(node, ADMIN)


def _secure_node(base: Path, i: int, certs: CertFiles, etcd: EtcdCluster, cluster: str,
                 *extra: str, trust_peers: bool = True, port: int | None = None,
                 ) -> Node:  # fmt: skip
    """Node ``i`` serving HTTPS with an auth file; with ``trust_peers`` it verifies the
    other nodes' certificates with the test CA (--node-ca-cert)."""
    auth = base / f"auth-n{i}.json"
    local = _local_user(i)
    users = [*USERS, {"username": local[0], "password": local[1], "perms": ["execute"]}]
    auth.write_text(json.dumps(users))
    node_ca = ("--node-ca-cert", str(certs.ca_cert)) if trust_peers else ()
    return Node(
        base / f"n{i}",
        "--etcd", etcd.endpoints[0],
        "--cluster", cluster,
        "--node-id", f"n{i}",
        "--http-cert", str(certs.server_cert),
        "--http-key", str(certs.server_key),
        *node_ca,
        "--auth", str(auth),
        "--node-user", NODE[0],
        "--node-password", NODE[1],
        *extra,
        https=True,
        verify=ssl.create_default_context(cafile=str(certs.ca_cert)),
        port=port,
    )  # fmt: skip


def _start(nodes: list[Node]) -> list[Node]:
    try:
        for node in nodes:
            node.start()
    except BaseException:
        for node in nodes:
            node.stop()
        raise
    return nodes


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_certs(tmp_path / "certs")


@pytest.fixture
def secure_nodes(
    tmp_path: Path, certs: CertFiles, etcd: EtcdCluster, cluster_name: str
) -> Iterator[list[Node]]:
    extra = ("--compact-interval", "0.5", "--compact-keep", "5")
    nodes = _start([_secure_node(tmp_path, i, certs, etcd, cluster_name, *extra) for i in range(3)])
    yield nodes
    for node in nodes:
        node.stop()


def test_https_and_auth_forward_writes_with_the_clients_credentials(
    secure_nodes: list[Node],
) -> None:
    nodes = secure_nodes
    leader = _leader(nodes)
    assert leader.url.startswith("https://")
    assert _status(nodes[0])["leader"]["address"] == leader.url
    index = nodes.index(next(n for n in nodes if n is not leader))
    follower = nodes[index]
    create = [
        "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
        ["INSERT INTO kv(v) VALUES(?)", "by admin"],
    ]
    insert = [["INSERT INTO kv(v) VALUES(?)", "refused"]]

    with follower.client() as c:  # no credentials: refused (by the follower, rqlite's order)
        r = c.post("/db/execute", json=insert)
        assert r.status_code == 401, r.text
        assert "'execute' permission" in r.text
        assert r.headers["www-authenticate"].startswith("Basic")
    with follower.client(auth=READER) as c:  # query only: no write, on any node
        r = c.post("/db/execute", json=insert)
        assert r.status_code == 401, r.text
        assert "'execute' permission" in r.text
    # a user this follower lets write but the leader does not: the follower forwards, the
    # leader checks the credentials again and refuses; the answer is relayed
    with follower.client(auth=_local_user(index)) as c:
        r = c.post("/db/execute", json=insert)
        assert r.status_code == 401, r.text
        assert "unauthorized: this request needs the 'execute' permission" in r.text
        assert r.headers["www-authenticate"].startswith("Basic")
    with follower.client(auth=ADMIN) as c:  # forwarded over HTTPS, credentials pass through
        r = c.post("/db/execute", params={"raft_index": ""}, json=create)
        assert r.status_code == 200, r.text
        assert r.json()["results"][1] == {"last_insert_id": 1, "rows_affected": 1}
        cid = r.json()["raft_index"]
        redirect = c.post("/db/execute", params={"redirect": ""}, json=insert)
        assert redirect.status_code == 301
        assert redirect.headers["location"].startswith(leader.url + "/db/execute")
    with follower.client(auth=READER) as c:  # a weak read is forwarded to the leader too
        r = c.get("/db/query", params={"q": "SELECT v FROM kv"})
        assert r.status_code == 200, r.text
        assert r.json()["results"][0]["values"] == [["by admin"]]
    for node in nodes:
        assert _rows(node, cid) == [[1, "by admin"]]
    with leader.client(auth=NODE) as c:  # the node user may download backups, not write
        assert c.get("/db/backup").content.startswith(b"SQLite format 3\0")
        assert c.post("/db/execute", json=insert).status_code == 401
    # the leader holds idle keep-alive HTTPS connections (the followers' forwarders): it
    # still shuts down cleanly (stop() kills it, exit code -9, if it lingers)
    assert leader.stop() == 0


def test_snapshot_catch_up_over_https_with_credentials(secure_nodes: list[Node]) -> None:
    nodes = secure_nodes
    leader = _leader(nodes)
    with leader.client(auth=ADMIN) as c:
        r = c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
        assert r.status_code == 200, r.text
    index = nodes.index(next(n for n in nodes if n is not leader))
    stopped = nodes[index]
    stopped_cid = _wait(lambda: _status(stopped)["applied_cid"], "the follower to apply")
    assert stopped.stop() == 0
    with leader.client(auth=ADMIN) as c:
        for i in range(40):  # one log entry each
            r = c.post("/db/execute", json=[["INSERT INTO kv(v) VALUES(?)", f"v{i}"]])
            assert r.status_code == 200, r.text

    def compacted_past() -> bool:  # the log's first entry is past the stopped node's last
        log = _status(leader)["log"]
        return bool(log["keys_compacted"] > stopped_cid and log["compacted_revision"] > 0)

    _wait(compacted_past, "the leader to compact the log past the stopped follower")
    last_cid = _status(leader)["applied_cid"]
    restarted = Node(stopped.data_dir, *stopped.extra, https=True, verify=stopped.verify,
                     port=stopped.port)  # fmt: skip
    nodes[index] = restarted.start()
    _wait(lambda: _status(restarted)["log"]["snapshots_installed"] >= 1, "a snapshot install")
    _wait(lambda: _status(restarted)["applied_cid"] >= last_cid, "the restarted node to catch up")
    status = _status(restarted)
    assert status["last_error"] is None or "snapshot" not in status["last_error"], status
    rows = [_rows(n, last_cid) for n in nodes]
    assert len(rows[0]) == 40 and rows[0] == rows[1] == rows[2]
    journals = [_journal(n) for n in nodes]
    assert journals[0] == journals[1] == journals[2]
    # and it keeps applying what comes after the snapshot
    with restarted.client(auth=ADMIN) as c:
        r = c.post("/db/execute", params={"raft_index": ""},
                   json=[["INSERT INTO kv(v) VALUES(?)", "after"]])  # fmt: skip
        assert r.status_code == 200, r.text
        cid = r.json()["raft_index"]
    assert all(_rows(n, cid)[-1] == [41, "after"] for n in nodes)


def test_a_follower_that_cannot_verify_the_leaders_certificate_is_not_ready(
    tmp_path: Path, certs: CertFiles, etcd: EtcdCluster, cluster_name: str
) -> None:
    """Started without --node-ca-cert in front of a leader whose certificate a private CA
    signed, a follower said ready (readyz 200) while every forwarded write failed with 503
    (cluster QA). Its readyz now contacts the leader as forwarding does, and says why not."""
    nodes = _start([_secure_node(tmp_path, 0, certs, etcd, cluster_name)])
    try:
        _leader(nodes)
        # start() takes readyz's 401 (no credentials) for "up"; readiness is checked below
        follower = _secure_node(tmp_path, 1, certs, etcd, cluster_name, trust_peers=False)
        nodes.append(follower.start())

        def readyz() -> Any:
            with follower.client(auth=ADMIN) as c:
                r = c.get("/readyz")
            return r if "[-]leader not contactable" in r.text else None

        r = _wait(readyz, "the follower to report the leader it cannot verify")
        assert r.status_code == 503
        assert r.text.startswith(
            f"[+]node ok\n[-]leader not contactable: the HTTPS certificate of the leader n0 "
            f"at {nodes[0].url} cannot be verified ("
        ), r.text
        assert "pass --node-ca-cert with the CA that signed the nodes' certificates" in r.text
        assert r.text.endswith("\n[+]store ok")
        with follower.client(auth=ADMIN) as c:  # what readyz foretold
            r = c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
            assert r.status_code == 503, r.text
            assert "pass --node-ca-cert" in r.text  # the forwarder says the same
            assert c.get("/readyz", params={"noleader": ""}).status_code == 200
        # restarted with the CA, the same follower is ready and forwards
        assert follower.stop() == 0
        nodes[1] = _secure_node(tmp_path, 1, certs, etcd, cluster_name, port=follower.port)
        nodes[1].start()
        with nodes[1].client(auth=ADMIN) as c:
            _wait(lambda: c.get("/readyz").status_code == 200, "the follower to be ready")
            r = c.post("/db/execute", json=["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)"])
            assert r.status_code == 200, r.text
    finally:
        for node in nodes:
            node.stop()


def test_nodes_reach_an_etcd_with_tls_and_client_certificates(
    tmp_path: Path, certs: CertFiles, cluster_name: str
) -> None:
    with EtcdCluster(tmp_path / "etcd", size=1, tls=certs) as etcd:
        tls = (
            "--etcd-ca-cert", str(certs.ca_cert),
            "--etcd-cert", str(certs.client_cert),
            "--etcd-key", str(certs.client_key),
        )  # fmt: skip
        nodes = _start([
            Node(tmp_path / f"n{i}", "--etcd", etcd.endpoints[0], "--cluster", cluster_name,
                 "--node-id", f"n{i}", *tls)
            for i in range(3)
        ])  # fmt: skip
        try:
            leader = _leader_plain(nodes)
            follower = next(n for n in nodes if n is not leader)
            with follower.client() as c:
                r = c.post(
                    "/db/execute",
                    params={"raft_index": ""},
                    json=[
                        "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
                        ["INSERT INTO kv(v) VALUES(?)", "over tls"],
                    ],
                )
                assert r.status_code == 200, r.text
                cid = r.json()["raft_index"]
            for node in nodes:
                with node.client() as c:
                    r = c.get(
                        "/db/query",
                        params={"q": "SELECT v FROM kv", "level": "none", "min_cid": cid},
                    )
                    assert r.status_code == 200, r.text
                    assert r.json()["results"][0]["values"] == [["over tls"]]
        finally:
            for node in nodes:
                node.stop()


def _leader_plain(nodes: list[Node]) -> Node:
    def find() -> Node | None:
        leaders = []
        for n in nodes:
            with n.client() as c:
                if c.get("/status").json()["cluster"]["is_leader"]:
                    leaders.append(n)
        return leaders[0] if len(leaders) == 1 else None

    node: Node = _wait(find, "exactly one leader")
    return node
