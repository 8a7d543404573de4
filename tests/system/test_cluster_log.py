"""The etcd log against real etcd: group commit, fencing, ambiguous appends, apply loop.

The leader key is held by the test itself here (no election), so the fence can be
replaced at will; test_cluster_node.py runs the same parts inside ClusterNodes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from etcd_cluster import EtcdCluster

from litecdc.cluster import (
    ApplyLoop,
    EtcdClient,
    EtcdSettings,
    EtcdUnavailableError,
    LogAppender,
    NotLeaderError,
    Put,
    leader_key,
    log_key,
    log_prefix,
)
from litecdc.config import NodeConfig
from litecdc.errors import RequestError
from litecdc.journal.journal import Mode
from litecdc.results import LogEntry
from litecdc.results import Statement as S
from litecdc.store import Store


def wait_for(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(0.02)


class Fixture:
    """A leader store with an appender and an apply loop, and a follower store with its loop."""

    def __init__(self, tmp_path: Path, client: EtcdClient, cluster: str) -> None:
        self.client = client
        self.cluster = cluster
        self.stores = [Store(NodeConfig(data_dir=tmp_path / f"n{i}")) for i in range(2)]
        self.leader, self.follower = self.stores
        self.leader.journal.set_mode(Mode.LEADER)
        self.follower.journal.set_mode(Mode.FOLLOWER)
        self.step_downs: list[str] = []
        self.fence = self.take_leader_key()
        self.appender = LogAppender(
            client, self.leader.journal, cluster, step_down=self.step_downs.append
        ).start()
        self.appender.open(self.fence, self.leader.journal.last_cid() + 1)
        self.loops = [ApplyLoop(client, s.journal, cluster).start() for s in self.stores]

    def take_leader_key(self) -> int:
        key = leader_key(self.cluster)
        self.client.delete(key)
        return self.client.put(key, b'{"id": "test"}')

    def submit(self, statements: list[S], *, transaction: bool = False) -> tuple[LogEntry, int]:
        loop = self.loops[0]

        def prepare() -> LogEntry:
            entry = self.leader.journal.prepare_entry(statements, transaction=transaction)
            loop.expect(entry)
            return entry

        submission = self.appender.submit(prepare)
        return submission.entry, submission.result(10)

    def close(self) -> None:
        self.appender.close()
        for loop in self.loops:
            loop.close()
        for store in self.stores:
            store.close()


@pytest.fixture
def log(tmp_path: Path, client: EtcdClient, cluster_name: str) -> Iterator[Fixture]:
    made = Fixture(tmp_path, client, cluster_name)
    yield made
    made.close()


def test_entries_are_appended_in_group_commits_and_applied_identically(log: Fixture) -> None:
    entry, revision = log.submit([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v, r)")])
    outcome = log.loops[0].wait_applied(entry, 5)
    assert outcome is not None and outcome.cid == entry.cid == 2
    assert (outcome.log_cid, outcome.revision) == (2, revision)

    def prepare(i: int) -> LogEntry:
        e = log.leader.journal.prepare_entry([S("INSERT INTO t(v, r) VALUES(?, random())", (i,))])
        log.loops[0].expect(e)
        return e

    # queued while earlier txns are in flight: many entries share one txn
    submissions = [log.appender.submit(lambda i=i: prepare(i)) for i in range(300)]
    revisions = [s.result(10) for s in submissions]
    assert log.appender.entries == 301
    assert log.appender.txns < 301 / 4
    assert revisions == sorted(revisions)
    per_revision: dict[int, int] = {}
    for r in revisions:
        per_revision[r] = per_revision.get(r, 0) + 1
    assert max(per_revision.values()) <= 127  # etcd's 128 compares: fence + one per key

    last = submissions[-1].entry.cid
    results = [log.loops[0].wait_applied(s.entry, 5) for s in submissions]
    assert [r.results[0].last_insert_id for r in results if r] == list(range(1, 301))
    wait_for(lambda: all(s.journal.last_cid() == last for s in log.stores), 10)
    kvs = log.client.range(log_prefix(log.cluster), prefix=True).kvs
    assert [kv.key for kv in kvs] == [log_key(log.cluster, cid) for cid in range(2, last + 1)]
    for store in log.stores:
        assert store.journal.applied_revision() == revisions[-1]
    rows = [s.query([S("SELECT * FROM t ORDER BY id")])[0].rows for s in log.stores]
    assert rows[0] == rows[1] and rows[0] is not None and len(rows[0]) == 300
    assert log.leader.changes(0, 1000) == log.follower.changes(0, 1000)
    assert log.leader.journal_page(0, 1000) == log.follower.journal_page(0, 1000)
    assert log.step_downs == []


def test_a_deposed_leaders_append_fails_and_it_steps_down(log: Fixture) -> None:
    entry, _ = log.submit([S("CREATE TABLE t(x)")])
    new_fence = log.take_leader_key()  # another leader now holds the key
    assert new_fence > log.fence
    submission = log.appender.submit(
        lambda: log.leader.journal.prepare_entry([S("INSERT INTO t VALUES(1)")])
    )
    with pytest.raises(NotLeaderError, match="created again"):
        submission.result(5)
    wait_for(lambda: len(log.step_downs) == 1, 5)  # (right after the submission fails)
    assert log.appender.fenced == 1
    assert log.client.get(log_key(log.cluster, submission.entry.cid)) is None
    with pytest.raises(NotLeaderError):  # closed until opened again with a fence
        log.appender.submit(lambda: log.leader.journal.prepare_entry([S("SELECT 1")]))
    # allocations were forgotten: the next term starts right after what the log holds
    wait_for(lambda: log.leader.journal.last_cid() == entry.cid, 5)
    log.appender.open(new_fence, log.leader.journal.last_cid() + 1)
    again, _ = log.submit([S("INSERT INTO t VALUES(2)")])
    assert again.cid == submission.entry.cid


def test_an_ambiguous_append_is_sent_again_and_recognised(
    log: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_txn = log.client.txn
    calls: list[bool] = []

    def txn_whose_answer_is_lost(*args: object, **kwargs: object) -> object:
        result = real_txn(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(result.succeeded)
        if len(calls) == 1:
            raise EtcdUnavailableError("txn: deadline exceeded (simulated)")
        return result

    monkeypatch.setattr(log.client, "txn", txn_whose_answer_is_lost)
    entry, revision = log.submit([S("CREATE TABLE t(x)")])
    assert calls == [True, False]  # applied once; the second attempt's guard failed
    kv = log.client.get(log_key(log.cluster, entry.cid))
    assert kv is not None and kv.mod_revision == revision
    assert log.step_downs == [] and log.appender.entries == 1


def test_an_old_terms_append_that_fails_late_leaves_the_new_term_leading(
    log: Fixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cluster QA: with one etcd member paused, a txn of the node's previous term timed
    out after the node had begun its next term; its failure then deposed that new term
    (its fence cleared, its queued writes failed, its lease revoked): 10 s of failed
    writes. The paused member is simulated by a txn that hangs, then fails as a
    deadline does."""
    first, _ = log.submit([S("CREATE TABLE t(x)")])
    wait_for(lambda: log.leader.journal.last_cid() == first.cid, 5)
    real_txn = log.client.txn
    stuck = threading.Event()
    release = threading.Event()

    def txn_to_a_paused_member(*args: object, **kwargs: object) -> object:
        if not release.is_set():
            stuck.set()
            release.wait(10)
            raise EtcdUnavailableError("txn: etcd did not answer (DEADLINE_EXCEEDED)")
        return real_txn(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log.client, "txn", txn_to_a_paused_member)
    old = log.appender.submit(
        lambda: log.leader.journal.prepare_entry([S("INSERT INTO t VALUES('old term')")])
    )
    assert stuck.wait(5)
    # the term ends (the lease was lost), and the node wins the next one while the old
    # term's txn is still out (its take-over caught up with the log: first is applied)
    log.appender.close_leadership("leadership lost")
    new_fence = log.take_leader_key()
    log.leader.journal.forget_allocations()
    log.appender.open(new_fence, log.leader.journal.last_cid() + 1)
    queued = log.appender.submit(
        lambda: log.leader.journal.prepare_entry([S("INSERT INTO t VALUES('new term')")])
    )
    release.set()
    with pytest.raises(EtcdUnavailableError, match="outcome of a log append is unknown"):
        old.result(10)
    assert queued.result(10) > new_fence  # appended in the new term, behind the old txn
    assert queued.entry.cid == old.entry.cid == first.cid + 1  # the old one is not in the log
    assert log.step_downs == []
    assert log.appender.accepting
    again, _ = log.submit([S("INSERT INTO t VALUES('after')")])
    assert again.cid == queued.entry.cid + 1


def test_a_full_disk_stalls_the_apply_loop_with_one_clear_line_and_it_catches_up(
    log: Fixture, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Full-disk QA: a follower whose disk was full logged a traceback every 2 s (3,300
    lines), saying nothing of what to do. SQLite's "database or disk is full" is raised
    here by the follower's journal (a real full disk: tests/e2e/test_e2e_disk_full.py)."""
    first, _ = log.submit([S("CREATE TABLE t(x)")])
    wait_for(lambda: log.follower.journal.last_cid() == first.cid, 5)
    loop = log.loops[1]
    monkeypatch.setattr(loop, "stall_retry_interval", 0.05)
    real_apply = log.follower.journal.apply_log_entry
    failures: list[int] = []

    def apply_on_a_full_disk(*args: object, **kwargs: object) -> object:
        if len(failures) < 5:
            failures.append(1)
            raise apsw.FullError("database or disk is full")
        return real_apply(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log.follower.journal, "apply_log_entry", apply_on_a_full_disk)
    caplog.set_level(logging.DEBUG, logger="litecdc.cluster")
    entry, _ = log.submit([S("INSERT INTO t VALUES(1)")])
    wait_for(lambda: log.follower.journal.last_cid() == entry.cid, 10)  # space again
    assert len(failures) == 5
    told = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in told] == [
        "applying the log failed: database or disk is full: free space on the disk of the "
        "node's data directory (or of SQLite's temporary directory); the node catches up by "
        "itself"
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_a_write_too_large_for_etcd_is_refused_and_its_cid_left_empty(log: Fixture) -> None:
    big = "x" * (2 * 1024 * 1024)
    with pytest.raises(RequestError, match="too large"):
        log.submit([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(?)", (big,))])
    entry, _ = log.submit([S("CREATE TABLE u(x)")])
    wait_for(lambda: all(s.journal.last_cid() == entry.cid for s in log.stores), 5)
    for store in log.stores:
        empty = store.journal_page(entry.cid - 2, 1).entries[0]
        assert (empty.cid, empty.query) == (entry.cid - 1, None)


def test_the_apply_loop_resumes_inside_a_group_commit_after_a_restart(
    log: Fixture, tmp_path: Path
) -> None:
    log.submit([S("CREATE TABLE t(x)")])
    log.appender.close_leadership("the test appends by hand")
    # five entries in one txn, as a group commit writes them
    entries = [
        log.leader.journal.prepare_entry([S("INSERT INTO t VALUES(?)", (i,))]) for i in range(5)
    ]
    revision = log.client.txn(
        [], [Put(log_key(log.cluster, e.cid), e.encode()) for e in entries]
    ).revision
    last = entries[-1].cid
    wait_for(lambda: log.leader.journal.last_cid() == last, 5)

    # a new follower that applied the first entries of that txn before "crashing"
    late = Store(NodeConfig(data_dir=tmp_path / "late"))
    late.journal.set_mode(Mode.FOLLOWER)
    first_kvs = log.client.range(log_prefix(log.cluster), prefix=True).kvs
    applied_by_hand = first_kvs[:3]  # CREATE TABLE + two inserts
    for kv in applied_by_hand:
        late.journal.apply_log_entry(LogEntry.decode(kv.value), revision=kv.mod_revision)
    loop = ApplyLoop(log.client, late.journal, log.cluster).start()
    try:
        wait_for(lambda: late.journal.last_cid() == last, 5)
        assert loop.applied == last - 1 - len(applied_by_hand)
        rows = late.query([S("SELECT x FROM t ORDER BY rowid")])[0].rows
        assert rows == [(i,) for i in range(5)]
        assert loop.skipped == 2  # the txn's entries this node had, delivered again
        assert late.journal.applied_revision() == revision
    finally:
        loop.close()
        late.close()


def test_an_entry_stopped_at_the_step_limit_in_a_group_commit_runs_once_per_node(
    log: Fixture, step_limit_stops: list[bool]
) -> None:
    """SQLite ends the transaction of a write stopped at the step limit (~100 s of work):
    inside a batch of entries that ended the batch, and the apply loop's fallback ran the
    statement a second time on every node. It now runs once; the entries around it apply
    as before (lowered here to a million steps)."""
    stopped = step_limit_stops
    log.submit([S("CREATE TABLE e(v)")])
    log.appender.close_leadership("the test appends by hand")
    endless = (
        "INSERT INTO e(v) SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
        "SELECT x + 1 FROM c) SELECT x FROM c) WHERE x < 0"
    )
    requests = [
        [S("INSERT INTO e VALUES(1)")],
        [S("INSERT INTO e VALUES(2)")],
        [S(endless)],
        [S("INSERT INTO e VALUES(3)")],
        [S("INSERT INTO e VALUES(4)")],
    ]
    entries = [log.leader.journal.prepare_entry(r) for r in requests]
    log.client.txn([], [Put(log_key(log.cluster, e.cid), e.encode()) for e in entries])
    last = entries[-1].cid
    wait_for(lambda: all(s.journal.last_cid() == last for s in log.stores), 10)
    assert len(stopped) == len(log.stores)  # once on each node
    for store in log.stores:
        assert store.query([S("SELECT v FROM e ORDER BY v")])[0].rows == [(1,), (2,), (3,), (4,)]
        page = store.journal_page(entries[0].cid - 1, 10).entries
        assert [e.query is None for e in page] == [False, False, True, False, False]
    assert log.leader.changes(0, 100) == log.follower.changes(0, 100)
    assert log.leader.journal_page(0, 100) == log.follower.journal_page(0, 100)


def test_a_catch_up_through_a_thousand_entries_that_end_their_batch_does_not_recurse(
    log: Fixture, tmp_path: Path
) -> None:
    """Cluster QA: each entry whose statement ended the batch's transaction took one more
    level of recursion in the apply loop; a follower catching up through ~1,000 of them in
    one watch response hit Python's recursion limit, stalling again and again."""
    log.submit([S("CREATE TABLE u(v UNIQUE ON CONFLICT ROLLBACK)")])
    log.submit([S("INSERT INTO u VALUES(0)")])
    log.appender.close_leadership("the test appends by hand")
    collide = [S("INSERT INTO u VALUES(0)")]  # ends its transaction, every time
    entries = [
        log.leader.journal.prepare_entry(
            [S(f"INSERT INTO u VALUES({i})")] if i % 50 == 0 else collide
        )
        for i in range(1, 1201)
    ]
    for start in range(0, len(entries), 120):  # (etcd takes 128 operations a txn)
        chunk = entries[start : start + 120]
        log.client.txn([], [Put(log_key(log.cluster, e.cid), e.encode()) for e in chunk])
    last = entries[-1].cid
    wait_for(lambda: log.leader.journal.last_cid() == last, 60)
    late = Store(NodeConfig(data_dir=tmp_path / "late"))
    late.journal.set_mode(Mode.FOLLOWER)
    loop = ApplyLoop(log.client, late.journal, log.cluster).start()
    try:
        wait_for(lambda: late.journal.last_cid() == last or loop.last_error is not None, 120)
        assert loop.last_error is None
        assert late.journal_page(0, 2000) == log.leader.journal_page(0, 2000)
        assert late.query([S("SELECT count(*) FROM u")])[0].rows == [(25,)]
    finally:
        loop.close()
        late.close()


def test_a_compacted_position_is_reported_as_needing_a_snapshot(tmp_path: Path) -> None:
    with (
        EtcdCluster(tmp_path / "etcd", size=1) as etcd,
        EtcdClient(EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)) as client,
    ):
        revision = 0
        for cid in range(2, 7):  # the log's entries for cids 2-6, then 2 deleted: it is gone
            entry = LogEntry(cid, cid - 1, 0, 0, ("SELECT 1",))
            revision = client.put(log_key("c", cid), entry.encode())
        client.delete(log_key("c", 2))
        client.compact(revision)
        store = Store(NodeConfig(data_dir=tmp_path / "n"))
        store.journal.set_mode(Mode.FOLLOWER)
        loop = ApplyLoop(client, store.journal, "c").start()
        try:
            wait_for(lambda: loop.needs_snapshot, 5)
            assert loop.last_error is not None and "needs a snapshot" in loop.last_error
        finally:
            loop.close()
            store.close()


def test_a_reused_cid_answers_only_the_write_that_is_in_the_log(log: Fixture) -> None:
    first = log.leader.journal.prepare_entry([S("CREATE TABLE a(x)")])
    log.loops[0].expect(first)  # never appended (say its leader lost the lease) …
    log.leader.journal.forget_allocations()  # … and the cid was handed out again
    second, _ = log.submit([S("CREATE TABLE b(x)")])
    assert second.cid == first.cid
    outcome = log.loops[0].wait_applied(second, 5)
    assert outcome is not None and outcome.cid == second.cid
    with pytest.raises(NotLeaderError, match="another write"):
        log.loops[0].wait_applied(first, 5)
