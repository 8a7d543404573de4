"""Replaying the journal reproduces the database: from SQL text alone, and on a follower
with the entries' timestamps and seeds (random(), 'now', CURRENT_TIMESTAMP defaults)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import apsw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litecdc import Mode, NodeConfig, Statement, Store

S = Statement
TABLES = ("a", "b")


def _rows_sql(name: str, without_rowid: bool) -> str:
    return f'SELECT {"" if without_rowid else "rowid, "}* FROM "{name}" ORDER BY 1'


def contents_of_store(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    names = (
        store.query(
            [
                S(
                    "SELECT name, wr FROM pragma_table_list WHERE schema='main' AND "
                    "type='table' AND name NOT LIKE 'sqlite%' AND "
                    "substr(name,1,9) <> '_litecdc_' ORDER BY name"
                )
            ]
        )[0].rows
        or []
    )
    return {n: store.query([S(_rows_sql(n, wr))])[0].rows or [] for (n, wr) in names}


def contents_of_connection(conn: apsw.Connection) -> dict[str, list[tuple[Any, ...]]]:
    names = conn.execute(
        "SELECT name, wr FROM pragma_table_list WHERE schema='main' AND "
        "type='table' AND name NOT LIKE 'sqlite%' ORDER BY name"
    ).fetchall()
    return {n: conn.execute(_rows_sql(n, wr)).fetchall() for (n, wr) in names}


def replay_sql_text(store: Store) -> apsw.Connection:
    conn = apsw.Connection(":memory:")
    for entry in store.journal_page(0, 10_000).entries:
        if entry.query:
            with conn:
                conn.execute(entry.query)
    return conn


def test_rebuild_from_journal_sql_text_alone(store: Store) -> None:
    store.execute(
        [
            S("CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT, f REAL, b BLOB)"),
            S("CREATE INDEX t_s ON t(s)"),
            S("CREATE TABLE u(k TEXT PRIMARY KEY, n) WITHOUT ROWID"),
        ]
    )
    store.execute(
        [
            S("INSERT INTO t(s, f, b) VALUES(?, ?, ?)", (f"r{i}'\x00", i / 7, bytes([i])))
            for i in range(30)
        ],
        transaction=True,
    )
    store.execute(
        [
            S("INSERT INTO u VALUES(:k, :n)", {"k": "x", "n": 0.1 + 0.2}),
            S("UPDATE t SET f = f * 3 WHERE id % 2 = 0"),
            S("DELETE FROM t WHERE id > 25"),
            S("INSERT INTO u SELECT s, f FROM t WHERE id < 3"),
        ]
    )
    store.execute([S("ALTER TABLE t ADD COLUMN extra DEFAULT 7"), S("UPDATE t SET extra = -1")])
    rebuilt = replay_sql_text(store)
    assert contents_of_connection(rebuilt) == contents_of_store(store)


def test_text_with_thousands_of_nuls_replays_on_a_follower_from_sql_and_from_a_dump(
    tmp_path: Path,
) -> None:
    """Scale QA: a text holding ~1000 NULs was journaled as text around each char(0)
    joined by ||, an expression as deep as the NULs were many; SQLite refuses one over
    1000 deep ("Expression tree is too large"): replaying the journal lost the row, a
    follower skipped the entry (the replicas differed), and the backup did not load."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    many = "x\x00'" * 5000
    private = "".join(map(chr, range(0xE000, 0xE010)))  # (the stand-in is one the text lacks)
    leader.execute(
        [
            S("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"),
            S("INSERT INTO t VALUES(1, ?)", (many,)),
            S("INSERT INTO t VALUES(?, ?)", (2, private + "\x00" + private)),
        ]
    )
    leader.execute([S("INSERT INTO t VALUES(?, ?)", (i, f"{i}\x00" * 1500)) for i in (3, 4)])
    expected = contents_of_store(leader)
    assert expected["t"][0] == (1, 1, many)
    assert contents_of_connection(replay_sql_text(leader)) == expected
    follower = _follower_replay(leader, tmp_path / "follower")
    assert contents_of_store(follower) == expected
    dump = leader.dump_sql()
    loaded = apsw.Connection(":memory:")
    loaded.execute(dump)
    assert contents_of_connection(loaded) == expected


def _follower_replay(leader: Store, path: Path, seed: int | None = None) -> Store:
    """Apply the leader's entries on a new follower. With ``seed``, in a random order that
    only respects each entry's snapshot, as hctree allows a follower to."""
    follower = Store(NodeConfig(data_dir=path))
    follower.journal.set_mode(Mode.FOLLOWER)
    pending = leader.journal_page(1, 10_000).entries
    rng = random.Random(seed)
    while pending:
        ready = [e for e in pending if e.snapshot <= follower.journal.available_snapshot()]
        entry = ready[0] if seed is None else rng.choice(ready)
        follower.journal.follower_commit(entry)
        pending.remove(entry)
    return follower


def test_random_time_and_defaults_replay_identically(tmp_path: Path) -> None:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute(
        [
            S(
                "CREATE TABLE t(id INTEGER PRIMARY KEY, r, rb, now, ts DEFAULT CURRENT_TIMESTAMP,"
                " d DEFAULT (datetime('now', 'subsec')), j)"
            )
        ]
    )
    for _ in range(3):
        leader.execute(
            [
                S(
                    "INSERT INTO t(r, rb, now, j) VALUES(random(), randomblob(8), datetime('now'),"
                    " julianday('now'))"
                ),
                S("INSERT INTO nope VALUES(random())"),  # fails: must not shift the random sequence
                S(
                    "INSERT INTO t(r, rb, now, j) SELECT random(), randomblob(3), unixepoch('now'),"
                    " strftime('%f', 'now')"
                ),
            ]
        )
        time.sleep(0.01)
    follower = _follower_replay(leader, tmp_path / "follower")
    assert contents_of_store(follower) == contents_of_store(leader)
    assert len(contents_of_store(leader)["t"]) == 6
    assert follower.changes(0, 100) == leader.changes(0, 100)
    # and a different seed/time would have produced different values
    values = contents_of_store(leader)["t"]
    assert len({row[1] for row in values}) == 6
    leader.close()
    follower.close()


values = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
statements = st.one_of(
    st.builds(
        lambda t, k, v: S(f"INSERT INTO {t}(k, v) VALUES(?, ?)", (k, v)),
        st.sampled_from(TABLES),
        st.integers(0, 20),
        values,
    ),
    st.builds(
        lambda t, k, v: S(f"UPDATE {t} SET v = ?, r = random() WHERE k = ?", (v, k)),
        st.sampled_from(TABLES),
        st.integers(0, 20),
        values,
    ),
    st.builds(
        lambda t, k: S(f"DELETE FROM {t} WHERE k >= ?", (k,)),
        st.sampled_from(TABLES),
        st.integers(0, 20),
    ),
    st.builds(
        lambda s, d: S(
            f"INSERT OR REPLACE INTO {d}(k, v, r) SELECT k + 100, v, randomblob(2) FROM {s}"
        ),
        st.sampled_from(TABLES),
        st.sampled_from(TABLES),
    ),
    st.just(S("INSERT INTO a(k, v) VALUES(1, 'dup')")),  # may fail: duplicate key
)
transactions = st.lists(
    st.tuples(st.lists(statements, min_size=1, max_size=5), st.booleans()), min_size=1, max_size=12
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(transactions, st.integers(0, 2**32))
def test_random_transactions_replayed_from_the_journal_reproduce_the_database(
    tmp_path_factory: Any, txns: list[tuple[list[Statement], bool]], order_seed: int
) -> None:
    base = tmp_path_factory.mktemp("prop")
    leader = Store(NodeConfig(data_dir=base / "leader"))
    leader.execute(
        [
            S(f"CREATE TABLE {t}(k INTEGER PRIMARY KEY, v, r, ts DEFAULT CURRENT_TIMESTAMP)")
            for t in TABLES
        ]
    )
    for stmts, transaction in txns:
        leader.execute(stmts, transaction=transaction)
    follower = _follower_replay(leader, base / "follower", seed=order_seed)
    assert contents_of_store(follower) == contents_of_store(leader)
    assert sorted(follower.changes(0, 10_000), key=lambda c: (c.cid, c.seq)) == leader.changes(
        0, 10_000
    )
    # the captured changes, applied in order, rebuild each table too
    mirror: dict[tuple[str, int], dict[str, Any]] = {}
    for change in leader.changes(0, 10_000):
        if change.op in ("delete", "update"):
            del mirror[(change.table, change.old_rowid)]  # type: ignore[arg-type]
        if change.after is not None:
            mirror[(change.table, change.new_rowid)] = change.after  # type: ignore[index]
    expected = {
        (t, row[0]): row[1:] for t, rows in contents_of_store(leader).items() for row in rows
    }
    assert {k: tuple(v.values()) for k, v in mirror.items()} == expected
    leader.close()
    follower.close()


def _assert_any_order_replays(leader: Store, tmp_path: Path) -> None:
    for seed in range(20):
        follower = _follower_replay(leader, tmp_path / f"f{seed}", seed=seed)
        assert contents_of_store(follower) == contents_of_store(leader), seed
        follower.close()


def test_a_write_after_a_read_waits_for_the_read(tmp_path: Path) -> None:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute([S("CREATE TABLE a(x)"), S("CREATE TABLE b(n)"), S("CREATE TABLE c(x)")])
    leader.execute([S("INSERT INTO a VALUES(1)")])
    leader.execute([S("INSERT INTO c VALUES(1)")])
    leader.execute([S("INSERT INTO b SELECT count(*) FROM a")])  # reads a
    out = leader.execute([S("INSERT INTO a VALUES(2)")])  # must not overtake the read
    assert out.snapshot == out.cid - 1  # type: ignore[operator]
    _assert_any_order_replays(leader, tmp_path)
    leader.close()


def test_statements_after_a_rename_depend_on_it(tmp_path: Path) -> None:
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute([S("CREATE TABLE a(x)"), S("CREATE TABLE other(x)")])
    leader.execute([S("INSERT INTO other VALUES(1)")])
    leader.execute([S("ALTER TABLE a RENAME TO b")])
    leader.execute([S("INSERT INTO other VALUES(2)")])
    leader.execute([S("INSERT INTO b VALUES(1)")])
    leader.execute([S("INSERT INTO other SELECT count(*) FROM sqlite_schema")])
    _assert_any_order_replays(leader, tmp_path)
    leader.close()


def test_replicas_record_the_same_reshapes(tmp_path: Path) -> None:
    """The cid of each table's last reshape (db/reshape.py: what the pipeline re-copies a
    table for), and of the last commit that changed its rows without row changes, are
    decided statement by statement as the entries run, so a follower —
    applying the journal in order or in any order its snapshots allow — records what the
    leader did. A failed statement records nothing, on either."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    cid = {}

    def commit(name: str, *sql: str, transaction: bool = False) -> None:
        cid[name] = leader.execute([S(x) for x in sql], transaction=transaction).cid

    commit("created", "CREATE TABLE a(id INTEGER PRIMARY KEY, x, y)", "CREATE TABLE b(x)")
    commit("write", "INSERT INTO a VALUES(1, 2, 3)", "INSERT INTO b VALUES(1)")
    commit("added", "ALTER TABLE a ADD COLUMN z", "CREATE INDEX a_x ON a(x)")
    commit("a", "ALTER TABLE a DROP COLUMN z", "ALTER TABLE a ADD COLUMN z", transaction=True)
    commit("b", "DROP TABLE b; CREATE TABLE b(x)")  # one statement text holding two
    commit("c", "ALTER TABLE b RENAME TO c", "CREATE TABLE IF NOT EXISTS a(q)", "DROP TABLE no")
    commit("d", "CREATE TABLE d(x, w)", "ALTER TABLE d RENAME COLUMN x TO y")
    commit(  # the first statement fails after its DROP COLUMN ran: undone
        "failed",
        "ALTER TABLE d DROP COLUMN y; INSERT INTO no VALUES(1)",
        "INSERT INTO d VALUES(1, 2)",
    )
    assert leader.source_table("d")[0].column_names[1:] == ["y", "w"]  # (after the rowid)
    commit("e", "INSERT INTO d VALUES(1, 2)", "ALTER TABLE d RENAME TO E")
    expected = {"a": cid["a"], "c": cid["c"], "E": cid["e"]}
    assert leader.engine.reshaped_cids() == expected
    # rows changed without row changes: a column dropped from a table with rows, a table
    # with rows dropped (kept once the name is created again) or renamed (both names);
    # not DDL on empty tables (b again, renamed to c; d before its insert)
    unlogged = {"a": [cid["a"]], "b": [cid["b"]], "d": [cid["e"]], "e": [cid["e"]]}
    assert leader.engine.unlogged_cids() == unlogged
    for seed in (None, 1, 2):
        follower = _follower_replay(leader, tmp_path / f"f{seed}", seed=seed)
        assert follower.engine.reshaped_cids() == expected, seed
        assert follower.engine.unlogged_cids() == unlogged, seed
        assert contents_of_store(follower) == contents_of_store(leader)
        follower.close()
    leader.close()


def _follower_with(leader: Store, path: Path, **config: Any) -> Store:
    follower = Store(NodeConfig(data_dir=path, **config))
    follower.journal.set_mode(Mode.FOLLOWER)
    for entry in leader.journal_page(1, 10_000).entries:
        follower.journal.follower_commit(entry)
    return follower


def test_a_view_calling_random_draws_the_same_on_replicas(tmp_path: Path) -> None:
    """Journal QA: `? OR r FROM v`, with r a view's random(), ran with the value bound on
    the node (random() called per row) and folded on replay (never called), so every
    later random() of the entry differed. It now runs as its journal text, as `? OR
    random()` does — through a view of that view too."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute(
        [
            S("CREATE TABLE src(k INTEGER PRIMARY KEY, v)"),
            S("INSERT INTO src(v) VALUES (1), (2), (3)"),
            S("CREATE VIEW vr AS SELECT k, random() AS r FROM src"),
            S("CREATE VIEW outer_view AS SELECT * FROM vr"),
            S("CREATE TABLE log(id INTEGER PRIMARY KEY, x, y)"),
        ]
    )
    for view in ("vr", "outer_view"):
        out = leader.execute(
            [
                S(f"INSERT INTO log(x, y) SELECT ? OR r, k FROM {view}", (1,)),
                S("INSERT INTO log(x, y) VALUES (random(), 'after')"),
            ]
        )
        assert all(r.error is None for r in out.results), out.results
    follower = _follower_with(leader, tmp_path / "follower")  # (its random() is seeded)
    assert contents_of_store(follower) == contents_of_store(leader)
    leader.close()
    follower.close()


def test_a_failed_statement_leaves_no_defer_foreign_keys_behind(tmp_path: Path) -> None:
    """Journal QA (--fk): "PRAGMA defer_foreign_keys=ON; SELECT * FROM nonexistent"
    failed and was left out of the journal, but the pragma stayed set for the rest of
    the request on the leader only: its next statement committed there and failed on
    every replica."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader", foreign_keys=True))
    leader.execute(
        [
            S("CREATE TABLE p(id INTEGER PRIMARY KEY)"),
            S("CREATE TABLE c(id INTEGER PRIMARY KEY, pid REFERENCES p(id))"),
        ]
    )
    out = leader.execute(
        [
            S("PRAGMA defer_foreign_keys=ON; SELECT * FROM nonexistent"),
            S("INSERT INTO c VALUES (1, 5); INSERT INTO p VALUES (5)"),
        ]
    )
    assert out.results[0].error == "no such table: nonexistent"
    assert out.results[1].error == "FOREIGN KEY constraint failed"  # as on every replica
    # a pragma that did run (its statement succeeded) still lasts the request
    out = leader.execute(
        [
            S("PRAGMA defer_foreign_keys=ON"),
            S("INSERT INTO c VALUES (2, 6); INSERT INTO p VALUES (6)"),
        ]
    )
    assert [r.error for r in out.results] == [None, None]
    follower = _follower_with(leader, tmp_path / "follower", foreign_keys=True)
    assert contents_of_store(follower) == contents_of_store(leader)
    leader.close()
    follower.close()


def test_a_rolled_back_analyze_leaves_no_statistics_behind(tmp_path: Path) -> None:
    """Journal QA: a failed `ANALYZE t; SELECT * FROM nonexistent` rolled its sqlite_stat1
    rows back but left the statistics it computed loaded on the writer: the node planned
    with an index no replica chose, and an INSERT … SELECT numbered its rows otherwise."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute(
        [
            S("CREATE TABLE t(id INTEGER PRIMARY KEY, a, b)"),
            S("CREATE INDEX ta ON t(a)"),
            S("CREATE INDEX tb ON t(b)"),
            S("CREATE TABLE z(x)"),
        ]
    )
    leader.execute([S("INSERT INTO t(a, b) VALUES (?, ?)", (i % 2, -i)) for i in range(400)])
    leader.execute([S("ANALYZE z")])  # the statistics tables exist
    for failing, transaction in (
        ("ANALYZE t; SELECT * FROM nonexistent", False),  # the statement fails
        ("ANALYZE t", True),  # the request fails after it, and rolls it back
    ):
        statements = [S(failing)] + ([S("SELECT * FROM nonexistent")] if transaction else [])
        out = leader.execute(statements, transaction=transaction)
        assert out.cid is None
    leader.execute([S("CREATE TABLE out2(id INTEGER PRIMARY KEY, v)")])
    leader.execute([S("INSERT INTO out2(v) SELECT id FROM t WHERE a = 1 AND b < -390")])
    follower = _follower_with(leader, tmp_path / "follower")
    assert contents_of_store(follower)["out2"] == contents_of_store(leader)["out2"]
    leader.close()
    follower.close()
