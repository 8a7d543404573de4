"""Leader election against real etcd: one winner, failover, fencing, listeners."""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_cluster import EtcdCluster

from litecdc.cluster import (
    Compare,
    Election,
    EtcdClient,
    EtcdSettings,
    Put,
    leader_key,
)
from litecdc.errors import ConfigError

CANDIDATE_SCRIPT = Path(__file__).with_name("etcd_cluster.py")


class Candidate:
    """An in-process election candidate with its own client and a record of its listener."""

    def __init__(self, endpoints: list[str], cluster: str, node_id: str) -> None:
        self.client = EtcdClient(EtcdSettings(endpoints=endpoints, request_timeout=1.0))
        self.election = Election(
            self.client, cluster, node_id, f"http://127.0.0.1:400{node_id[-1]}", ttl=2
        )
        self.heard: list[bool] = []
        self.election.add_listener(self.heard.append)

    def close(self) -> None:
        self.election.close()
        self.client.close()


def wait_for(condition: object, timeout: float) -> float:
    """Seconds until ``condition()`` was true; fails after ``timeout``."""
    started = time.monotonic()
    while not condition():  # type: ignore[operator]
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - started


def leaders(candidates: list[Candidate]) -> list[Candidate]:
    return [c for c in candidates if c.election.is_leader()]


@pytest.fixture
def candidates(etcd: EtcdCluster, cluster_name: str) -> Iterator[list[Candidate]]:
    made = [Candidate(etcd.endpoints, cluster_name, f"n{i}") for i in range(1, 4)]
    yield made
    for c in made:
        c.close()


def test_one_of_three_candidates_wins_and_all_agree(
    candidates: list[Candidate], client: EtcdClient, cluster_name: str
) -> None:
    for c in candidates:
        assert c.heard == [False]  # add_listener reports the current state
        c.election.start()
    wait_for(lambda: len(leaders(candidates)) == 1, 5)
    time.sleep(1.0)  # a few keepalive rounds later: still exactly one
    (winner,) = leaders(candidates)
    assert winner.heard == [False, True]
    fence = winner.election.fence_revision
    kv = client.get(leader_key(cluster_name))
    assert kv is not None and kv.create_revision == fence
    for c in candidates:
        wait_for(lambda c=c: c.election.leader() is not None, 5)
        info = c.election.leader()
        assert info is not None
        assert (info.node_id, info.fence_revision) == (winner.election.node_id, fence)
        assert info.address == winner.election.address
        if c is not winner:
            assert c.heard == [False] and c.election.fence_revision is None


def test_resigning_leader_hands_over_at_once_and_is_fenced(
    candidates: list[Candidate], client: EtcdClient, cluster_name: str
) -> None:
    for c in candidates:
        c.election.start()
    wait_for(lambda: len(leaders(candidates)) == 1, 5)
    (old,) = leaders(candidates)
    old_fence = old.election.fence_revision
    assert old_fence is not None
    old.close()
    assert old.heard == [False, True, False]
    assert not old.election.is_leader()
    # the key went with the revoked lease: no TTL for the others to wait out
    kv = client.get(leader_key(cluster_name))
    assert kv is None or kv.create_revision != old_fence
    rest = [c for c in candidates if c is not old]
    wait_for(lambda: len(leaders(rest)) == 1, 30)
    (new,) = leaders(rest)
    assert new.election.fence_revision is not None and new.election.fence_revision > old_fence
    for c in rest:
        wait_for(lambda c=c: c.election.leader() == new.election.leader(), 3)

    # fencing: an append guarded by the old leader's create_revision fails
    log_key = f"/litecdc/{cluster_name}/log/1"
    key = leader_key(cluster_name)
    stale = client.txn([Compare.created_at(key, old_fence)], [Put(log_key, b"from old")])
    assert not stale.succeeded and client.get(log_key) is None
    fresh = client.txn(
        [Compare.created_at(key, new.election.fence_revision)], [Put(log_key, b"from new")]
    )
    assert fresh.succeeded


def test_step_down_is_immediate_and_listeners_hear_it(
    candidates: list[Candidate],
) -> None:
    c = candidates[0]
    c.election.start()
    wait_for(c.election.is_leader, 5)
    c.election.step_down("a guarded append failed")
    assert not c.election.is_leader()
    assert c.heard[:3] == [False, True, False]
    wait_for(c.election.is_leader, 5)  # nobody else campaigns: it wins again
    assert c.heard == [False, True, False, True]


def test_a_deleted_leader_key_deposes_the_leader(
    candidates: list[Candidate], client: EtcdClient, cluster_name: str
) -> None:
    a, b = candidates[0], candidates[1]
    a.election.start()
    wait_for(a.election.is_leader, 5)
    b.election.start()
    wait_for(lambda: b.election.leader() is not None, 5)
    client.delete(leader_key(cluster_name))
    wait_for(lambda: False in a.heard[2:], 3)
    wait_for(lambda: len(leaders([a, b])) == 1, 3)


def test_invalid_settings(client: EtcdClient) -> None:
    with pytest.raises(ConfigError, match="at least 2 seconds"):
        Election(client, "c", "n1", "http://x", ttl=1)
    with pytest.raises(ConfigError, match="cluster name"):
        Election(client, "a/b", "n1", "http://x")


# --- leaders in processes of their own: kill -9 and SIGSTOP ---------------------------------


class CandidateProcess:
    def __init__(self, endpoints: list[str], cluster: str, node_id: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable, str(CANDIDATE_SCRIPT), "candidate",
                "--endpoints", ",".join(endpoints), "--cluster", cluster, "--node-id", node_id,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def next_line(self, timeout: float) -> str:
        return self.lines.get(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(5)


@pytest.mark.slow
def test_kill_9_of_the_leader_process_moves_leadership(
    etcd: EtcdCluster, candidates: list[Candidate], client: EtcdClient, cluster_name: str
) -> None:
    proc = CandidateProcess(etcd.endpoints, cluster_name, "p1")
    try:
        assert proc.next_line(10) == "follower"
        line = proc.next_line(10)
        assert line.startswith("leader ")
        old_fence = int(line.split()[1])
        for c in candidates:
            c.election.start()
        wait_for(lambda: all(c.election.leader() is not None for c in candidates), 5)
        assert not leaders(candidates)
        proc.process.kill()
        wait_for(lambda: len(leaders(candidates)) == 1, 30)  # TTL 2 s, then a campaign
        stale = client.txn(
            [Compare.created_at(leader_key(cluster_name), old_fence)],
            [Put(f"/litecdc/{cluster_name}/log/1", b"x")],
        )
        assert not stale.succeeded
    finally:
        proc.close()


@pytest.mark.slow
def test_a_paused_leader_process_is_fenced_and_steps_down_on_resume(
    etcd: EtcdCluster, candidates: list[Candidate], client: EtcdClient, cluster_name: str
) -> None:
    proc = CandidateProcess(etcd.endpoints, cluster_name, "p1")
    try:
        assert proc.next_line(10) == "follower"
        old_fence = int(proc.next_line(10).split()[1])
        for c in candidates:
            c.election.start()
        proc.process.send_signal(19)  # SIGSTOP
        wait_for(lambda: len(leaders(candidates)) == 1, 6)
        stale = client.txn(
            [Compare.created_at(leader_key(cluster_name), old_fence)],
            [Put(f"/litecdc/{cluster_name}/log/1", b"x")],
        )
        assert not stale.succeeded
        proc.process.send_signal(18)  # SIGCONT
        assert proc.next_line(5) == "follower"  # it finds its lease gone and steps down
        time.sleep(0.5)
        assert len(leaders(candidates)) == 1
    finally:
        proc.close()


@pytest.mark.slow
def test_a_paused_etcd_member_moves_leadership_to_a_reachable_candidate(
    etcd3: EtcdCluster, cluster_name: str
) -> None:
    # each candidate reaches etcd through one member only: pausing a member partitions it
    made = [
        Candidate([member.endpoint], cluster_name, f"n{i}")
        for i, member in enumerate(etcd3.members, start=1)
    ]
    try:
        made[0].election.start()
        wait_for(made[0].election.is_leader, 5)
        for c in made[1:]:
            c.election.start()
        wait_for(lambda: all(c.election.leader() is not None for c in made), 5)
        etcd3.members[0].pause()

        def new_leader() -> bool:
            # a keepalive times out at TTL/3, before the lease expires (2 s, after etcd
            # elected a new raft leader): the old leader has stepped down by the time
            # another one wins — never two at once
            taken = len(leaders(made[1:])) == 1
            assert not (taken and made[0].election.is_leader())
            return taken

        wait_for(new_leader, 30)
        assert made[0].heard[-1] is False
        etcd3.members[0].resume()
        etcd3.wait_healthy()
        wait_for(lambda: made[0].election.leader() == leaders(made[1:])[0].election.leader(), 8)
        assert len(leaders(made)) == 1
    finally:
        etcd3.members[0].resume()
        for c in made:
            c.close()


@contextlib.contextmanager
def leader_and_follower(etcd: EtcdCluster, cluster_name: str) -> Iterator[Candidate]:
    """Two candidates, once one leads and the other knows it: the follower."""
    made = [Candidate(etcd.endpoints, cluster_name, f"n{i}") for i in (1, 2)]
    try:
        for c in made:
            c.election.start()
        wait_for(lambda: len(leaders(made)) == 1, 5)
        (follower,) = [c for c in made if not c.election.is_leader()]
        wait_for(lambda: follower.election.leader() is not None, 5)
        yield follower
    finally:
        for c in made:
            c.close()


def test_a_follower_knows_no_leader_while_etcd_is_down(tmp_path: Path, cluster_name: str) -> None:
    """It kept naming the last leader (and /readyz said 200) through a whole etcd outage
    (cluster QA), although no write could commit."""
    with (
        EtcdCluster(tmp_path / "etcd", size=1) as etcd,
        leader_and_follower(etcd, cluster_name) as follower,
    ):
        etcd.members[0].kill()
        wait_for(lambda: follower.election.leader() is None, 15)
        etcd.members[0].start()
        etcd.wait_healthy()
        wait_for(lambda: follower.election.leader() is not None, 20)


def test_one_failed_request_does_not_make_a_follower_forget_the_leader(
    etcd: EtcdCluster, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only etcd out of reach for a lease's time does (review: a single timed-out read
    made readyz 503 and refused forwarded writes while the leader was fine)."""
    from litecdc.cluster import EtcdUnavailableError

    with leader_and_follower(etcd, cluster_name) as follower:
        real_get = follower.client.get
        failed: list[bool] = []

        def get_failing_once(*args: object, **kwargs: object) -> object:
            if not failed:
                failed.append(True)
                raise EtcdUnavailableError("injected: one request timed out")
            return real_get(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(follower.client, "get", get_failing_once)
        seen: list[object] = []
        deadline = time.monotonic() + 5  # the watch's quiet check runs within one TTL (2 s)
        while time.monotonic() < deadline:
            seen.append(follower.election.leader())
            time.sleep(0.02)
        assert failed, "the injected failure never happened"
        assert None not in seen


def test_a_lease_given_up_but_not_revoked_is_revoked_once_etcd_answers(
    etcd: EtcdCluster, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster QA: a leader that stepped down while etcd was out of reach could not revoke
    its lease, and once etcd answered again every node waited that lease out — the key
    named a leader that no longer led, and every write was refused (about 3.5 s with a 2 s
    lease). Its lease is revoked as soon as etcd answers. The failed revoke is injected;
    the lease is a minute long, so only the revoke can end it within the wait below."""
    from litecdc.cluster import EtcdUnavailableError

    client = EtcdClient(EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0))
    election = Election(client, cluster_name, "n1", "http://127.0.0.1:4001", ttl=60)
    try:
        election.start()
        wait_for(election.is_leader, 20)
        first = election.leader()
        assert first is not None
        real_revoke = client.revoke_lease
        refused: list[int] = []

        def revoke_failing_once(lease_id: int, **kwargs: float) -> None:
            if not refused:
                refused.append(lease_id)
                # as a revoke that times out: meanwhile the election thread, woken by
                # step_down, follows the key (review: it then waited the lease out)
                time.sleep(1.0)
                raise EtcdUnavailableError("injected: etcd did not answer")
            real_revoke(lease_id, **kwargs)

        monkeypatch.setattr(client, "revoke_lease", revoke_failing_once)
        election.step_down("etcd out of reach (injected)")
        assert refused == [first.lease]
        wait_for(election.is_leader, 20)  # (60 s: the lease waited out)
        again = election.leader()
        assert again is not None and again.fence_revision != first.fence_revision
        assert client.lease_ttl(first.lease) <= 0  # revoked, not left to expire
    finally:
        election.close()
        client.close()
