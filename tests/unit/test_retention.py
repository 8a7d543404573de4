"""Retention of the change log, in process: holds, the webhook high watermark, the cap,
the leader's RetentionKeeper, and pruning as a pure function of replicated tables.

A Store in NORMAL mode writes litecdc's internal entries itself (journal.commit_internal),
which is what a standalone node does. Every pruning entry is a commit of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from litecdc.cdc.config import parse_cdc_config
from litecdc.cdc.retention import RetentionKeeper
from litecdc.config import NodeConfig
from litecdc.db.schema import CREATE_CDC_STATE, high_watermark_sql
from litecdc.errors import (
    ConfigError,
    NotFoundError,
    PositionUnavailableError,
    SnapshotUnavailableError,
)
from litecdc.journal.journal import Mode
from litecdc.results import JournalEntry, Statement
from litecdc.store import Store

StoreFactory = Callable[..., Store]


@pytest.fixture
def make_store(tmp_path: Path) -> Iterator[StoreFactory]:
    stores: list[Store] = []

    def make(name: str = "node", retention_cids: int = 5, webhook: bool = False) -> Store:
        cdc = parse_cdc_config("stdout") if webhook else None
        store = Store(NodeConfig(data_dir=tmp_path / name, retention_cids=retention_cids, cdc=cdc))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def write(store: Store, n: int, table: str = "t") -> list[int]:
    """``n`` commits, one row each; their cids."""
    store.execute(
        [Statement(f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, v BLOB)")]
    )
    cids = []
    for _ in range(n):
        outcome = store.execute([Statement(f"INSERT INTO {table}(v) VALUES (randomblob(4))")])
        assert outcome.cid is not None
        cids.append(outcome.cid)
    return cids


def head(store: Store) -> int:
    return store.subscribers().last_cid


def change_cids(store: Store) -> list[int]:
    """The cids that still have changes in the change log."""

    def read(conn: Any) -> list[int]:
        return [r[0] for r in conn.execute("SELECT DISTINCT cid FROM _litecdc_changes ORDER BY 1")]

    return store.engine.read_consistent(read)


def table_dump(store: Store, table: str) -> list[tuple[Any, ...]]:
    def read(conn: Any) -> list[tuple[Any, ...]]:
        try:
            return [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY 1")]
        except Exception:  # not created yet
            return []

    return store.engine.read_consistent(read)


def hold(store: Store, name: str) -> Any:
    return {h.name: h for h in store.subscribers().holds}[name]


# -- what prune_sql keeps -----------------------------------------------------------------
def test_without_webhook_or_holds_the_newest_commits_are_kept(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    cids = write(store, 12)
    assert change_cids(store) == cids  # nothing prunes by itself
    before = head(store)
    store.prune_changes()
    assert store.subscribers().pruned_cid == before - 5
    assert change_cids(store) == [c for c in cids if c > before - 5]
    # reads after the pruned cid are served; before it, a clear "no longer available"
    page = store.source_changes("t", before - 5, None, 100)
    assert page.count == 5
    with pytest.raises(PositionUnavailableError, match="no longer available") as info:
        store.source_changes("t", before - 6, None, 100)
    assert info.value.pruned_cid == before - 5
    with pytest.raises(PositionUnavailableError):
        store.source_position("t", 0, 100)


def test_a_hold_pins_the_change_log(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=10)
    write(store, 3)
    cid = store.register_subscriber("a")
    assert hold(store, "a").cid in (cid - 1, cid)
    after = write(store, 8)  # within the cap
    store.prune_changes()
    assert store.subscribers().pruned_cid == hold(store, "a").cid
    assert change_cids(store) == after  # everything after the hold, nothing before
    assert store.source_changes("t", cid, None, 100).count == 8


def test_the_webhook_high_watermark_pins_the_change_log(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5, webhook=True)
    cids = write(store, 20)
    store.journal.commit_internal(CREATE_CDC_STATE)  # as the CDC service does when it leads
    hwm = cids[3]
    store.journal.commit_internal(high_watermark_sql(hwm, 5))
    assert store.subscribers().pruned_cid == hwm
    store.prune_changes()
    # the webhook has not delivered past hwm: its changes stay, whatever the cap
    assert change_cids(store) == cids[4:]
    # a hold behind the webhook pins further than it…
    cid = store.register_subscriber("b")
    more = write(store, 2)
    store.journal.commit_internal(high_watermark_sql(more[0], 5))
    store.prune_changes()
    assert not hold(store, "b").expired
    assert store.subscribers().pruned_cid == hold(store, "b").cid
    assert hold(store, "b").cid in (cid - 1, cid)
    assert change_cids(store) == more
    # …and once it is released, the high watermark is the limit again
    store.release_subscriber("b")
    assert store.subscribers().pruned_cid == more[0]
    assert change_cids(store) == more[1:]


def test_a_webhook_that_has_delivered_nothing_yet_loses_nothing(
    make_store: StoreFactory,
) -> None:
    """No high watermark yet (the endpoint was down from the start): the cap must not
    delete what the webhook still has to send (QA: 70 of 100 events were lost)."""
    store = make_store(retention_cids=5, webhook=True)
    cids = write(store, 30)
    assert store.subscribers().webhook_hwm is None
    assert not store.retention_due()
    store.prune_changes()
    assert change_cids(store) == cids


def test_a_webhook_removed_from_the_configuration_no_longer_pins(
    make_store: StoreFactory, tmp_path: Path
) -> None:
    store = make_store("n", retention_cids=5, webhook=True)
    cids = write(store, 3)
    store.journal.commit_internal(CREATE_CDC_STATE)
    store.journal.commit_internal(high_watermark_sql(cids[0], 5))
    store.close()
    store = make_store("n", retention_cids=5)  # restarted without --cdc-config
    more = write(store, 20)
    assert store.retention_due()
    store.prune_changes()
    assert change_cids(store) == more[-5:]
    assert not store.retention_due()  # settles: no pruning entry at every check


def test_a_hold_further_behind_than_the_cap_expires(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    cid = store.register_subscriber("slow")
    store.register_subscriber("fast")
    cids = write(store, 10)
    store.advance_subscriber("fast", cids[-1])  # prunes: "slow" is more than 5 behind
    slow = hold(store, "slow")
    assert slow.expired and not hold(store, "fast").expired
    with pytest.raises(PositionUnavailableError, match="register again"):
        store.advance_subscriber("slow", cids[0])
    with pytest.raises(PositionUnavailableError, match="no longer available"):
        store.source_changes("t", cid, None, 100)
    # the expired hold pins nothing: the live one does
    assert store.subscribers().pruned_cid == cids[-1]
    # registering again revives it at the head
    again = store.register_subscriber("slow")
    assert not hold(store, "slow").expired
    assert again > cids[-1]
    new = write(store, 2)
    assert [
        e for e in store.source_changes("t", again, None, 100).events["_litecdc_cid"].to_pylist()
    ] == new


def test_advance_moves_the_hold_forward_only(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=100)
    store.register_subscriber("a")
    cids = write(store, 6)
    assert store.advance_subscriber("a", cids[2]).cid == cids[2]
    assert store.subscribers().pruned_cid == cids[2]
    assert change_cids(store) == cids[3:]
    head = store.subscribers().last_cid
    assert store.advance_subscriber("a", cids[0]).cid == cids[2]  # never back
    assert store.advance_subscriber("a", cids[2]).cid == cids[2]
    assert store.subscribers().pruned_cid == cids[2]
    # a move to where the hold is, or behind it, is no commit (retain QA: each was one)
    assert store.subscribers().last_cid == head
    with pytest.raises(NotFoundError):
        store.advance_subscriber("nobody", cids[0])


def test_release_lets_the_pruning_catch_up(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=1000)
    store.register_subscriber("early")
    first = write(store, 5)
    store.register_subscriber("late")
    second = write(store, 5)
    assert change_cids(store) == first + second  # "early" pins both
    store.release_subscriber("early")
    assert store.subscribers().pruned_cid == hold(store, "late").cid
    assert change_cids(store) == second
    assert [h.name for h in store.subscribers().holds] == ["late"]
    with pytest.raises(NotFoundError):
        store.release_subscriber("early")


# -- the RetentionKeeper --------------------------------------------------------------------
class FakeLeadership:
    """The keeper asks only ``is_leader()``; a fake is fine here because what is tested is the
    keeper's own decision (prune only as leader, only when due), not the election."""

    def __init__(self, leader: bool) -> None:
        self.leader = leader

    def is_leader(self) -> bool:
        return self.leader


def test_keeper_prunes_only_as_leader_and_only_when_due(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    leadership = FakeLeadership(leader=False)
    keeper = RetentionKeeper(store, leadership, interval=3600)
    write(store, 3)
    leadership.leader = True
    assert keeper.check_once() is False  # within the cap: nothing to do
    assert store.subscribers().pruned_cid == 0
    cids = write(store, 10)
    leadership.leader = False
    last = head(store)
    assert keeper.check_once() is False  # a follower never prunes
    assert head(store) == last and change_cids(store)[-10:] == cids
    leadership.leader = True
    assert keeper.check_once() is True
    assert store.subscribers().pruned_cid == last - 5  # recorded
    assert change_cids(store) == [c for c in cids if c > last - 5]
    # an idle node settles: no new writes, nothing more to prune, no more entries
    settled = head(store)
    assert keeper.check_once() is False
    assert head(store) == settled


def test_keeper_expires_a_hold_past_the_cap(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    keeper = RetentionKeeper(store, FakeLeadership(leader=True), interval=3600)
    store.register_subscriber("a")
    write(store, 3)
    assert keeper.check_once() is False  # a live hold within the cap prunes as it moves
    write(store, 5)
    assert keeper.check_once() is True
    assert hold(store, "a").expired


def test_keeper_keeps_enforcing_the_cap_after_the_first_prune(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    keeper = RetentionKeeper(store, FakeLeadership(leader=True), interval=3600)
    write(store, 10)
    assert keeper.check_once() is True
    cids = write(store, 10)
    assert keeper.check_once() is True
    assert change_cids(store) == [c for c in cids if c > head(store) - 1 - 5]


def test_keeper_prunes_after_the_last_subscriber_left(make_store: StoreFactory) -> None:
    store = make_store(retention_cids=5)
    keeper = RetentionKeeper(store, FakeLeadership(leader=True), interval=3600)
    store.register_subscriber("gone")
    store.release_subscriber("gone")
    write(store, 20)
    assert keeper.check_once() is True


# -- every replica prunes the same rows ------------------------------------------------------
def _history(store: Store) -> None:
    """Writes, holds, a webhook high watermark and pruning, all as a leader would."""
    a = write(store, 4)
    store.register_subscriber("a")
    b = write(store, 3, table="u")
    store.register_subscriber("b")
    write(store, 4)
    store.advance_subscriber("a", b[-1])
    store.journal.commit_internal(CREATE_CDC_STATE)
    store.journal.commit_internal(high_watermark_sql(a[-1], 5))
    write(store, 7, table="u")  # "a" falls past the cap of 5
    store.prune_changes()
    store.release_subscriber("b")
    write(store, 2)


def _replica_state(store: Store) -> dict[str, Any]:
    return {
        "changes": table_dump(store, "_litecdc_changes"),
        "holds": table_dump(store, "_litecdc_holds"),
        "state": table_dump(store, "_litecdc_cdc_state"),
    }


def test_followers_replaying_the_journal_prune_the_same_rows(make_store: StoreFactory) -> None:
    leader = make_store("leader", retention_cids=5)
    _history(leader)
    entries = leader.journal_page(1, 1000).entries
    assert any(e.internal for e in entries)
    follower = make_store("follower", retention_cids=1_000_000)  # the entry carries the cap
    follower.journal.set_mode(Mode.FOLLOWER)
    for entry in entries:
        follower.journal.follower_commit(entry)
    state = _replica_state(leader)
    assert state["holds"] and state["state"]
    assert _replica_state(follower) == state
    # a second leader with the same history ends the same
    twin = make_store("twin", retention_cids=5)
    _history(twin)
    assert [r[:6] for r in _replica_state(twin)["changes"]] == [r[:6] for r in state["changes"]]
    assert _replica_state(twin)["holds"] == state["holds"]


def test_pruning_does_not_depend_on_the_followers_apply_order(make_store: StoreFactory) -> None:
    """Pruning reads the journal's head when it runs, so an internal entry is a barrier:
    every later entry depends on it, and a follower cannot run one before it."""
    leader = make_store("leader", retention_cids=3)
    write(leader, 1, table="x")  # table x: cids 2, 3
    write(leader, 8)  # table t
    leader.prune_changes()  # internal entry P: no hold, no webhook → keep the newest 3
    leader.execute([Statement("INSERT INTO x(v) VALUES (x'01')")])  # must depend on P
    entries = leader.journal_page(1, 1000).entries
    internal = next(e for e in entries if e.internal)
    later = entries[-1]
    assert later.cid == internal.cid + 1 and later.snapshot >= internal.cid
    follower = make_store("follower")
    follower.journal.set_mode(Mode.FOLLOWER)
    for entry in entries[:-2]:
        follower.journal.follower_commit(entry)
    with pytest.raises(SnapshotUnavailableError):
        follower.journal.follower_commit(later)  # not before the internal entry
    follower.journal.follower_commit(internal)
    follower.journal.follower_commit(later)
    assert _replica_state(follower) == _replica_state(leader)


# -- the journal's own retention ---------------------------------------------------------------
def journal_cids(store: Store) -> list[int]:
    return [e.cid for e in store.journal_page(0, 10_000).entries]


def test_the_journal_keeps_its_newest_entries(tmp_path: Path, monkeypatch: Any) -> None:
    """The journal grew with every write, forever; each node now trims it to the newest
    --journal-retention-cids entries, oldest first, a batch per transaction."""
    monkeypatch.setattr("litecdc.store.JOURNAL_TRIM_BATCH", 3)
    store = Store(NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=5))
    try:
        write(store, 20)
        last = store.journal.last_cid()
        assert store.trim_journal() == last - 5
        assert journal_cids(store) == list(range(last - 4, last + 1))
        page = store.journal_page(0, 10)
        assert page.oldest_cid == last - 4 and page.available_snapshot == last
        assert store.trim_journal() == 0  # nothing more until more is written
        write(store, 2)
        grown = store.journal.last_cid() - last
        assert store.trim_journal() == grown
        assert store.journal.min_cid() == store.journal.last_cid() - 4
        # the node still writes as before
        assert store.execute([Statement("INSERT INTO t(v) VALUES (1)")]).cid == last + grown + 1
    finally:
        store.close()


def test_zero_keeps_every_journal_entry(tmp_path: Path) -> None:
    store = Store(NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=0))
    try:
        write(store, 10)
        assert store.trim_journal() == 0
        assert journal_cids(store) == list(range(1, store.journal.last_cid() + 1))
    finally:
        store.close()


def test_a_follower_never_trims_past_its_available_snapshot(tmp_path: Path) -> None:
    """A follower may hold entries beyond a gap (applied out of order); the entry at the
    available snapshot and everything after it stay."""
    store = Store(NodeConfig(data_dir=tmp_path / "f", journal_retention_cids=1))
    try:
        store.journal.set_mode(Mode.FOLLOWER)
        for cid in (2, 3, 4, 5, 9):  # 6-8 not here yet
            store.journal.follower_commit(
                JournalEntry(cid, f"CREATE TABLE t{cid}(x)", min(cid - 1, 5), 0, 0)
            )
        assert store.journal.available_snapshot() == 5
        store.trim_journal()
        assert journal_cids(store) == [5, 9]
    finally:
        store.close()


def test_every_node_trims_its_journal_leader_or_not(tmp_path: Path) -> None:
    store = Store(NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=3))
    keeper = RetentionKeeper(store, FakeLeadership(leader=False), interval=0.05)
    try:
        write(store, 10)
        keeper.start()
        deadline = time.monotonic() + 30
        while store.journal.min_cid() != store.journal.last_cid() - 2:
            assert time.monotonic() < deadline, journal_cids(store)
            time.sleep(0.05)
    finally:
        keeper.stop()
        store.close()


def test_a_negative_journal_retention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--journal-retention-cids must be a number of commits"):
        NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=-1)


def test_a_trimmed_journal_survives_a_restart(tmp_path: Path) -> None:
    """Review: every open put the initial record (cid 1) back into a trimmed journal, a
    gap before every kept entry: the restarted node refused every write."""
    config = NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=3)
    store = Store(config)
    write(store, 10)
    store.trim_journal()
    kept = journal_cids(store)
    store.close()
    store = Store(config)
    try:
        assert journal_cids(store) == kept
        assert store.journal.available_snapshot() == kept[-1]
        outcome = store.execute([Statement("INSERT INTO t(v) VALUES (1)")])
        assert outcome.cid == kept[-1] + 1, outcome.results
    finally:
        store.close()


def test_a_trim_batch_is_bounded_by_bytes_too(tmp_path: Path, monkeypatch: Any) -> None:
    """Freeing an entry reads its whole SQL text; a bulk write's entry may hold megabytes,
    so a batch stops at a byte budget (always taking at least one entry)."""
    monkeypatch.setattr("litecdc.store.JOURNAL_TRIM_BATCH_BYTES", 3_000)
    store = Store(NodeConfig(data_dir=tmp_path / "n", journal_retention_cids=2))
    try:
        store.execute([Statement("CREATE TABLE big(v TEXT)")])
        for _ in range(10):
            store.execute([Statement("INSERT INTO big VALUES (?)", ("x" * 1_000,))])
        first, last = store.journal.min_cid(), store.journal.last_cid()
        sizes = {e.cid: len((e.query or "").encode()) for e in store.journal_page(0, 100).entries}
        ends: list[int] = []
        real_truncate = store.journal.truncate

        def truncate(through: int) -> int:
            ends.append(through)
            return real_truncate(through)

        monkeypatch.setattr(store.journal, "truncate", truncate)
        assert store.trim_journal() == last - 2 - first + 1
        assert ends[-1] == last - 2 and journal_cids(store) == [last - 1, last]
        start = first
        for end in ends:  # each batch: one entry, or at most 3,000 bytes of SQL text
            batch = [sizes[cid] for cid in range(start, end + 1)]
            assert len(batch) == 1 or sum(batch) <= 3_000, (start, end, batch)
            start = end + 1
        assert len(ends) >= 4  # ten ~1 KB inserts cannot go in fewer batches
    finally:
        store.close()
