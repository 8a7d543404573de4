"""The pull source on a real three-node cluster (`litecdc serve --etcd` over a real etcd).

Subscriptions are internal writes: one registered on a follower is forwarded to the
leader, and the hold reaches every node through the log. Rows and changes are served
by any node once it has applied the cid asked for; every node describes a table as
reshaped at the same cid.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.ipc
from e2e.litecdc_node import Node
from serve_cluster import leader as _leader
from serve_cluster import wait as _wait


def _subscriptions(node: Node) -> dict[str, Any]:
    with node.client() as c:
        r = c.get("/cdc/subscriptions")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc


def _holds(node: Node) -> dict[str, Any]:
    return {h["name"]: (h["cid"], h["expired"]) for h in _subscriptions(node)["subscriptions"]}


def _arrow(node: Node, path: str, **params: Any) -> pa.Table:
    with node.client() as c:
        r = c.get(path, params={"format": "arrow", **params})
        assert r.status_code == 200, r.text
        return pyarrow.ipc.open_stream(r.content).read_all()


def _reshaped_cid(node: Node, table: str) -> int:
    with node.client() as c:
        r = c.get(f"/cdc/tables/{table}")
        assert r.status_code == 200, r.text
        return int(r.json()["reshaped_cid"])


def test_subscriptions_and_reads_through_a_follower(nodes: list[Node]) -> None:
    leader = _leader(nodes)
    followers = [n for n in nodes if n is not leader]
    follower = followers[0]
    with follower.client() as c:
        r = c.post(
            "/db/execute",
            json=[
                "CREATE TABLE src (id INTEGER PRIMARY KEY, v TEXT, b BLOB)",
                ["INSERT INTO src VALUES (1, 'a', ?)", [0, 255]],
            ],
        )
        assert r.status_code == 200, r.text
        # registering on a follower: forwarded to the leader, which writes the hold
        r = c.post("/cdc/subscriptions", json={"name": "pipe"})
        assert r.status_code == 200, r.text
        cid = r.json()["cid"]
        assert r.json()["name"] == "pipe"

    # the hold reaches every node, identically
    for node in nodes:
        _wait(lambda n=node: "pipe" in _holds(n), f"the hold on {node.url}")
    assert len({tuple(sorted(_holds(n).items())) for n in nodes}) == 1
    pipe_cid, expired = _holds(leader)["pipe"]
    assert not expired and cid - 1 <= pipe_cid <= cid

    with followers[1].client() as c:
        r = c.post("/db/execute", json=["INSERT INTO src VALUES (2, 'b', NULL)"])
        assert r.status_code == 200, r.text
        r = c.post("/db/execute", json=["UPDATE src SET id = 3 WHERE id = 1"])
        assert r.status_code == 200, r.text
    last = _subscriptions(leader)["last_cid"]

    # a follower serves the same snapshot rows and changes once it has applied ``last``
    for node in followers:
        _wait(lambda n=node: _subscriptions(n)["last_cid"] >= last, f"{node.url} to catch up")
        rows = _arrow(node, "/cdc/tables/src/rows")
        assert rows.select(["id", "v", "b"]).to_pylist() == [
            {"id": 2, "v": "b", "b": None},
            {"id": 3, "v": "a", "b": b"\x00\xff"},
        ]
        assert (rows.schema.metadata or {})[b"litecdc.cid"] == str(last).encode()
        changes = _arrow(node, "/cdc/tables/src/changes", after=cid)
        assert [
            (e["_litecdc_op"], e["id"]) for e in changes.select(["_litecdc_op", "id"]).to_pylist()
        ] == [("upsert", 2), ("delete", 1), ("upsert", 3)]
        assert (changes.schema.metadata or {})[b"litecdc.end_cid"] == str(last).encode()
        with node.client() as c:  # older changes were pruned on every replica alike
            r = c.get("/cdc/tables/src/changes", params={"after": pipe_cid - 1})
            assert r.status_code == 410, r.text

    # progress and release through another follower, seen everywhere
    with followers[1].client() as c:
        r = c.post("/cdc/subscriptions/pipe/progress", json={"cid": last})
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "pipe", "cid": last}
    for node in nodes:
        _wait(lambda n=node: _holds(n).get("pipe") == (last, False), f"progress on {node.url}")
        _wait(lambda n=node: _subscriptions(n)["pruned_cid"] == last, f"pruning on {node.url}")
    with follower.client() as c:
        r = c.delete("/cdc/subscriptions/pipe")
        assert r.status_code == 200, r.text
    for node in nodes:
        _wait(lambda n=node: "pipe" not in _holds(n), f"the release on {node.url}")

    # a hold placed at a given cid (a stream's starting_cid) through a follower: the
    # leader judges the cid (a follower's copy may lag) and writes it
    with followers[1].client() as c:
        r = c.post("/cdc/subscriptions", json={"name": "at", "cid": last})
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "at", "cid": last}
        r = c.post("/cdc/subscriptions", json={"name": "past", "cid": last + 10_000})
        assert r.status_code == 400 and "beyond the head" in r.text, r.text
        r = c.post("/cdc/subscriptions", json={"name": "pruned", "cid": last - 1})
        assert r.status_code == 410 and f"pruned through cid {last}" in r.text, r.text
    for node in nodes:
        _wait(lambda n=node: _holds(n).get("at") == (last, False), f"the hold on {node.url}")
        assert "past" not in _holds(node) and "pruned" not in _holds(node)
    with follower.client() as c:
        assert c.delete("/cdc/subscriptions/at").status_code == 200

    # a reshape (db/reshape.py) is recorded by each node as it applies the log: every one
    # describes the table as reshaped at the same cid
    with followers[1].client() as c:
        r = c.post("/db/execute", json=["ALTER TABLE src RENAME COLUMN v TO w"])
        assert r.status_code == 200, r.text
        assert "error" not in r.json()["results"][0], r.text
    for node in nodes:
        _wait(lambda n=node: _reshaped_cid(n, "src") > last, f"the rename on {node.url}")
    assert len({_reshaped_cid(n, "src") for n in nodes}) == 1


def test_snapshot_reads_wait_for_a_follower_behind_the_registration(nodes: list[Node]) -> None:
    """Pipeline QA: a subscription registered (on the leader) at cid N had its snapshot
    pages read on a follower still behind N; they came back older than the registration
    and the finished snapshot swept their rows away — rows missing at the sink, lag 0.
    Reads carry ``min_cid`` (the registration): the follower waits until it has applied
    it, and a client given several nodes goes on to the next when it does not in time.
    The follower is held behind for real: another process's write lock on its database
    stops its apply loop, while it goes on serving reads."""
    import sqlite3
    import threading
    import time

    from litecdc.pipeline.source_client import SourceClient

    leader = _leader(nodes)
    follower = next(n for n in nodes if n is not leader)
    with leader.client() as c:
        r = c.post(
            "/db/execute",
            json=[
                "CREATE TABLE src (id INTEGER PRIMARY KEY, v TEXT)",
                "INSERT INTO src VALUES (1, 'a')",
            ],
        )
        assert r.status_code == 200, r.text
    last = _subscriptions(leader)["last_cid"]
    _wait(lambda: _subscriptions(follower)["last_cid"] >= last, "the follower to catch up")

    def hold_behind() -> sqlite3.Connection:
        lock = sqlite3.connect(
            follower.data_dir / "db.sqlite", isolation_level=None, check_same_thread=False
        )
        lock.execute("BEGIN IMMEDIATE")
        return lock

    lock = hold_behind()
    with follower.client() as c:  # forwarded to the leader, applied there only
        r = c.post("/cdc/subscriptions", json={"name": "behind"})
        assert r.status_code == 200, r.text
        registered = r.json()["cid"]
        with leader.client() as lc:
            r = lc.post("/db/execute", json=["INSERT INTO src VALUES (2, 'b')"])
            assert r.status_code == 200, r.text
        assert _subscriptions(follower)["last_cid"] < registered  # behind, for real
        threading.Timer(1.5, lock.rollback).start()
        started = time.monotonic()
        r = c.get(
            "/cdc/tables/src/rows",
            params={"format": "json", "min_cid": registered},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert time.monotonic() - started >= 1.0  # it waited for the follower's apply
        assert r.json()["cid"] >= registered
        assert [row[:2] for row in r.json()["rows"]][:1] == [[1, "a"]]
    lock.close()

    lock = hold_behind()
    try:
        with leader.client() as lc:
            r = lc.post("/db/execute", json=["INSERT INTO src VALUES (3, 'c')"])
            assert r.status_code == 200, r.text
        head = _subscriptions(leader)["last_cid"]
        with follower.client() as c:  # rqlite's readyz?sync: not while it is behind
            r = c.get("/readyz", params={"sync": "", "timeout": "500ms"})
            assert r.status_code == 503, r.text
            assert r.text.startswith("[+]node ok\n[+]leader ok\n[+]store ok\n[-]sync not ok: ")
            assert c.get("/readyz").status_code == 200  # (without sync: ready)
        with SourceClient([follower.url, leader.url], timeout=30) as client:
            page = client.rows("src", limit=10, min_cid=head)  # the follower: 503 in 10 s
            assert page.cid >= head
            assert page.table.column("id").to_pylist() == [1, 2, 3]
            assert client.urls[client._current] == leader.url
    finally:
        lock.rollback()
        lock.close()
    with follower.client() as c:  # ready again once its apply loop got past the lock

        def synced() -> bool:
            r = c.get("/readyz", params={"sync": "", "timeout": "2s"})
            return (r.status_code, r.text) == (
                200,
                "[+]node ok\n[+]leader ok\n[+]store ok\n[+]sync ok",
            )

        _wait(synced, "the follower in sync again")
    with leader.client() as lc:
        assert lc.delete("/cdc/subscriptions/behind").status_code == 200
