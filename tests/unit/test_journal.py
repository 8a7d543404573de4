"""The hctree journal rules: initial record, modes, leader/follower commit, truncation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apsw
import pytest

from litecdc import JournalEntry, Mode, NodeConfig, Statement, Store
from litecdc.db import engine as engine_module
from litecdc.db.access import Access, AccessCache
from litecdc.db.engine import WRITE_LIMIT_ERROR
from litecdc.errors import (
    ConfigError,
    DuplicateCidError,
    ModeError,
    SnapshotUnavailableError,
    TruncateError,
)
from litecdc.journal.journal import BatchEnded

S = Statement

#: an INSERT whose recursive CTE has no bound (it never ends before the step limit)
ENDLESS_WRITE = (
    "INSERT INTO e(v) SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x + 1 FROM c) SELECT x FROM c) WHERE x < ?"
)


def test_journal_starts_with_initial_record(store: Store) -> None:
    page = store.journal_page(0, 10)
    assert [(e.cid, e.query, e.snapshot) for e in page.entries] == [(1, "", 0)]
    assert page.available_snapshot == 1


def test_each_commit_is_one_entry_with_sql_text_and_snapshot(store: Store) -> None:
    store.execute([S("CREATE TABLE a(x)"), S("CREATE TABLE b(x)")])
    out = store.execute([S("INSERT INTO a VALUES(?)", (1.5,))])
    store.execute([S("INSERT INTO b VALUES(?)", ("t",))])
    last = store.execute([S("INSERT INTO a SELECT x FROM b")])
    entries = store.journal_page(1, 10).entries
    assert [(e.cid, e.query, e.snapshot) for e in entries] == [
        (2, "CREATE TABLE a(x);\nCREATE TABLE b(x);", 1),  # schema change: cid - 1
        (3, "INSERT INTO a VALUES(1.5);", 2),  # last writer of a
        (4, "INSERT INTO b VALUES('t');", 2),  # last writer of b is the schema change
        (5, "INSERT INTO a SELECT x FROM b;", 4),  # reads b (cid 4), writes a (cid 3)
    ]
    assert out.cid == 3 and last.snapshot == 4


def test_failed_statements_leave_no_entry_and_no_change(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x UNIQUE)"), S("INSERT INTO t VALUES(1)")])
    before = store.journal_page(0, 10).entries
    out = store.execute(
        [S("INSERT INTO t VALUES(2)"), S("INSERT INTO t VALUES(1)")], transaction=True
    )
    assert out.cid is None
    assert out.results[1].error == "UNIQUE constraint failed: t.x"
    assert store.journal_page(0, 10).entries == before
    assert store.query([S("SELECT x FROM t")])[0].rows == [(1,)]
    assert [c.cid for c in store.changes(0, 100)] == [2]


def test_without_transaction_each_statement_stands_alone(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x UNIQUE ON CONFLICT FAIL)")])
    store.execute([S("INSERT INTO t VALUES(3)")])
    # OR FAIL keeps a failing statement's earlier rows unless litecdc undoes them.
    out = store.execute(
        [
            S("INSERT INTO t VALUES(1)"),
            S("INSERT INTO t SELECT 2 UNION ALL SELECT 3"),
            S("INSERT INTO t VALUES(4)"),
        ]
    )
    assert [r.error for r in out.results] == [None, "UNIQUE constraint failed: t.x", None]
    assert store.query([S("SELECT x FROM t ORDER BY x")])[0].rows == [(1,), (3,), (4,)]
    entry = store.journal_page(out.cid - 1, 1).entries[0]  # type: ignore[operator]
    assert entry.query == "INSERT INTO t VALUES(1);\nINSERT INTO t VALUES(4);"
    assert [c.after for c in store.changes(out.cid - 1, 10)] == [{"x": 1}, {"x": 4}]  # type: ignore[operator]


def test_statement_that_rolls_back_everything(store: Store) -> None:
    store.execute(
        [S("CREATE TABLE t(x UNIQUE ON CONFLICT ROLLBACK)"), S("INSERT INTO t VALUES(1)")]
    )
    out = store.execute(
        [S("INSERT INTO t VALUES(2)"), S("INSERT INTO t VALUES(1)"), S("INSERT INTO t VALUES(3)")]
    )
    assert out.cid is None
    assert len(out.results) == 3  # one per statement; the last one never ran
    assert out.results[0].error == "rolled back by a later statement in this request"
    assert out.results[2].error == "not run: an earlier statement rolled back this request"
    assert store.query([S("SELECT x FROM t")])[0].rows == [(1,)]


def test_plain_writes_are_errors_outside_normal_mode(store: Store) -> None:
    store.journal.set_mode(Mode.LEADER)
    with pytest.raises(ModeError, match="plain writes are not allowed in LEADER mode"):
        store.execute([S("CREATE TABLE t(x)")])
    store.journal.set_mode(Mode.FOLLOWER)
    with pytest.raises(ModeError, match="FOLLOWER"):
        store.execute([S("CREATE TABLE t(x)")])
    with pytest.raises(ModeError, match="LEADER mode"):
        store.journal.leader_commit([S("CREATE TABLE t(x)")])


def test_leader_commit_returns_cid_and_snapshot_and_leaves_empty_entry_on_failure(
    store: Store,
) -> None:
    store.journal.set_mode(Mode.LEADER)
    first = store.journal.leader_commit([S("CREATE TABLE t(x)")])
    assert (first.cid, first.snapshot) == (2, 1)
    failed = store.journal.leader_commit([S("INSERT INTO missing VALUES(1)")])
    assert (failed.cid, failed.snapshot) == (3, 0)
    assert failed.outcome.results[0].error == "no such table: missing"
    third = store.journal.leader_commit([S("INSERT INTO t VALUES(1)")])
    assert (third.cid, third.snapshot) == (4, 2)
    entries = store.journal_page(2, 10).entries
    assert [(e.cid, e.query, e.snapshot) for e in entries] == [
        (3, None, 0),
        (4, "INSERT INTO t VALUES(1);", 2),
    ]


def _leader_entries(tmp_path: Path) -> list[JournalEntry]:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute([S("CREATE TABLE a(x)"), S("CREATE TABLE b(x)")])  # 2
    leader.execute([S("INSERT INTO a VALUES(1)")])  # 3, snapshot 2
    leader.execute([S("INSERT INTO b VALUES(1)")])  # 4, snapshot 2
    leader.execute([S("INSERT INTO a VALUES(2)")])  # 5, snapshot 3
    entries = leader.journal_page(1, 10).entries
    leader.close()
    return entries


def test_follower_commit_waits_for_its_snapshot(tmp_path: Path) -> None:
    entries = {e.cid: e for e in _leader_entries(tmp_path)}
    follower = Store(NodeConfig(data_dir=tmp_path / "follower"))
    follower.journal.set_mode(Mode.FOLLOWER)
    with pytest.raises(SnapshotUnavailableError, match="snapshot 2 is not available yet"):
        follower.journal.follower_commit(entries[3])
    assert follower.journal.follower_commit(entries[2])
    # 4 depends only on 2: it may be applied before 3, leaving a gap.
    assert follower.journal.follower_commit(entries[4])
    assert follower.journal.available_snapshot() == 2
    with pytest.raises(SnapshotUnavailableError):
        follower.journal.follower_commit(entries[5])
    with pytest.raises(ModeError, match="journal has gaps"):
        follower.journal.set_mode(Mode.LEADER)
    with pytest.raises(DuplicateCidError):
        follower.journal.follower_commit(entries[4])
    assert follower.journal.follower_commit(entries[3])
    assert follower.journal.available_snapshot() == 4
    assert follower.journal.follower_commit(entries[5])
    assert follower.query([S("SELECT x FROM a ORDER BY x")])[0].rows == [(1,), (2,)]
    assert [(e.cid, e.query, e.snapshot) for e in follower.journal_page(1, 10).entries] == [
        (e.cid, e.query, e.snapshot) for e in entries.values()
    ]
    follower.journal.set_mode(Mode.LEADER)  # contiguous now
    follower.close()


def test_follower_commit_raises_a_full_disk_and_records_nothing(tmp_path: Path) -> None:
    """Disk full is this replica's trouble, not the entry's: recording it empty (as an
    SQL failure is) would make this replica differ for good."""
    follower = Store(NodeConfig(data_dir=tmp_path / "f"))
    follower.journal.set_mode(Mode.FOLLOWER)
    assert follower.journal.follower_commit(JournalEntry(2, "CREATE TABLE t(b);", 1, 0, 0))
    pages = follower.engine._internal("PRAGMA page_count")[0][0]
    follower.engine._internal(f"PRAGMA max_page_count = {pages + 2}")  # the disk is "full"
    big = JournalEntry(3, "INSERT INTO t VALUES(zeroblob(100000));", 2, 0, 0)
    with pytest.raises(apsw.FullError):
        follower.journal.follower_commit(big)
    assert [e.cid for e in follower.journal_page(1, 10).entries] == [2]
    follower.engine._internal("PRAGMA max_page_count = 1000000")  # space again
    assert follower.journal.follower_commit(big)
    assert follower.query([S("SELECT length(b) FROM t")])[0].rows == [(100000,)]
    follower.close()


def test_follower_records_failing_entry_as_empty(tmp_path: Path) -> None:
    follower = Store(NodeConfig(data_dir=tmp_path / "f"))
    follower.journal.set_mode(Mode.FOLLOWER)
    assert not follower.journal.follower_commit(
        JournalEntry(2, "INSERT INTO nope VALUES(1);", 1, 0, 0)
    )
    assert not follower.journal.follower_commit(JournalEntry(3, None, 0, 0, 0))
    entries = follower.journal_page(1, 10).entries
    assert [(e.cid, e.query, e.snapshot) for e in entries] == [(2, None, 0), (3, None, 0)]
    assert follower.journal.available_snapshot() == 3
    follower.close()


def test_journal_state_survives_restart(tmp_path: Path) -> None:
    entries = _leader_entries(tmp_path)
    follower = Store(NodeConfig(data_dir=tmp_path / "f"))
    follower.journal.set_mode(Mode.FOLLOWER)
    for cid in (2, 4):
        follower.journal.follower_commit(next(e for e in entries if e.cid == cid))
    follower.close()
    reopened = Store(NodeConfig(data_dir=tmp_path / "f"))
    assert reopened.mode is Mode.NORMAL  # modes are not persistent
    assert reopened.journal.available_snapshot() == 2
    assert reopened.journal.last_cid() == 4
    reopened.journal.set_mode(Mode.FOLLOWER)
    reopened.journal.follower_commit(next(e for e in entries if e.cid == 3))
    assert reopened.journal.available_snapshot() == 4
    # table write cids were kept: a new write to a depends on cid 3
    reopened.journal.follower_commit(next(e for e in entries if e.cid == 5))
    reopened.journal.set_mode(Mode.NORMAL)
    assert reopened.execute([S("INSERT INTO b VALUES(9)")]).snapshot == 4
    reopened.close()


def test_truncation_in_cid_order_never_empties(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    for i in range(5):
        store.execute([S("INSERT INTO t VALUES(?)", (i,))])
    assert store.journal.last_cid() == 7
    with pytest.raises(TruncateError, match="the limit is 6"):
        store.journal.truncate(7)
    assert store.journal.truncate(4) == 4
    assert [e.cid for e in store.journal_page(0, 10).entries] == [5, 6, 7]
    assert store.journal.truncate(3) == 0
    assert store.journal.truncate(6) == 2
    assert [e.cid for e in store.journal_page(0, 10).entries] == [7]
    assert store.journal.available_snapshot() == 7
    store.execute([S("INSERT INTO t VALUES(9)")])
    assert store.journal.last_cid() == 8


def test_rows_affected_counts_the_statement_not_its_triggers(store: Store) -> None:
    """As SQLite's changes() and rqlite: an ORM checking "1 row updated" must see 1 even
    when an audit trigger writes more rows."""
    store.execute(
        [
            S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"),
            S("CREATE TABLE audit(v)"),
            S(
                "CREATE TRIGGER t_audit AFTER INSERT ON t BEGIN "
                "INSERT INTO audit VALUES(new.v); INSERT INTO audit VALUES(new.v); END"
            ),
            S("CREATE TRIGGER t_upd AFTER UPDATE ON t BEGIN INSERT INTO audit VALUES(1); END"),
        ]
    )
    single = store.execute([S("INSERT INTO t(v) VALUES(1)"), S("UPDATE t SET v = 2")])
    batched = store.execute(  # one executemany inside a transaction
        [S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(3)]
        + [S("UPDATE t SET v = 5 WHERE id = ?", (i,)) for i in (1, 99)],
        transaction=True,
    )
    ddl = store.execute([S("CREATE TABLE u(x)")])
    assert [r.rows_affected for r in single.results] == [1, 1]
    assert [r.rows_affected for r in batched.results] == [1, 1, 1, 1, 0]
    assert [r.rows_affected for r in ddl.results] == [0]
    assert store.query([S("SELECT count(*) FROM audit")])[0].rows == [(10,)]


def test_repeated_statement_in_a_transaction_reports_each_result(store: Store) -> None:
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v UNIQUE)")])
    out = store.execute(
        [S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(5)]
        + [S("UPDATE t SET v = v + 10 WHERE id > ?", (3,))] * 2,
        transaction=True,
    )
    assert [(r.last_insert_id, r.rows_affected) for r in out.results] == [
        (1, 1),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 1),
        (5, 2),
        (5, 2),
    ]
    entry = store.journal_page(out.cid - 1, 1).entries[0]  # type: ignore[operator]
    assert entry.query is not None and entry.query.count("INSERT INTO t(v) VALUES(") == 5
    assert len(store.changes(out.cid - 1, 100)) == 9  # type: ignore[operator]


def test_failure_inside_a_repeated_statement_names_the_statement(store: Store) -> None:
    store.execute([S("CREATE TABLE t(v UNIQUE)")])
    out = store.execute(
        [S("INSERT INTO t VALUES(?)", (v,)) for v in (1, 2, 2, 3)], transaction=True
    )
    assert [r.error for r in out.results] == [None, None, "UNIQUE constraint failed: t.v"]
    assert out.cid is None
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]
    assert store.changes(0, 10) == []
    wrong = store.execute(
        [S("INSERT INTO t VALUES(?)", (1,)), S("INSERT INTO t VALUES(?)", ())], transaction=True
    )
    assert wrong.results[1].error == "not enough args to execute query: want 1 got 0"


def test_a_failure_late_in_a_long_repeated_statement_is_found_in_two_batches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale QA: after the batch failed, each later statement was batched again with the
    rest of the run, which failed again at the same one: one failure among 100k INSERTs
    held the write lock for over 10 minutes (quadratic). The executions before the
    failing one go as one batch again, and the failing one alone reports its error."""
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"), S("INSERT INTO t VALUES(1, 0)")])
    engine = store.engine
    batches: list[int] = []
    run_batch = engine._run_batch

    def counted(group: Any, *args: Any) -> bool:
        batches.append(len(group))
        return run_batch(group, *args)

    monkeypatch.setattr(engine, "_run_batch", counted)
    statements = [S("INSERT INTO t VALUES(?, ?)", (i, i)) for i in range(2, 3002)]
    statements[2100] = S("INSERT INTO t VALUES(?, ?)", (1, "dup"))
    out = store.execute(statements, transaction=True)
    # (the first statement runs alone, learning what it reads and writes): the run, then
    # the executions before the failing one — it was 2999, 2998, 2997, …: 2,100 batches
    assert batches == [2999, 2099]
    assert len(out.results) == 2101
    assert [r.error for r in out.results[:2100]] == [None] * 2100
    assert out.results[2100].error == "UNIQUE constraint failed: t.id"
    assert [r.last_insert_id for r in out.results[:3]] == [2, 3, 4]
    assert out.cid is None  # nothing committed
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(1,)]
    # the next request batches as ever
    batches.clear()
    done = store.execute(
        [S("INSERT INTO t VALUES(?, ?)", (i, i)) for i in (5, 6)], transaction=True
    )
    assert batches == [2] and [r.last_insert_id for r in done.results] == [5, 6]  # (learnt)


def test_internal_entries_replicate_litecdc_state_without_events(tmp_path: Path) -> None:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    entry = leader.journal.commit_internal(
        "CREATE TABLE IF NOT EXISTS _litecdc_cdc_state(k TEXT PRIMARY KEY, v);"
        "INSERT INTO _litecdc_cdc_state VALUES('hwm', 2);"
        "DELETE FROM _litecdc_changes WHERE cid <= 2;"
    )
    assert (entry.cid, entry.snapshot, entry.internal) == (3, 2, True)
    assert leader.changes(0, 10) == []
    # clients still cannot write the internal table
    out = leader.execute([S("INSERT INTO _litecdc_cdc_state VALUES('hwm', 99)")])
    assert out.cid is None and "internal to litecdc" in (out.results[0].error or "")
    follower = Store(NodeConfig(data_dir=tmp_path / "follower"))
    follower.journal.set_mode(Mode.FOLLOWER)
    for e in leader.journal_page(1, 10).entries:
        assert follower.journal.follower_commit(e)
    assert follower.journal_page(2, 1).entries[0].internal
    assert follower.query([S("SELECT k, v FROM _litecdc_cdc_state")])[0].rows == [("hwm", 2)]
    assert follower.changes(0, 10) == []
    with pytest.raises(ModeError):
        follower.journal.commit_internal("SELECT 1")
    leader.close()
    follower.close()


def test_waiting_for_a_commit(store: Store) -> None:
    import threading

    last = store.journal.last_cid()
    assert not store.journal.wait_for_commit_after(last, 0.01)
    threading.Timer(0.05, lambda: store.execute([S("CREATE TABLE t(x)")])).start()
    assert store.journal.wait_for_commit_after(last, 5)


def test_requests_that_write_nothing_use_no_cid(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    last = store.journal.last_cid()
    out = store.execute([S(""), S("-- just a comment"), S("SELECT 1"), S("PRAGMA table_info(t)")])
    assert out.cid is None and all(r.error is None for r in out.results)
    assert out.results[2].rows == [(1,)]
    assert store.journal.last_cid() == last


def test_transaction_control_fails_the_whole_request(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.execute(
        [S("INSERT INTO t VALUES(1)"), S("BEGIN"), S("INSERT INTO t VALUES(2)"), S("ROLLBACK")]
    )
    assert out.cid is None
    assert [r.error for r in out.results] == [
        "not committed: this request has a transaction control statement",
        "transaction control statements are not allowed: each request is one transaction "
        "(use the transaction parameter to make it all-or-nothing)",
        # one result per statement, as rqlite answers: the rest did not run (review QA:
        # they were said to be not committed, as if they had run)
        "not run: this request has a transaction control statement",
        "not run: this request has a transaction control statement",
    ]
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]


@pytest.mark.parametrize("transaction", [True, False])
def test_inserts_past_the_largest_rowid_are_refused(store: Store, transaction: bool) -> None:
    store.execute([S("CREATE TABLE t(v)"), S("INSERT INTO t(rowid, v) VALUES(?, 0)", (2**63 - 1,))])
    out = store.execute(
        [S("INSERT INTO t(v) VALUES(?)", (1,)), S("INSERT INTO t(v) VALUES(?)", (2,))],
        transaction=transaction,
    )
    assert out.cid is None
    assert "holds rowid 9223372036854775807" in (out.results[0].error or "")
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(1,)]


@pytest.mark.parametrize(
    "insert",
    [
        # the row at 2**63-1 is replaced: SQLite picks the new rowid first, at random
        "INSERT OR REPLACE INTO t(x) VALUES('top')",
        # a trigger removes it after the insert chose a random rowid
        "INSERT INTO t(x) VALUES('other')",
    ],
)
def test_inserts_that_remove_the_largest_rowid_themselves_are_refused(
    store: Store, insert: str
) -> None:
    """QA: the check looked at max(rowid) after the statement only: a statement that also
    removed the 2**63-1 row passed, and every replica stored another random rowid."""
    store.execute(
        [
            S("CREATE TABLE t(x UNIQUE)"),
            S("INSERT INTO t(rowid, x) VALUES(?, 'top')", (2**63 - 1,)),
            S(
                "CREATE TRIGGER drop_top AFTER INSERT ON t WHEN new.x = 'other' "
                f"BEGIN DELETE FROM t WHERE rowid = {2**63 - 1}; END"
            ),
        ]
    )
    before = store.journal.last_cid()
    out = store.execute([S(insert)])
    assert out.cid is None and store.journal.last_cid() == before
    assert "holds rowid 9223372036854775807 (or did until this statement removed it)" in (
        out.results[0].error or ""
    )
    assert store.query([S("SELECT rowid, x FROM t")])[0].rows == [(2**63 - 1, "top")]


@pytest.mark.parametrize("transaction", [False, True])
def test_autoincrement_out_of_rowids_is_the_statements_error_not_a_full_disk(
    store: Store, transaction: bool
) -> None:
    """QA: SQLite fails an insert into an AUTOINCREMENT table whose rowids reached 2**63-1
    with SQLITE_FULL, which litecdc took for a full disk: HTTP 500 standalone, and in a
    cluster every node retried the log entry forever (no leader, every write refused)."""
    out = store.execute(
        [
            S("CREATE TABLE ff(id INTEGER PRIMARY KEY AUTOINCREMENT, x)"),
            S("INSERT INTO ff(id, x) VALUES (?, 1)", (2**63 - 1,)),
            S("INSERT INTO ff(x) VALUES (2)"),
            S("INSERT INTO ff(x) VALUES (3)"),
        ],
        transaction=transaction,
    )
    assert out.cid is None  # SQLite rolled back the whole transaction: nothing committed
    errors = [r.error for r in out.results]
    assert "AUTOINCREMENT table ff has no rowid left" in (errors[2] or ""), errors
    if not transaction:  # (with transaction the request stops at the failure)
        assert errors[:2] == ["rolled back by a later statement in this request"] * 2
        assert errors[3] == "not run: an earlier statement rolled back this request"
    assert store.query([S("SELECT count(*) FROM sqlite_schema WHERE name = 'ff'")])[0].rows == [
        (0,)
    ]
    # set up first, then the failing insert, in requests of their own; the batch path too
    store.execute([S("CREATE TABLE ff(id INTEGER PRIMARY KEY AUTOINCREMENT, x)")])
    store.execute([S("INSERT INTO ff(id, x) VALUES (?, 1)", (2**63 - 1,))])
    cid = store.journal.last_cid()
    inserts = [S("INSERT INTO ff(x) VALUES (?)", (i,)) for i in range(3)]
    out = store.execute(inserts, transaction=transaction)
    assert out.cid is None and store.journal.last_cid() == cid
    assert "has no rowid left" in (out.results[0].error or "")
    # other tables go on
    out = store.execute([S("CREATE TABLE ok(x)"), S("INSERT INTO ok VALUES (1)")])
    assert out.cid is not None and all(r.error is None for r in out.results)


def test_log_entries_prepared_by_the_leader_apply_identically_everywhere(tmp_path: Path) -> None:
    from litecdc import LogEntry

    nodes = [Store(NodeConfig(data_dir=tmp_path / f"n{i}")) for i in range(2)]
    leader, follower = nodes
    leader.journal.set_mode(Mode.LEADER)
    follower.journal.set_mode(Mode.FOLLOWER)
    requests = [
        ([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v, r)")], False),
        ([S("INSERT INTO t(v, r) VALUES(?, random())", (x,)) for x in (1.5, "a'b", b"\x00")], True),
        (
            [S("INSERT INTO t(id) VALUES(1)"), S("UPDATE t SET v = ? WHERE id = 2", (None,))],
            False,
        ),  # first fails (duplicate id), second commits: each alone
        ([S("INSERT INTO missing VALUES(1)")], True),  # fails: the cid becomes empty
    ]
    entries = [leader.journal.prepare_entry(stmts, transaction=tx) for stmts, tx in requests]
    assert [e.cid for e in entries] == [2, 3, 4, 5]
    entries.append(
        leader.journal.prepare_internal(
            "CREATE TABLE IF NOT EXISTS _litecdc_cdc_state(name TEXT PRIMARY KEY, value);"
        )
    )
    outcomes: list[list[object]] = [[], []]
    for revision, entry in enumerate(entries, 100):
        wire = LogEntry.decode(entry.encode())  # through the log's encoding
        assert wire == entry
        for i, node in enumerate(nodes):
            outcome = node.journal.apply_log_entry(wire, revision=revision)
            outcomes[i].append(
                [(r.error, r.last_insert_id, r.rows_affected) for r in outcome.results]
            )
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][2] == [("UNIQUE constraint failed: t.id", None, None), (None, 0, 1)]
    for node in nodes:
        journal = [(e.cid, e.query is None, e.internal) for e in node.journal_page(1, 10).entries]
        assert journal == [
            (2, False, False),
            (3, False, False),
            (4, False, False),
            (5, True, False),
            (6, False, True),
        ]
        assert node.journal.applied_revision() == 104
        assert (
            node.query([S("SELECT * FROM t ORDER BY id")])[0].rows
            == leader.query([S("SELECT * FROM t ORDER BY id")])[0].rows
        )
    assert follower.changes(0, 100) == leader.changes(0, 100)
    with pytest.raises(DuplicateCidError):
        follower.journal.apply_log_entry(entries[0], revision=99)
    with pytest.raises(ModeError, match="only the leader prepares"):
        follower.journal.prepare_entry([S("SELECT 1")])
    for node in nodes:
        node.close()


@pytest.mark.parametrize("transaction", [False, True])
def test_a_statement_whose_values_do_not_fit_fails_alone_in_a_cluster_as_standalone(
    tmp_path: Path, transaction: bool
) -> None:
    """Determinism QA: a leader that could not write a statement's parameters into the
    log entry (too few values, an object for ?) failed the whole request with a 400,
    where a standalone node reports that statement's error and runs the others."""
    standalone = Store(NodeConfig(data_dir=tmp_path / "standalone"))
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.journal.set_mode(Mode.LEADER)
    setup = [S("CREATE TABLE t(a, b)")]
    request = [
        S("INSERT INTO t VALUES (1, 1)"),
        S("INSERT INTO t VALUES (?, ?)", (2,)),  # one value short
        S("INSERT INTO t VALUES (3, 3)"),
    ]
    standalone.execute(setup)
    leader.journal.apply_log_entry(leader.journal.prepare_entry(setup), revision=1)
    expected = standalone.execute(request, transaction=transaction)
    entry = leader.journal.prepare_entry(request, transaction=transaction)
    got = leader.journal.apply_log_entry(entry, revision=2)
    assert [r.error for r in got.results] == [r.error for r in expected.results]
    assert got.results[1].error == "not enough args to execute query: want 2 got 1"
    rows = S("SELECT * FROM t ORDER BY a")
    assert leader.query([rows])[0].rows == standalone.query([rows])[0].rows
    assert leader.query([rows])[0].rows == ([] if transaction else [(1, 1), (3, 3)])
    # the journal holds what committed, not the failing statement
    assert "litecdc_statement_failed" not in (leader.journal_page(2, 10).entries[0].query or "")
    for store in (standalone, leader):
        store.close()


def test_a_batch_of_log_entries_applies_in_one_transaction_like_one_by_one(
    tmp_path: Path,
) -> None:
    nodes = [Store(NodeConfig(data_dir=tmp_path / f"n{i}")) for i in range(3)]
    leader, one_by_one, batched = nodes
    leader.journal.set_mode(Mode.LEADER)
    for node in (one_by_one, batched):
        node.journal.set_mode(Mode.FOLLOWER)
    requests = [
        ([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v UNIQUE, r)")], False),
        ([S("INSERT INTO t(v, r) VALUES(?, random())", (i,)) for i in range(3)], True),
        ([S("INSERT INTO t(v) VALUES(1)")], True),  # fails: an empty entry, alone
        ([S("INSERT INTO t(v) VALUES(10)"), S("INSERT INTO nope VALUES(1)")], False),
    ]
    entries = [leader.journal.prepare_entry(stmts, transaction=tx) for stmts, tx in requests]
    entries.append(
        leader.journal.prepare_internal(
            "CREATE TABLE IF NOT EXISTS _litecdc_cdc_state(name TEXT PRIMARY KEY, value);"
        )
    )
    singles = [one_by_one.journal.apply_log_entry(e, revision=50) for e in entries]
    outcomes = batched.journal.apply_log_entries(entries, revision=50)
    assert outcomes is not None
    assert [
        [(r.error, r.last_insert_id, r.rows_affected) for r in o.results] for o in outcomes
    ] == [[(r.error, r.last_insert_id, r.rows_affected) for r in o.results] for o in singles]
    assert [o.cid for o in outcomes] == [2, 3, None, 5, 6]
    for node in (one_by_one, batched):
        assert node.journal_page(0, 10).entries == one_by_one.journal_page(0, 10).entries
        assert node.changes(0, 100) == one_by_one.changes(0, 100)
        assert node.journal.applied_revision() == 50
    assert batched.journal.available_snapshot() == 6
    for node in nodes:
        node.close()


def test_a_batch_rolled_back_by_a_statement_changes_nothing(tmp_path: Path) -> None:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    follower = Store(NodeConfig(data_dir=tmp_path / "follower"))
    leader.journal.set_mode(Mode.LEADER)
    follower.journal.set_mode(Mode.FOLLOWER)
    entries = [
        leader.journal.prepare_entry([S("CREATE TABLE t(v UNIQUE ON CONFLICT ROLLBACK)")]),
        leader.journal.prepare_entry([S("INSERT INTO t VALUES(1)")]),
        leader.journal.prepare_entry([S("INSERT INTO t VALUES(1)")]),  # rolls back everything
    ]
    ended = follower.journal.apply_log_entries(entries, revision=7)
    assert isinstance(ended, BatchEnded) and ended.index == 2
    assert ended.outcome.cid is None
    assert ended.outcome.results[0].error == "UNIQUE constraint failed: t.v"
    assert follower.journal.last_cid() == 1 and follower.journal.applied_revision() == 0
    for entry in entries[:2]:  # the caller's fallback: the entries before it again…
        follower.journal.apply_log_entry(entry, revision=7)
    # … and the one that ended the batch as it was found, not run again
    follower.journal.record_failed_entry(entries[2], ended.outcome, revision=7)
    assert follower.query([S("SELECT v FROM t")])[0].rows == [(1,)]
    assert [e.query is None for e in follower.journal_page(1, 10).entries] == [False, False, True]
    assert follower.journal.applied_revision() == 7
    assert follower.journal.available_snapshot() == 4
    leader.close()
    follower.close()


def test_an_entry_whose_repeated_statement_ends_the_transaction_fails_alike(
    tmp_path: Path,
) -> None:
    """Review: an entry repeating one ``OR ROLLBACK`` statement runs it as one batch; the
    failing execution ended the SQLite transaction and the apply raised "no such
    savepoint" — every node's apply loop would have retried it for good."""
    leader, single, batched = (Store(NodeConfig(data_dir=tmp_path / n)) for n in "lsb")
    leader.journal.set_mode(Mode.LEADER)
    for node in (single, batched):
        node.journal.set_mode(Mode.FOLLOWER)
    again = "INSERT OR ROLLBACK INTO t VALUES(1)"
    entries = [
        leader.journal.prepare_entry([S("CREATE TABLE t(v UNIQUE)")]),
        leader.journal.prepare_entry([S(again)] * 3, transaction=True),
        leader.journal.prepare_entry([S("INSERT INTO t VALUES(2)")]),
    ]
    alone = [single.journal.apply_log_entry(e, revision=4) for e in entries]
    assert [o.cid for o in alone] == [2, None, 4]
    assert alone[1].results[-1].error == "UNIQUE constraint failed: t.v"
    ended = batched.journal.apply_log_entries(entries, revision=4)
    assert isinstance(ended, BatchEnded) and ended.index == 1
    assert [r.error for r in ended.outcome.results] == [r.error for r in alone[1].results]
    batched.journal.apply_log_entry(entries[0], revision=4)
    batched.journal.record_failed_entry(entries[1], ended.outcome, revision=4)
    batched.journal.apply_log_entry(entries[2], revision=4)
    assert batched.journal_page(0, 10).entries == single.journal_page(0, 10).entries
    assert batched.query([S("SELECT v FROM t")])[0].rows == [(2,)]  # the 1 was rolled back
    for node in (leader, single, batched):
        node.close()


def test_an_entry_stopped_at_the_step_limit_in_a_batch_runs_once(
    tmp_path: Path, step_limit_stops: list[bool]
) -> None:
    """Review of the apply loop: SQLite ends the transaction of an interrupted write, so a
    statement stopped at the write step limit (~100 s of work) ended its batch, and the
    fallback ran it again. BatchEnded carries its outcome: it runs once, and what it
    answers is what running it alone answers."""
    stopped = step_limit_stops
    leader, single, batched = (Store(NodeConfig(data_dir=tmp_path / n)) for n in "lsb")
    leader.journal.set_mode(Mode.LEADER)
    for node in (single, batched):
        node.journal.set_mode(Mode.FOLLOWER)
    entries = [
        leader.journal.prepare_entry([S("CREATE TABLE e(v)")]),
        leader.journal.prepare_entry([S("INSERT INTO e VALUES(1)")]),
        leader.journal.prepare_entry([S(ENDLESS_WRITE, (0,)), S("INSERT INTO e VALUES(2)")]),
        leader.journal.prepare_entry([S("INSERT INTO e VALUES(3)")]),
    ]
    alone = [single.journal.apply_log_entry(e, revision=3) for e in entries]
    assert len(stopped) == 1
    ended = batched.journal.apply_log_entries(entries, revision=3)
    assert len(stopped) == 2  # once in the batch
    assert isinstance(ended, BatchEnded) and ended.index == 2
    assert [r.error for r in ended.outcome.results] == [r.error for r in alone[2].results]
    assert ended.outcome.results[0].error == WRITE_LIMIT_ERROR
    assert batched.journal.apply_log_entries(entries[:2], revision=3) is not None
    batched.journal.record_failed_entry(entries[2], ended.outcome, revision=3)
    batched.journal.apply_log_entry(entries[3], revision=3)
    assert len(stopped) == 2  # not run again
    assert batched.journal_page(0, 10).entries == single.journal_page(0, 10).entries
    assert batched.changes(0, 10) == single.changes(0, 10)
    for node in (leader, single, batched):
        node.close()


def _fk_store(path: Path) -> Store:
    store = Store(NodeConfig(data_dir=path, foreign_keys=True))
    return store


FK_SCHEMA = [
    S("CREATE TABLE parent(id INTEGER PRIMARY KEY)"),
    S(
        "CREATE TABLE child(id INTEGER PRIMARY KEY, "
        "p REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
    ),
]


def test_deferred_foreign_key_violations_fail_the_request_and_change_nothing(
    tmp_path: Path,
) -> None:
    store = _fk_store(tmp_path / "n")
    store.execute(FK_SCHEMA)
    last = store.journal.last_cid()
    out = store.execute([S("INSERT INTO child VALUES(1, 7)")])
    assert out.cid is None
    assert out.results[0].error == "FOREIGN KEY constraint failed"
    assert store.journal.last_cid() == last and store.changes(last, 10) == []
    ok = store.execute(
        [S("INSERT INTO child VALUES(1, 7)"), S("INSERT INTO parent VALUES(7)")], transaction=True
    )  # fixed within the same request: fine
    assert ok.cid is not None
    store.close()


def test_outside_a_transaction_only_the_statement_leaving_a_deferred_violation_fails(
    tmp_path: Path,
) -> None:
    """QA: a request without `transaction` whose middle statement left a deferred
    violation failed whole at its end; rqlite commits each statement, so the others stay
    (and a statement resolving a violation later does not save it)."""
    store = _fk_store(tmp_path / "n")
    store.execute(FK_SCHEMA)
    out = store.execute(
        [
            S("INSERT INTO parent VALUES(5)"),
            S("INSERT INTO child VALUES(1, 99)"),
            S("INSERT INTO parent VALUES(6)"),
            S("INSERT INTO child VALUES(2, 7)"),
            S("INSERT INTO parent VALUES(7)"),
        ]
    )
    assert [r.error for r in out.results] == [
        None, "FOREIGN KEY constraint failed", None, "FOREIGN KEY constraint failed", None,
    ]  # fmt: skip
    assert out.cid is not None
    rows = store.query([S("SELECT id FROM parent"), S("SELECT count(*) FROM child")])
    assert [r.rows for r in rows] == [[(5,), (6,), (7,)], [(0,)]]
    assert [(c.table, c.op) for c in store.changes(out.cid - 1, 10)] == [("parent", "insert")] * 3
    text = store.journal_page(out.cid - 1, 1).entries[0].query
    assert text is not None and "child" not in text
    store.close()


def test_deferred_foreign_keys_give_the_same_result_batched_or_one_by_one(
    tmp_path: Path,
) -> None:
    leader, single, batched = (_fk_store(tmp_path / n) for n in ("l", "s", "b"))
    leader.journal.set_mode(Mode.LEADER)
    single.journal.set_mode(Mode.FOLLOWER)
    batched.journal.set_mode(Mode.FOLLOWER)
    entries = [
        leader.journal.prepare_entry(FK_SCHEMA),
        leader.journal.prepare_entry([S("INSERT INTO child VALUES(1, 7)")]),  # no parent yet
        leader.journal.prepare_entry([S("INSERT INTO parent VALUES(7)")]),
    ]
    for entry in entries:
        single.journal.apply_log_entry(entry, revision=9)
    outcomes = batched.journal.apply_log_entries(entries, revision=9)
    assert outcomes is not None
    assert [o.cid for o in outcomes] == [2, None, 4]  # the child entry fails in both
    assert batched.journal_page(0, 10).entries == single.journal_page(0, 10).entries
    for store in (leader, single, batched):
        store.close()


def test_defer_foreign_keys_lasts_one_entry_batched_or_not(tmp_path: Path) -> None:
    """PRAGMA defer_foreign_keys (a load's, or a client's) lasts until its transaction
    ends; entries applied as one batch share a SQLite transaction, so it must not carry
    over to the next entry there either."""
    leader, single, batched = (_fk_store(tmp_path / n) for n in ("l", "s", "b"))
    leader.journal.set_mode(Mode.LEADER)
    single.journal.set_mode(Mode.FOLLOWER)
    batched.journal.set_mode(Mode.FOLLOWER)
    immediate = [
        S("CREATE TABLE parent(id INTEGER PRIMARY KEY)"),
        S("CREATE TABLE child(id INTEGER PRIMARY KEY, p REFERENCES parent(id))"),
    ]
    child_first = [S("INSERT INTO child VALUES(1, 7)"), S("INSERT INTO parent VALUES(7)")]
    entries = [
        leader.journal.prepare_entry(immediate),
        leader.journal.prepare_entry(
            [S("PRAGMA defer_foreign_keys=ON"), *child_first], transaction=True
        ),
        leader.journal.prepare_entry(
            [S("INSERT INTO child VALUES(2, 8)"), S("INSERT INTO parent VALUES(8)")],
            transaction=True,
        ),
    ]
    for entry in entries:
        single.journal.apply_log_entry(entry, revision=9)
    outcomes = batched.journal.apply_log_entries(entries, revision=9)
    assert outcomes is not None
    assert [o.cid for o in outcomes] == [2, 3, None]  # the third: no deferral of its own
    assert batched.journal_page(0, 10).entries == single.journal_page(0, 10).entries
    for store in (leader, single, batched):
        store.close()


def test_an_environmental_error_fails_the_whole_write_instead_of_one_statement(
    store: Store,
) -> None:
    import apsw

    store.execute([S("CREATE TABLE t(b)")])
    last = store.journal.last_cid()
    pages = store.engine._internal("PRAGMA page_count")[0][0]
    store.engine._internal(f"PRAGMA max_page_count={pages + 2}")  # a nearly full disk
    with pytest.raises(apsw.FullError):
        store.execute([S("INSERT INTO t VALUES(1)"), S("INSERT INTO t VALUES(zeroblob(100000))")])
    assert store.journal.last_cid() == last  # not recorded as a failed statement
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]


def test_a_data_directory_opens_in_one_store_at_a_time(tmp_path: Path) -> None:
    first = Store(NodeConfig(data_dir=tmp_path / "node"))
    with pytest.raises(ConfigError, match="is in use by another litecdc node"):
        Store(NodeConfig(data_dir=tmp_path / "node"))
    first.close()
    again = Store(NodeConfig(data_dir=tmp_path / "node"))  # closing let it go
    again.close()


def test_a_database_reached_through_a_symbolic_link_opens_in_one_store_at_a_time(
    tmp_path: Path,
) -> None:
    """Config QA: B/db.sqlite -> A/db.sqlite passed B's own directory lock; B wrote cid 3
    into A's journal and A then failed every write (UNIQUE constraint failed:
    _litecdc_journal.cid)."""
    first = Store(NodeConfig(data_dir=tmp_path / "a"))
    first.execute([S("CREATE TABLE t(v)")])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "db.sqlite").symlink_to(tmp_path / "a" / "db.sqlite")
    real = tmp_path / "a" / "db.sqlite"
    with pytest.raises(
        ConfigError,
        match=f"database {tmp_path}/b/db.sqlite \\(the file {real}\\) is in use by another "
        "litecdc node: each node needs a database of its own",
    ):
        Store(NodeConfig(data_dir=tmp_path / "b"))
    first.execute([S("INSERT INTO t VALUES(1)")])  # A goes on
    first.close()
    linked = Store(NodeConfig(data_dir=tmp_path / "b"))  # and the other way round
    with pytest.raises(ConfigError, match="is in use by another litecdc node"):
        Store(NodeConfig(data_dir=tmp_path / "a"))
    assert linked.query([S("SELECT v FROM t")])[0].rows == [(1,)]
    linked.close()


def _entry(store: Store, cid: int | None) -> tuple[int, int]:
    assert cid is not None
    entry = store.journal_page(cid - 1, 1).entries[0]
    return entry.cid, entry.snapshot


def test_writing_sqlite_sequence_is_a_barrier_and_is_committed(tmp_path: Path) -> None:
    """AUTOINCREMENT inserts read sqlite_sequence without telling the authorizer: a write
    to it must be seen by every later insert on every replica (review: a replica applying
    out of order gave the next row id 2 instead of 1001)."""
    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    store.execute(
        [
            S("CREATE TABLE a(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"),
            S("CREATE TABLE b(x)"),
            S("CREATE TABLE c(x)"),
        ]
    )
    store.execute([S("INSERT INTO a(v) VALUES(1)")])
    store.execute([S("INSERT INTO c VALUES(1)")])
    alone = store.execute([S("UPDATE sqlite_sequence SET seq = 500 WHERE name = 'a'")])
    assert alone.cid is not None, "a write of sqlite_sequence alone was dropped"
    assert _entry(store, alone.cid) == (alone.cid, alone.cid - 1)
    mixed = store.execute(
        [S("UPDATE sqlite_sequence SET seq = 1000 WHERE name = 'a'"), S("INSERT INTO b VALUES(1)")]
    )
    assert _entry(store, mixed.cid) == (mixed.cid, mixed.cid - 1)  # type: ignore[operator]
    store.close()
    store = Store(NodeConfig(data_dir=tmp_path / "node"))  # the barrier survives a restart
    later = store.execute([S("INSERT INTO a(v) VALUES(6)")])
    assert later.results[0].last_insert_id == 1001
    assert _entry(store, later.cid)[1] == mixed.cid
    # SQLite's own table is not data: no change event for it
    changes = store.changes(alone.cid - 1, 10)
    assert [(c.cid, c.table) for c in changes] == [(mixed.cid, "b"), (later.cid, "a")]
    store.close()


def test_foreign_key_check_in_a_write_reads_every_table(store: Store) -> None:
    store.execute(
        [
            S("CREATE TABLE p(id INTEGER PRIMARY KEY)"),
            S("CREATE TABLE c(id INTEGER PRIMARY KEY, pid REFERENCES p(id))"),
            S("CREATE TABLE z(n)"),
        ]
    )
    store.execute([S("INSERT INTO c VALUES(1, 42)")])
    check = store.execute([S("INSERT INTO z SELECT count(*) FROM pragma_foreign_key_check")])
    assert _entry(store, check.cid) == (check.cid, check.cid - 1)  # type: ignore[operator]
    later = store.execute([S("INSERT INTO c VALUES(2, 43)")])
    assert _entry(store, later.cid)[1] == check.cid  # must not overtake the check


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO d SELECT rootpage FROM sqlite_schema WHERE name = 'd'",
        "CREATE TABLE q(x); INSERT INTO d SELECT rootpage FROM sqlite_schema WHERE name = 'q'",
        "CREATE TABLE q2 AS SELECT rootpage FROM sqlite_master",
    ],
)
def test_the_file_layout_cannot_be_read_in_a_write(store: Store, sql: str) -> None:
    store.execute([S("CREATE TABLE d(v)")])
    before = store.journal.last_cid()
    out = store.execute([S(sql)])
    assert "rootpage describes the file layout" in (out.results[0].error or "")
    assert store.journal.last_cid() == before
    # SQLite's own reads of it (DROP TABLE / DROP INDEX move root pages) are fine
    fine = store.execute(
        [S("CREATE TABLE e(x); CREATE INDEX ex ON e(x); DROP INDEX ex; DROP TABLE e")]
    )
    assert fine.results[0].error is None and fine.cid is not None


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE foo RENAME TO _litecdc_foo",
        'ALTER TABLE foo RENAME TO "_litecdc_journal2"',
        "CREATE TABLE _litecdc_mine(x)",
        "CREATE VIEW _litecdc_v AS SELECT 1",
    ],
)
def test_client_objects_cannot_take_the_internal_prefix(store: Store, sql: str) -> None:
    store.execute([S("CREATE TABLE foo(x)"), S("INSERT INTO foo VALUES(1)")])
    before = store.journal.last_cid()
    out = store.execute([S(sql)])
    assert "_litecdc_" in (out.results[0].error or ""), out.results[0]
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT x FROM foo")])[0].rows == [(1,)]


def test_a_store_that_fails_to_open_lets_go_of_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import litecdc.store

    def broken(engine: object) -> None:
        raise RuntimeError("journal state unreadable")

    monkeypatch.setattr(litecdc.store, "Journal", broken)
    with pytest.raises(RuntimeError):
        Store(NodeConfig(data_dir=tmp_path / "node"))
    monkeypatch.undo()
    Store(NodeConfig(data_dir=tmp_path / "node")).close()  # not "in use" by ourselves


def test_statements_dropped_from_the_access_cache_keep_their_dependencies(store: Store) -> None:
    """The cache of each SQL text's read/write sets is bounded (it grew by ~1 KB per
    distinct text, without end); a text dropped from it while SQLite still has its
    prepared statement is recorded again, so its dependencies stay exact."""
    store.engine._access_cache = AccessCache(max_entries=2)
    store.execute([S("CREATE TABLE a(x)"), S("CREATE TABLE b(x)")])
    read_b = "INSERT INTO a SELECT x FROM b"
    store.execute([S(read_b)])  # cid 3: cached
    store.execute([S("INSERT INTO b VALUES(1)")])  # cid 4
    for value in range(3):  # cids 5-7: distinct texts push read_b out of the cache
        store.execute([S(f"INSERT INTO a VALUES({value})")])
    assert store.engine._access_cache.get(read_b) is None
    again = store.execute([S(read_b)])  # reads b (cid 4), writes a (cid 7)
    assert again.snapshot == 7
    store.execute([S("INSERT INTO b VALUES(2)")])  # cid 9
    assert store.execute([S(read_b)]).snapshot == 9  # cached again: b's last writer
    assert len(store.engine._access_cache) == 2


def test_the_access_cache_is_bounded_by_entries_and_characters() -> None:
    cache = AccessCache(max_entries=3)
    for name in "abc":
        cache.put(name, Access(writes={name}))
    assert cache.get("a") is not None  # used: now the most recent
    cache.put("d", Access())  # one entry too many: b, the least recently used, goes
    assert [cache.get(t) is not None for t in "abcd"] == [True, False, True, True]
    by_size = AccessCache(max_entries=100, max_chars=320)  # texts of 20 characters at most
    texts = [f"{i:020d}" for i in range(17)]
    for text in texts:
        by_size.put(text, Access())
    assert len(by_size) == 16 and by_size.get(texts[0]) is None  # 340 > 320: the first went
    by_size.put("x" * 21, Access())  # longer than a sixteenth of the budget: not kept
    assert by_size.get("x" * 21) is None and len(by_size) == 16
    by_size.clear()
    assert len(by_size) == 0


def test_distinct_sql_texts_do_not_grow_the_access_cache_without_end(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    limit = store.engine._access_cache.max_entries
    store.execute([S(f"INSERT INTO t VALUES({i})") for i in range(limit + 500)], transaction=True)
    assert len(store.engine._access_cache) == limit
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(limit + 500,)]


def test_an_entry_interrupted_from_outside_is_not_recorded_as_failed(tmp_path: Path) -> None:
    """Review QA: a cluster node leaving interrupts the entry its apply loop runs; landing
    in the trigger check's internal DROP TRIGGER, the interrupt rolled the transaction back
    and the check's ROLLBACK TO then failed with "no such savepoint" — taken for the
    statement's own error, the entry was recorded empty on this replica alone. (The
    interrupt is injected at that statement: the race cannot be timed in a test.)"""
    from litecdc.results import LogEntry

    store = Store(NodeConfig(data_dir=tmp_path / "n"))
    store.execute(
        [S("CREATE TABLE t(x)"), S("CREATE TRIGGER tr1 AFTER INSERT ON t BEGIN SELECT 1; END")]
    )
    engine = store.engine
    store.journal.set_mode(Mode.FOLLOWER)
    last = store.journal.last_cid()
    real_internal = engine._internal
    fired: list[bool] = []

    def interrupting(sql: str, params: object = None) -> object:
        if sql.startswith("DROP TRIGGER") and not fired:

            def at_first_step() -> bool:
                if not fired:
                    fired.append(True)
                    engine.interrupt_writes()  # what ClusterNode.close() does
                return False

            engine._writer.set_progress_handler(at_first_step, 1)
            try:
                return real_internal(sql, params)
            finally:
                engine._writer.set_progress_handler(
                    engine._past_write_limit, engine_module.WRITE_CHECK_STEPS
                )
        return real_internal(sql, params)

    engine._internal = interrupting  # type: ignore[method-assign]
    entry = LogEntry(
        last + 1, last, 1_700_000_000_000, 42,
        ("CREATE TRIGGER tr2 AFTER INSERT ON t BEGIN SELECT 2; END",), False, False,
    )  # fmt: skip
    try:
        with pytest.raises(apsw.InterruptError):
            store.journal.apply_log_entry(entry, revision=7)
    finally:
        engine._internal = real_internal  # type: ignore[method-assign]
    assert fired and store.journal.last_cid() == last  # not recorded: applied again later
    out = store.journal.apply_log_entry(entry, revision=7)  # the retry
    assert out.cid == last + 1
    triggers = store.query([S("SELECT name FROM sqlite_schema WHERE type = 'trigger'")])
    assert triggers[0].rows == [("tr1",), ("tr2",)]
    store.close()


def test_a_barrier_forgets_the_cids_of_every_other_name(tmp_path: Path) -> None:
    """Soak QA: _litecdc_table_cids (and the journal's memory of it) kept a row for every
    table or index name ever used, dropped ones too. No name's cid can outweigh a later
    barrier in a snapshot, so a barrier forgets them: the rows stay as many as the names
    touched since the last schema change, and snapshots are what they were."""
    store = Store(NodeConfig(data_dir=tmp_path / "n"))
    try:
        store.execute([S("CREATE TABLE keep(v)")])
        for i in range(30):  # staging tables, made, filled and dropped
            store.execute([S(f"CREATE TABLE stage{i}(v)"), S(f"INSERT INTO stage{i} VALUES(1)")])
            store.execute([S(f"DROP TABLE stage{i}")])
        names = store.query([S("SELECT name FROM _litecdc_table_cids ORDER BY name")])[0].rows
        assert names == [("sqlite_schema",)]
        barrier = store.execute([S("CREATE TABLE other(v)")]).cid
        assert barrier is not None
        first = store.execute([S("INSERT INTO keep VALUES(1)")])
        assert first.snapshot == barrier  # on the last schema change
        second = store.execute([S("INSERT INTO keep SELECT v FROM keep")])
        assert second.snapshot == first.cid  # on keep's last writer
        third = store.execute([S("INSERT INTO other VALUES(1)")])
        assert third.snapshot == barrier  # other was not written since
    finally:
        store.close()
    reopened = Store(NodeConfig(data_dir=tmp_path / "n"))  # the same, read back from the table
    try:
        fourth = reopened.execute([S("INSERT INTO keep VALUES(2)")])
        assert fourth.snapshot == second.cid
        assert reopened.execute([S("INSERT INTO other SELECT v FROM keep")]).snapshot == (
            fourth.cid  # keep's last writer, later than other's (third)
        )
    finally:
        reopened.close()
