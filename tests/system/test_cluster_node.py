"""Three in-process ClusterNodes (each its own store) on one real etcd member."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from etcd_cluster import EtcdCluster

from litecdc.cluster import (
    ClusterNode,
    EtcdClient,
    EtcdSettings,
    EtcdUnavailableError,
    LogAppender,
    NotLeaderError,
    leader_key,
    log_prefix,
)
from litecdc.config import NodeConfig
from litecdc.db import engine as engine_module
from litecdc.db.engine import WRITE_LIMIT_ERROR
from litecdc.db.schema import CREATE_CDC_STATE, high_watermark_sql
from litecdc.errors import ConfigError, RequestError
from litecdc.results import Statement as S
from litecdc.store import Store


def wait_for(condition: Callable[[], object], timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - started


class Cluster:
    """Three nodes n1..n3 of one cluster; a node can be stopped and started again."""

    def __init__(self, base: Path, etcd: EtcdCluster, name: str) -> None:
        self.base, self.name = base, name
        self.settings = EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)
        self.stores: dict[str, Store] = {}
        self.nodes: dict[str, ClusterNode] = {}
        for i in (1, 2, 3):
            self.start(f"n{i}")

    def start(self, node_id: str) -> ClusterNode:
        store = Store(NodeConfig(data_dir=self.base / node_id))
        self.stores[node_id] = store
        node = ClusterNode(
            store, node_id, f"http://127.0.0.1:400{node_id[-1]}", self.settings, self.name
        )
        self.nodes[node_id] = node
        return node

    def stop(self, node_id: str) -> None:
        self.nodes.pop(node_id).close()
        self.stores.pop(node_id).close()

    def leader(self, timeout: float = 10) -> ClusterNode:
        wait_for(lambda: sum(n.is_leader() for n in self.nodes.values()) == 1, timeout)
        (leader,) = [n for n in self.nodes.values() if n.is_leader()]
        return leader

    def followers(self) -> list[ClusterNode]:
        return [n for n in self.nodes.values() if not n.is_leader()]

    def converged(self, timeout: float = 10) -> int:
        """Wait until every node has applied the leader's last cid; returns it."""
        last = self.leader().journal.last_cid()
        wait_for(lambda: all(n.journal.last_cid() >= last for n in self.nodes.values()), timeout)
        return last

    def close(self) -> None:
        for node_id in list(self.nodes):
            self.stop(node_id)


@pytest.fixture
def cluster(tmp_path: Path, etcd: EtcdCluster, cluster_name: str) -> Iterator[Cluster]:
    made = Cluster(tmp_path, etcd, cluster_name)
    yield made
    made.close()


def snapshot(store: Store) -> tuple[object, ...]:
    """What must be identical on every node: tables, journal, captured changes."""
    tables = store.query([S("SELECT name FROM sqlite_schema WHERE name = 't'")])[0].rows
    rows = store.query([S("SELECT * FROM t ORDER BY id")])[0].rows if tables else None
    return rows, store.journal_page(0, 10_000).entries, store.changes(0, 10_000)


def test_writes_on_the_leader_apply_identically_on_all_three(cluster: Cluster) -> None:
    leader = cluster.leader()
    assert leader.status()["mode"] == "leader"
    created = leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v, r, ts)")])
    assert created.cid == created.log_cid and created.revision > 0
    outcome = leader.execute(
        [
            S("INSERT INTO t(v, r, ts) VALUES(?, random(), CURRENT_TIMESTAMP)", (1.5,)),
            S("INSERT INTO t(v, r, ts) VALUES(?, randomblob(8), 'x')", ("a'b",)),
            S("INSERT INTO t(id) VALUES(1)"),  # fails alone: duplicate id
        ]
    )
    assert [r.error for r in outcome.results] == [None, None, "UNIQUE constraint failed: t.id"]
    assert outcome.cid == created.cid + 1 and outcome.revision > created.revision
    failed = leader.execute([S("INSERT INTO missing VALUES(1)")], transaction=True)
    assert failed.cid is None and failed.log_cid == outcome.cid + 1  # the empty entry
    cluster.converged()
    states = [snapshot(s) for s in cluster.stores.values()]
    assert states[0] == states[1] == states[2]
    assert states[0][0] is not None and len(states[0][0]) == 2  # type: ignore[arg-type]
    revisions = {n.apply_loop.applied_revision() for n in cluster.nodes.values()}
    assert revisions == {failed.revision}

    for follower in cluster.followers():
        assert follower.status()["mode"] == "follower"
        with pytest.raises(NotLeaderError) as raised:
            follower.execute([S("INSERT INTO t(v) VALUES(2)")])
        assert raised.value.leader_id == leader.node_id
        assert raised.value.leader_address == leader.address
        assert follower.leader() == (leader.node_id, leader.address)
        status = follower.status()
        assert status["leader"] == {"id": leader.node_id, "address": leader.address}
        assert status["applied_cid"] == failed.log_cid
        assert status["applied_revision"] == failed.revision
    wait_for(lambda: len(leader.members()) == 3, 5)
    wait_for(
        lambda: {m.applied_cid for m in leader.members()} == {failed.log_cid}, 5
    )  # updated every couple of seconds
    assert [m.node_id for m in leader.members()] == ["n1", "n2", "n3"]


def test_a_write_that_never_ends_fails_alike_everywhere_and_the_cluster_goes_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Security QA: such an entry stopped every node's apply loop for good (restarts ran
    it again). The step limit (lowered here to a million steps) fails it on every node at
    the same step, as any failing statement."""
    monkeypatch.setattr(engine_module, "_WRITE_LIMIT_CHECKS", 100)
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE e(v)")])
    endless = (
        "INSERT INTO e(v) SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
        "SELECT x + 1 FROM c) SELECT x FROM c) WHERE x < 0"
    )
    stopped = leader.execute([S(endless)])
    assert stopped.cid is None and stopped.results[0].error == WRITE_LIMIT_ERROR
    after = leader.execute([S("INSERT INTO e VALUES(1)")])
    assert after.cid == stopped.log_cid + 1
    cluster.converged()
    states = [snapshot(s) for s in cluster.stores.values()]
    rows = [s.query([S("SELECT v FROM e")])[0].rows for s in cluster.stores.values()]
    assert rows == [[(1,)]] * 3
    assert states[0][1:] == states[1][1:] == states[2][1:]  # journals and changes


def test_concurrent_writers_share_etcd_txns(cluster: Cluster, client: EtcdClient) -> None:
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, writer, n)")])
    errors: list[BaseException] = []
    cids: list[int] = []

    def writer(w: int) -> None:
        try:
            for n in range(15):
                outcome = leader.execute([S("INSERT INTO t(writer, n) VALUES(?, ?)", (w, n))])
                assert outcome.cid is not None
                cids.append(outcome.cid)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(cids)) == 16 * 15
    kvs = client.range(log_prefix(cluster.name), prefix=True).kvs
    assert len(kvs) == 16 * 15 + 1
    txns = len({kv.mod_revision for kv in kvs})
    assert txns < len(kvs)  # group commit: concurrent entries shared etcd txns
    assert leader.appender.txns == txns and leader.appender.entries == len(kvs)
    cluster.converged()
    states = [snapshot(s) for s in cluster.stores.values()]
    assert states[0] == states[1] == states[2]


def test_a_new_leader_takes_over_without_losing_acknowledged_writes(
    cluster: Cluster, client: EtcdClient
) -> None:
    old = cluster.leader()
    old.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    acknowledged = [old.execute([S("INSERT INTO t(v) VALUES(?)", (i,))]).cid for i in range(20)]
    old_id, old_fence = old.node_id, old.election.fence_revision
    cluster.stop(old_id)  # resigns: revokes the lease, so no TTL to wait out
    kv = client.get(leader_key(cluster.name))
    assert kv is None or kv.create_revision != old_fence
    wait_for(lambda: any(n.is_leader() for n in cluster.nodes.values()), 30)
    new = cluster.leader()
    assert new.node_id != old_id
    outcome = new.execute([S("INSERT INTO t(v) VALUES('after')")])
    assert outcome.cid == max(c for c in acknowledged if c) + 1
    cluster.converged()
    for store in cluster.stores.values():
        rows = store.query([S("SELECT v FROM t ORDER BY id")])[0].rows
        assert rows == [(i,) for i in range(20)] + [("after",)]
    # the old node comes back as a follower and catches up
    back = cluster.start(old_id)
    cluster.converged()
    assert not back.is_leader() and back.journal.last_cid() == outcome.cid


def test_a_leader_that_lost_its_lease_cannot_append(cluster: Cluster, client: EtcdClient) -> None:
    old = cluster.leader()
    old.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    kv = client.get(leader_key(cluster.name))
    assert kv is not None
    # Freeze the old leader's election thread (as a paused process would be) so it goes on
    # believing it leads: it can only learn otherwise from its guarded append.
    with old.election._notify_lock:
        client.revoke_lease(kv.lease)
        others = [n for n in cluster.nodes.values() if n is not old]
        wait_for(lambda: any(n.election.is_leader() for n in others), 5)
        assert old.is_leader()  # still believes it, until its lease's local deadline
        with pytest.raises(NotLeaderError):
            old.execute([S("INSERT INTO t(v) VALUES('from the old leader')")])
        assert old.appender.fenced == 1
    wait_for(lambda: not old.is_leader() and old.journal.mode.value == "follower", 5)
    new = cluster.leader()
    assert new is not old
    new.execute([S("INSERT INTO t(v) VALUES('from the new leader')")])
    cluster.converged()
    for store in cluster.stores.values():
        assert store.query([S("SELECT v FROM t")])[0].rows == [("from the new leader",)]


def test_a_restarted_node_applies_only_what_it_missed(cluster: Cluster) -> None:
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, n)")])
    leader.execute([S("INSERT INTO t VALUES(1, 0)")])
    for _ in range(5):
        leader.execute([S("UPDATE t SET n = n + 1")])
    cluster.converged()
    follower = cluster.followers()[0]
    node_id = follower.node_id
    revision = follower.apply_loop.applied_revision()
    cluster.stop(node_id)
    for _ in range(7):
        leader.execute([S("UPDATE t SET n = n + 1")])
    restarted = cluster.start(node_id)
    assert restarted.apply_loop.applied_revision() == revision  # from its SQLite file
    cluster.converged()
    assert restarted.apply_loop.applied == 7  # nothing applied twice
    for store in cluster.stores.values():
        assert store.query([S("SELECT n FROM t")])[0].rows == [(12,)]
    states = [snapshot(s) for s in cluster.stores.values()]
    assert states[0] == states[1] == states[2]


def test_internal_entries_go_through_the_log(cluster: Cluster) -> None:
    leader = cluster.leader()
    heard: list[bool] = []
    leader.add_listener(heard.append)
    assert heard == [True]
    leader.write_internal(CREATE_CDC_STATE)
    leader.write_internal(high_watermark_sql(7))
    cluster.converged()
    for store in cluster.stores.values():
        assert store.cdc_high_watermark() == 7
        assert store.journal_page(1, 10).entries[-1].internal
    follower = cluster.followers()[0]
    with pytest.raises(NotLeaderError) as raised:
        follower.write_internal(high_watermark_sql(8))
    assert raised.value.leader_id == leader.node_id


def test_a_write_too_large_for_the_log_is_refused_even_when_its_append_is_ambiguous(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a write too large for etcd goes to the log as the empty entry for its cid;
    when that append's outcome stayed unknown, the write waited for "its" results and got
    the empty entry's — a success with no results — and its own expectation was never
    forgotten. The lost answers are simulated: etcd applies the first attempt, and no
    answer comes back."""
    leader = cluster.leader()
    leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    with pytest.raises(RequestError, match="too large for the cluster's log"):
        leader.execute([S("INSERT INTO t VALUES(1, ?)", ("x" * 2_000_000,))])
    assert not leader.apply_loop._expected  # (nothing kept for the refused write)

    real_txn = leader.client.txn
    sent: list[bool] = []

    def txn_whose_answers_are_lost(*args: object, **kwargs: object) -> object:
        if not sent:
            sent.append(real_txn(*args, **kwargs).succeeded)  # type: ignore[arg-type]
        raise EtcdUnavailableError("txn: etcd did not answer (simulated)")

    monkeypatch.setattr(leader.appender, "ambiguous_timeout", 0.5)
    monkeypatch.setattr(leader.client, "txn", txn_whose_answers_are_lost)
    with pytest.raises(RequestError, match="too large for the cluster's log"):
        leader.execute([S("INSERT INTO t VALUES(2, ?)", ("y" * 2_000_000,))])
    assert sent == [True]  # the empty entry is in the log
    assert not leader.apply_loop._expected


def test_a_failed_take_over_retried_successfully_leaves_no_error_in_status(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Fault injection: the first opening of the log appender fails (nothing real fails
    # that way on demand); the control loop retries the take-over, which then succeeds.
    failures = [RuntimeError("injected: appender would not open")]
    real_open = LogAppender.open

    def open_once_failing(self: LogAppender, fence_revision: int, next_cid: int) -> None:
        if failures:
            raise failures.pop()
        real_open(self, fence_revision, next_cid)

    monkeypatch.setattr(LogAppender, "open", open_once_failing)
    store = Store(NodeConfig(data_dir=tmp_path / "n1"))
    settings = EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)
    node = ClusterNode(store, "n1", "http://127.0.0.1:4001", settings, cluster_name)
    try:
        wait_for(node.is_leader, 20)
        assert not failures  # the injected failure happened
        assert node.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY)")]).cid is not None
        status = node.status()
        assert status["last_error"] is None, status
    finally:
        node.close()
        store.close()


def test_a_second_node_with_a_taken_node_id_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    cluster.leader()
    wait_for(lambda: len(cluster.nodes["n2"].members()) == 3, 10)
    store = Store(NodeConfig(data_dir=tmp_path / "dup"))
    try:
        with pytest.raises(ConfigError, match="node id 'n2' is in use by a running node at"):
            ClusterNode(store, "n2", "http://127.0.0.1:4999", cluster.settings, cluster.name)
    finally:
        store.close()
    # the real n2 is undisturbed
    assert [m.address for m in cluster.nodes["n1"].members() if m.node_id == "n2"] == [
        "http://127.0.0.1:4002"
    ]


def test_a_second_node_with_a_running_nodes_id_and_address_or_its_address_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Cluster QA: a process started with a running node's --node-id and URL took its
    record unchallenged (its address matched, taken for the node's own crashed record),
    and one with another node's URL too; either could lead, and every write forwarded to
    it failed."""
    cluster.leader()
    wait_for(lambda: len(cluster.nodes["n2"].members()) == 3, 10)
    for node_id, address, refusal in (
        ("n2", "http://127.0.0.1:4002", "node id 'n2' is in use by a running node at"),
        ("n4", "http://127.0.0.1:4003", "is the address of running node 'n3'"),
    ):
        store = Store(NodeConfig(data_dir=tmp_path / f"dup-{node_id}"))
        try:
            with pytest.raises(ConfigError, match=refusal):
                ClusterNode(store, node_id, address, cluster.settings, cluster.name)
        finally:
            store.close()
    members = {m.node_id: m.address for m in cluster.nodes["n1"].members()}
    assert members == {f"n{i}": f"http://127.0.0.1:400{i}" for i in (1, 2, 3)}


def test_a_node_restarted_takes_its_own_record_back_without_waiting(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its last process's record (same id and address, the lease still running) is told
    from another process's by the instance this data directory remembers: no record is
    suspect, so the start does not wait to see it rewritten. Another directory given the
    same id and address is suspect."""
    settings = EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)
    suspects: list[list[str]] = []
    real = ClusterNode._records_of_others

    def recorded(self: ClusterNode, previous: int | None) -> list[Any]:
        found = real(self, previous)
        suspects.append([kv.key for kv in found])
        return found

    monkeypatch.setattr(ClusterNode, "_records_of_others", recorded)
    store = Store(NodeConfig(data_dir=tmp_path / "n1"))
    node = ClusterNode(store, "n1", "http://127.0.0.1:4001", settings, cluster_name)
    wait_for(node.is_leader, 20)
    # every stop here a crash, as kill -9 leaves it (simulated in-process): the lease is
    # not revoked, and the member record stays until the lease ends
    monkeypatch.setattr(type(node.client), "revoke_lease", lambda *_, **__: None)
    node.close()
    store.close()
    for directory in ("n1", "other"):
        suspects.clear()
        store = Store(NodeConfig(data_dir=tmp_path / directory))
        try:
            ClusterNode(store, "n1", "http://127.0.0.1:4001", settings, cluster_name).close()
        finally:
            store.close()
        if directory == "n1":
            assert suspects == [[]]
        else:  # (the record is not rewritten: it is taken as a crashed process's)
            assert suspects[0] and suspects[0][0].endswith("/n1"), suspects


def test_a_node_with_another_foreign_keys_setting_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Foreign keys enforced on some nodes only: a write the leader commits failed on
    the follower and was recorded empty there (cluster QA)."""
    cluster.leader()
    store = Store(NodeConfig(data_dir=tmp_path / "fk", foreign_keys=True))
    try:
        with pytest.raises(ConfigError, match="runs without --fk; every node must do the same"):
            ClusterNode(store, "n4", "http://127.0.0.1:4004", cluster.settings, cluster.name)
    finally:
        store.close()


def test_a_data_directory_stays_with_its_cluster(tmp_path: Path, etcd: EtcdCluster) -> None:
    """Started with another --cluster (a typo), a node's data directory used to lead a
    new log of its own and fork the data (cluster QA)."""
    from litecdc.node import Node

    def config(cluster: str) -> NodeConfig:
        return NodeConfig(
            data_dir=tmp_path / "n1",
            etcd_endpoints=tuple(etcd.endpoints),
            cluster=cluster,
            node_id="n1",
        )

    Node(config("shop")).close()
    with pytest.raises(
        ConfigError, match=r"belongs to cluster 'shop'.*start it with --cluster shop"
    ):
        Node(config("shopp"))
    Node(config("shop")).close()  # and it still opens for its own cluster


def test_a_refused_node_does_not_tie_its_data_directory_to_the_cluster(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str
) -> None:
    """A node refused at start-up (here: --fk unlike the cluster's) left DATA_DIR/cluster
    behind (docs check), so the directory could join no other cluster afterwards."""
    from litecdc.node import CLUSTER_FILE, Node

    def config(name: str, data_dir: str, fk: bool) -> NodeConfig:
        return NodeConfig(
            data_dir=tmp_path / data_dir,
            etcd_endpoints=tuple(etcd.endpoints),
            cluster=name,
            node_id="n1",
            foreign_keys=fk,
        )

    Node(config(cluster_name, "first", fk=False)).close()
    with pytest.raises(ConfigError, match="runs without --fk"):
        Node(config(cluster_name, "refused", fk=True))
    # a new directory: the refused start leaves nothing (it left an empty db.sqlite)
    assert not (tmp_path / "refused").exists()
    (tmp_path / "refused").mkdir()
    with pytest.raises(ConfigError, match="runs without --fk"):
        Node(config(cluster_name, "refused", fk=True))
    assert list((tmp_path / "refused").iterdir()) == []  # an empty one stays empty
    Node(config(cluster_name + "-other", "refused", fk=True)).close()
    assert (tmp_path / "refused" / CLUSTER_FILE).read_text() == f"{cluster_name}-other\n"


def test_a_standalone_directory_refused_by_one_cluster_or_detached_founds_another(
    tmp_path: Path, etcd: EtcdCluster, cluster_name: str
) -> None:
    """Config QA: a standalone directory with data, refused by a running cluster (data
    from elsewhere), kept that cluster's identity — changed by a refused start — and was
    then refused by every other cluster ("etcd went back in time"); so was a member's
    directory detached as docs/cluster.md says (DATA_DIR/cluster deleted)."""
    from litecdc.cluster.log import CLUSTER_IDENTITY
    from litecdc.node import CLUSTER_FILE, Node

    def config(data_dir: str, cluster: str | None = None, node_id: str = "n1") -> NodeConfig:
        if cluster is None:
            return NodeConfig(data_dir=tmp_path / data_dir)
        return NodeConfig(
            data_dir=tmp_path / data_dir,
            etcd_endpoints=tuple(etcd.endpoints),
            cluster=cluster,
            node_id=node_id,
        )

    Node(config("founder", cluster_name)).close()
    standalone = Node(config("standalone"))
    standalone.store.execute([S("CREATE TABLE t(v)"), S("INSERT INTO t VALUES(1)")])
    standalone.close()
    database = tmp_path / "standalone" / "db.sqlite"
    before = database.read_bytes()
    with pytest.raises(ConfigError, match="already holds data"):
        Node(config("standalone", cluster_name, node_id="n2"))
    assert database.read_bytes() == before  # the refused start changed nothing
    founded = Node(config("standalone", cluster_name + "-own", node_id="n2"))
    try:
        assert founded.store.engine.node_state(CLUSTER_IDENTITY) is not None
        (result,) = founded.store.query([S("SELECT v FROM t")], level="none")
        assert result.rows == [(1,)]  # the founder keeps its data
    finally:
        founded.close()

    (tmp_path / "founder" / CLUSTER_FILE).unlink()  # detached
    Node(config("founder")).close()  # standalone now
    Node(config("founder", cluster_name + "-next")).close()  # and founds another

    # config QA: on a new etcd — its revision below the one the directory applied on the
    # old one — the node took that for etcd having lost data, and never led
    from litecdc.journal.journal import APPLIED_REVISION

    old = Node(config("moving", cluster_name + "-old"))
    try:
        assert old.cluster is not None
        wait_for(old.cluster.is_leader, 30)
        old.store.execute([S("CREATE TABLE m(v)")])
        for i in range(30):  # (the old etcd's revision well past a new one's)
            old.store.execute([S("INSERT INTO m VALUES(?)", (i,))])
        assert (old.store.engine.node_state(APPLIED_REVISION) or 0) > 30
    finally:
        old.close()
    (tmp_path / "moving" / CLUSTER_FILE).unlink()
    with EtcdCluster(tmp_path / "new-etcd", size=1) as fresh:
        moved = Node(
            NodeConfig(
                data_dir=tmp_path / "moving",
                etcd_endpoints=tuple(fresh.endpoints),
                cluster=cluster_name + "-new",
                node_id="n1",
            )
        )
        try:
            assert moved.cluster is not None
            wait_for(moved.cluster.is_leader, 30)
            assert moved.cluster.apply_problem() is None
        finally:
            moved.close()


def test_a_crashed_nodes_record_does_not_keep_its_id_from_restarting_elsewhere(
    cluster: Cluster, tmp_path: Path, client: EtcdClient
) -> None:
    """A record its owner no longer rewrites (kill -9, then a restart at another
    address) only waits for its lease: the restarted node takes the id at once."""
    from litecdc.cluster.node import members_prefix

    # a crashed n9's record: nobody keeps it up. Its lease outlives the test's time
    # limit: a node waiting for it to expire fails the test instead of passing late.
    lease = client.grant_lease(3600).id
    client.put(
        members_prefix(cluster.name) + "n9",
        b'{"id": "n9", "address": "http://127.0.0.1:4009"}',
        lease=lease,
    )
    store = Store(NodeConfig(data_dir=tmp_path / "n9"))
    node = ClusterNode(store, "n9", "http://127.0.0.1:4019", cluster.settings, cluster.name)
    try:
        wait_for(
            lambda: any(m.address.endswith(":4019") for m in node.members() if m.node_id == "n9"),
            10,
        )
    finally:
        node.close()
        store.close()


def test_a_node_with_a_webhook_in_a_cluster_without_one_is_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The leader writes the pruning of the change log: a leader without the webhook
    would prune changes the others still have to send (review)."""
    from litecdc.cdc import parse_cdc_config

    cluster.leader()
    store = Store(NodeConfig(data_dir=tmp_path / "cdc", cdc=parse_cdc_config("stdout")))
    try:
        with pytest.raises(ConfigError, match="runs without --cdc-config; every node must do"):
            ClusterNode(store, "n5", "http://127.0.0.1:4005", cluster.settings, cluster.name)
    finally:
        store.close()


def test_nodes_sending_changes_elsewhere_are_refused(
    etcd: EtcdCluster, cluster_name: str, tmp_path: Path
) -> None:
    """Cluster QA: a node whose --cdc-config named another endpoint (and format) joined
    silently; after a failover it delivered there, and its high watermark pruned the
    changes the first webhook never got. Batching, retries and TLS files may differ."""
    from litecdc.cdc import parse_cdc_config

    def cdc_file(name: str, doc: dict[str, object]) -> str:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        return str(path)

    first = {"endpoint": "http://u:pw@127.0.0.1:9/hook", "format": "rqlite"}
    configs = {
        "n1": first,
        "n2": {**first, "max_batch_size": 3, "transmit_timeout": "2s"},  # tuning: fine
        "n3": {**first, "endpoint": "http://127.0.0.1:9/other", "format": "debezium"},
        "n4": {**first, "hmac_secret": "whsec_" + "A" * 32},
        "n5": {**first, "endpoint": "http://u:other@127.0.0.1:9/hook"},
        "n6": {**first, "headers": {"X-Tenant": "b"}},
    }
    settings = EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)
    stores, nodes = [], []
    try:
        for node_id, doc in configs.items():
            store = Store(
                NodeConfig(
                    data_dir=tmp_path / node_id, cdc=parse_cdc_config(cdc_file(node_id, doc))
                )
            )
            stores.append(store)
            address = f"http://127.0.0.1:400{node_id[-1]}"
            if node_id in ("n1", "n2"):
                nodes.append(ClusterNode(store, node_id, address, settings, cluster_name))
                continue
            with pytest.raises(ConfigError) as refused:
                ClusterNode(store, node_id, address, settings, cluster_name)
            message = str(refused.value)
            assert message.startswith(
                f"cluster {cluster_name!r} sends its changes to http://127.0.0.1:9/hook, "
                "format rqlite; this node's --cdc-config sends them "
            )
            if node_id != "n3":  # (QA: the same place was shown twice, as if the same)
                assert "there with other URL credentials, headers or hmac_secret" in message
            assert "pw" not in message and "other@" not in message
    finally:
        for node in nodes:
            node.close()
        for store in stores:
            store.close()


@pytest.mark.slow
def test_an_etcd_that_lost_its_data_is_noticed_and_no_node_leads(
    tmp_path: Path, cluster_name: str
) -> None:
    """Cluster QA: etcd wiped under a running cluster (kill -9, data directory deleted,
    started empty). A node led the empty log, writes were answered 'in the log, it will be
    applied: do not retry' at revisions the nodes' watches had passed — never applied —
    then every node stopped on them. etcd's revision never decreases: one below what a
    node applied means etcd lost data, and no node may lead its log."""
    import shutil

    with EtcdCluster(tmp_path / "etcd", size=1) as etcd:
        cluster = Cluster(tmp_path, etcd, cluster_name)
        try:
            leader = cluster.leader()
            leader.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
            for i in range(30):  # past the revisions a new etcd starts at
                leader.execute([S("INSERT INTO t(v) VALUES(?)", (i,))])
            cluster.converged()
            (member,) = etcd.members
            member.kill()
            shutil.rmtree(member.data_dir)
            member.start()
            member.wait_healthy()

            def noticed() -> bool:
                problems = [n.apply_problem() or "" for n in cluster.nodes.values()]
                return all(p.startswith("etcd went back in time") for p in problems)

            wait_for(noticed, 60)
            wait_for(lambda: not any(n.is_leader() for n in cluster.nodes.values()), 30)
            problem = cluster.nodes["n1"].apply_problem()
            assert problem is not None and "etcd lost the cluster's data" in problem
            # QA: other writers to that etcd brought its revision past the nodes' again,
            # and a lagging node then led the empty log alone: the identity says no
            with EtcdClient(EtcdSettings(endpoints=etcd.endpoints)) as other:
                for i in range(60):
                    other.put(f"/unrelated/{i}", b"x")
            cluster.stop("n3")
            with pytest.raises(ConfigError, match="etcd lost the cluster's data"):
                cluster.start("n3")  # a restarted node does not found a new cluster there
            cluster.stores.pop("n3").close()
            assert all(n.why_not_lead() is not None for n in cluster.nodes.values())
            assert not any(n.is_leader() for n in cluster.nodes.values())
        finally:
            cluster.close()
