"""Log compaction and catch-up by snapshot: in-process ClusterNodes on a real etcd, each
serving its real HTTP API (so snapshots travel as ``GET /db/backup``)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvicorn
from etcd_cluster import EtcdCluster

from litecdc.cluster import (
    ClusterNode,
    EtcdClient,
    EtcdSettings,
    SnapshotSettings,
    log_prefix,
)
from litecdc.config import NodeConfig
from litecdc.http.app import create_app
from litecdc.results import Statement as S
from litecdc.store import Store

SETTINGS = SnapshotSettings(compact_interval=0.3, keep_entries=10)


def wait_for(condition: Callable[[], object], timeout: float, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Member:
    """One node: store, ClusterNode and its HTTP API on a free port (uvicorn in a thread)."""

    def __init__(self, data_dir: Path, node_id: str, etcd: EtcdCluster, cluster: str) -> None:
        self.port = free_port()
        config = NodeConfig(data_dir=data_dir, http_addr=f"127.0.0.1:{self.port}", node_id=node_id)
        self.store = Store(config)
        self.node = ClusterNode(
            self.store,
            node_id,
            f"http://127.0.0.1:{self.port}",
            EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0),
            cluster,
            member_interval=0.3,
            snapshots=SETTINGS,
        )
        app = create_app(self.store, config, cluster=self.node)
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 10, "HTTP server up")

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.node.close()
        self.store.close()


class Cluster:
    def __init__(self, base: Path, etcd: EtcdCluster, name: str) -> None:
        self.base, self.etcd, self.name = base, etcd, name
        self.members: dict[str, Member] = {}

    def start(self, node_id: str) -> ClusterNode:
        member = Member(self.base / node_id, node_id, self.etcd, self.name)
        self.members[node_id] = member
        return member.node

    def stop(self, node_id: str) -> None:
        self.members.pop(node_id).close()

    def leader(self) -> ClusterNode:
        wait_for(lambda: sum(m.node.is_leader() for m in self.members.values()) == 1, 10)
        return next(m.node for m in self.members.values() if m.node.is_leader())

    def converged(self, timeout: float = 15) -> None:
        last = self.leader().journal.last_cid()
        wait_for(
            lambda: all(m.node.journal.last_cid() >= last for m in self.members.values()),
            timeout,
            "every node applied the leader's last cid",
        )

    def states(self) -> list[tuple[object, ...]]:
        return [state(m.store) for m in self.members.values()]

    def close(self) -> None:
        for node_id in list(self.members):
            self.stop(node_id)


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdCluster, cluster_name: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, etcd, cluster_name)
    for node_id in ("n1", "n2", "n3"):
        made.start(node_id)
    yield made
    made.close()


def state(store: Store) -> tuple[object, ...]:
    """What must be identical everywhere: every user table as SQL text, the journal,
    the captured changes and the applied log revision."""
    return (
        store.dump_sql(),
        store.journal_page(0, 10_000).entries,
        store.changes(0, 10_000),
        store.journal.applied_revision(),
    )


def first_log_cid(etcd: EtcdCluster, cluster: str) -> int:
    with EtcdClient(EtcdSettings(endpoints=etcd.endpoints)) as client:
        kvs = client.range(log_prefix(cluster), prefix=True, limit=1, keys_only=True).kvs
        return int(kvs[0].key[len(log_prefix(cluster)) :])


def write(leader: ClusterNode, count: int) -> None:
    for i in range(count):
        leader.execute(
            [
                S("INSERT INTO t(v, r, b) VALUES(?, random(), randomblob(16))", (f"row {i}",)),
                S("UPDATE t SET n = n + 1 WHERE id % 3 = ?", (i % 3,)),
            ]
        )


def test_a_late_node_joins_by_snapshot_after_compaction(
    cluster: Cluster, etcd: EtcdCluster
) -> None:
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r, b BLOB, n DEFAULT 0)")])
    write(leader, 60)
    cluster.converged()
    last = leader.journal.last_cid()
    # the leader deletes the keys every live member applied (keeping the newest 10) and
    # compacts etcd's history
    wait_for(lambda: leader.compactor.keys_deleted >= last - 11, 10, "log compacted")
    assert leader.compactor.compacted_revision > 0
    assert first_log_cid(etcd, cluster.name) == last - 9

    late = cluster.start("n4")  # empty data directory: the log's first entries are gone
    cluster.converged()
    # (the loop counts the snapshot a moment after its data is in: converged() may see it first)
    wait_for(
        lambda: late.apply_loop.snapshots_installed == 1 and not late.apply_loop.needs_snapshot,
        10,
        "snapshot counted",
    )
    assert late.snapshots.last_source is not None and late.snapshots.last_source[0] != "n4"
    states = cluster.states()
    assert all(s == states[0] for s in states[1:])
    assert "row 59" in str(states[0][0])

    write(leader, 5)  # and it keeps applying new writes through the log
    cluster.converged()
    states = cluster.states()
    assert all(s == states[0] for s in states[1:])
    assert late.apply_loop.applied >= 5
    assert late.status()["log"]["snapshots_installed"] == 1  # type: ignore[index]


def test_a_follower_whose_position_was_compacted_catches_up_by_snapshot(
    cluster: Cluster, etcd: EtcdCluster
) -> None:
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r, b BLOB, n DEFAULT 0)")])
    write(leader, 5)
    cluster.converged()
    follower = next(m.node for m in cluster.members.values() if m.node is not leader)
    node_id, last = follower.node_id, follower.journal.last_cid()
    cluster.stop(node_id)  # its member record goes with it: it no longer holds compaction back
    write(leader, 30)
    wait_for(lambda: first_log_cid(etcd, cluster.name) > last + 1, 10, "compacted past it")

    restarted = cluster.start(node_id)  # its own file, behind the log's first entry
    cluster.converged()
    assert restarted.apply_loop.snapshots_installed == 1
    assert restarted.apply_loop.log_reads == 0
    states = cluster.states()
    assert all(s == states[0] for s in states[1:])


def test_a_restarted_node_still_in_the_log_downloads_no_snapshot(
    cluster: Cluster, etcd: EtcdCluster
) -> None:
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, r, b BLOB, n DEFAULT 0)")])
    write(leader, 30)
    cluster.converged()
    wait_for(lambda: first_log_cid(etcd, cluster.name) > 2, 10, "log compacted")
    follower = next(m.node for m in cluster.members.values() if m.node is not leader)
    node_id, last = follower.node_id, follower.journal.last_cid()
    cluster.stop(node_id)
    write(leader, 5)  # fewer than the 10 entries compaction keeps
    time.sleep(1.0)  # compaction runs meanwhile (every 0.3 s), and keeps what it missed
    assert first_log_cid(etcd, cluster.name) <= last + 1

    restarted = cluster.start(node_id)
    cluster.converged()
    assert restarted.apply_loop.snapshots_installed == 0
    assert restarted.apply_loop.applied == 5  # from the log, nothing twice

    # etcd's history compacted by someone else (another user of the same etcd): the keys
    # it lacks are still there, so it reads them rather than downloading a snapshot
    cluster.stop(node_id)
    write(leader, 3)
    with EtcdClient(EtcdSettings(endpoints=etcd.endpoints)) as client:
        client.compact(client.range(log_prefix(cluster.name), limit=1).revision)
    again = cluster.start(node_id)
    cluster.converged()
    # (counted once the read's entries are applied: converged() may see them first)
    wait_for(
        lambda: (again.apply_loop.log_reads, again.apply_loop.applied) == (1, 3),
        10,
        "the log read and its entries counted",
    )
    assert again.apply_loop.snapshots_installed == 0
    states = cluster.states()
    assert all(s == states[0] for s in states[1:])
