"""A trigger whose body a write could never run is refused when it is created.

Trigger bodies run only inside writes, where litecdc's authorizer refuses what a
replica could not reproduce (internal tables, the file layout, statistics,
build-dependent pragmas, connection-dependent functions). SQLite judges a body only
when a statement fires it, so without a check at CREATE every write that fires such a
trigger would fail, on every node, forever.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from litecdc import NodeConfig, Statement, Store

S = Statement

SCHEMA = [
    S("CREATE TABLE t(x, y)"),
    S("CREATE TABLE log(v)"),
    S("CREATE VIEW v AS SELECT x, y FROM t"),
    S("CREATE INDEX ty ON t(y)"),
    S("INSERT INTO t VALUES(1, 2)"),
    S("ANALYZE t"),  # creates sqlite_stat1
]

BODIES = [
    (
        "INSERT INTO _litecdc_journal(cid, query, snapshot) VALUES(999, '', 0)",
        "internal to litecdc",
    ),
    ("DELETE FROM _litecdc_changes", "internal to litecdc"),
    ("UPDATE _litecdc_table_cids SET cid = 0", "internal to litecdc"),
    ("INSERT INTO log SELECT count(*) FROM _litecdc_journal", "internal to litecdc"),
    # created only when a CDC service first leads: SQLite cannot resolve it yet
    ("INSERT INTO _litecdc_cdc_state VALUES('hwm', 0)", "internal to litecdc"),
    ("DELETE FROM sqlite_stat1", "sqlite_stat1 cannot be written directly"),
    ("INSERT INTO log SELECT rootpage FROM sqlite_schema", "rootpage describes the file layout"),
    ("INSERT INTO log VALUES(changes())", "changes() cannot be used in a write"),
    ("INSERT INTO log VALUES(sqlite_version())", "differs between builds of SQLite"),
    ("INSERT INTO log SELECT name FROM pragma_function_list", "PRAGMA function_list"),
    ("INSERT INTO log SELECT page_count FROM pragma_page_count", "PRAGMA page_count"),
]

EVENTS = [  # (when, the statement that would fire it: None for a view without a trigger)
    ("AFTER INSERT ON t WHEN new.x > 0", "INSERT INTO t VALUES(3, 4)"),
    ("BEFORE UPDATE OF y ON t WHEN old.y <> new.y", "UPDATE t SET y = 5"),
    ("AFTER DELETE ON t WHEN old.x > 0", "DELETE FROM t"),
    ("INSTEAD OF INSERT ON v", None),
    ("INSTEAD OF UPDATE ON v", None),
]


def _triggers(store: Store) -> list[tuple[object, ...]]:
    return store.query([S("SELECT name FROM sqlite_schema WHERE type = 'trigger'")])[0].rows or []


@pytest.mark.parametrize(("body", "reason"), BODIES)
@pytest.mark.parametrize(("event", "fire"), EVENTS)
def test_a_trigger_that_no_write_could_run_is_refused_at_create(
    store: Store, body: str, reason: str, event: str, fire: str | None
) -> None:
    store.execute(SCHEMA)
    before = store.journal.last_cid()
    out = store.execute([S(f"CREATE TRIGGER tr {event} BEGIN {body}; END")])
    error = out.results[0].error or ""
    assert reason in error and "trigger tr" in error, error
    assert out.cid is None and store.journal.last_cid() == before
    assert _triggers(store) == []
    if fire is not None:  # and nothing stands in the way of the writes it would break
        fired = store.execute([S(fire)])
        assert fired.results[0].error is None and fired.cid is not None


def test_the_rest_of_the_request_commits_without_the_refused_trigger(store: Store) -> None:
    store.execute(SCHEMA)
    out = store.execute(
        [
            S("INSERT INTO log VALUES(1)"),
            S("CREATE TRIGGER bad AFTER INSERT ON t BEGIN DELETE FROM _litecdc_journal; END"),
            S("INSERT INTO log VALUES(2)"),
        ]
    )
    assert [r.error is None for r in out.results] == [True, False, True]
    assert out.cid is not None
    entry = store.journal_page(out.cid - 1, 1).entries[0]
    assert entry.query == "INSERT INTO log VALUES(1);\nINSERT INTO log VALUES(2);"
    assert _triggers(store) == []


def test_a_refused_trigger_fails_a_whole_transaction(store: Store) -> None:
    store.execute(SCHEMA)
    before = store.journal.last_cid()
    out = store.execute(
        [
            S("INSERT INTO log VALUES(1)"),
            S("CREATE TRIGGER bad AFTER DELETE ON t BEGIN DELETE FROM sqlite_stat1; END"),
        ],
        transaction=True,
    )
    assert "trigger bad" in (out.results[1].error or "")
    assert out.cid is None and store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) FROM log")])[0].rows == [(0,)]
    assert _triggers(store) == []


def test_one_string_that_creates_a_bad_trigger_is_refused_whole(store: Store) -> None:
    store.execute(SCHEMA)
    before = store.journal.last_cid()
    out = store.execute(
        [
            S(
                "CREATE TABLE other(z); "
                "CREATE TRIGGER bad AFTER INSERT ON other BEGIN "
                "INSERT INTO log SELECT name FROM pragma_module_list; END"
            )
        ]
    )
    assert "trigger bad" in (out.results[0].error or ""), out.results[0].error
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) FROM sqlite_schema WHERE name = 'other'")])[0].rows == [
        (0,)
    ]


def test_a_body_naming_a_table_created_later_is_judged_when_it_appears(store: Store) -> None:
    """SQLite accepts a trigger whose body names a table that does not exist yet; the
    body can only be judged once it does, so the CREATE TABLE that completes it is
    refused instead."""
    store.execute(SCHEMA)
    out = store.execute(
        [
            S(
                "CREATE TRIGGER later AFTER INSERT ON t BEGIN "
                "INSERT INTO audit VALUES(new.x); DELETE FROM _litecdc_changes; END"
            )
        ]
    )
    assert out.results[0].error is None and out.cid is not None
    before = store.journal.last_cid()
    out = store.execute([S("CREATE TABLE audit(x)")])
    error = out.results[0].error or ""
    assert "trigger later" in error and "internal to litecdc" in error, error
    assert store.journal.last_cid() == before
    # dropping the trigger makes room for the table
    fine = store.execute([S("DROP TRIGGER later"), S("CREATE TABLE audit(x)")])
    assert [r.error for r in fine.results] == [None, None]


def test_a_body_writing_statistics_is_judged_when_analyze_creates_them(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)"), S("CREATE INDEX tx ON t(x)")])
    out = store.execute(
        [S("CREATE TRIGGER st AFTER DELETE ON t BEGIN DELETE FROM sqlite_stat1; END")]
    )
    assert out.results[0].error is None  # no sqlite_stat1 yet: SQLite cannot compile it
    before = store.journal.last_cid()
    out = store.execute([S("ANALYZE t")])
    error = out.results[0].error or ""
    assert "trigger st" in error and "sqlite_stat1 cannot be written directly" in error, error
    assert store.journal.last_cid() == before
    stats = store.query([S("SELECT count(*) FROM sqlite_schema WHERE name = 'sqlite_stat1'")])
    assert stats[0].rows == [(0,)]


def test_triggers_that_writes_may_run_are_accepted(store: Store) -> None:
    """The same rules as a client's own statements: sqlite_sequence may be written (a
    barrier), statistics read, schema introspected, random() and 'now' are pinned."""
    store.execute([*SCHEMA, S("CREATE TABLE seq(id INTEGER PRIMARY KEY AUTOINCREMENT, v)")])
    out = store.execute(
        [
            S(
                "CREATE TRIGGER ok AFTER INSERT ON t BEGIN "
                "INSERT INTO seq(v) VALUES(new.x); "
                "UPDATE sqlite_sequence SET seq = seq + 10 WHERE name = 'seq'; "
                "INSERT INTO log SELECT count(*) FROM sqlite_stat1; "
                "INSERT INTO log SELECT count(*) FROM pragma_table_info('t'); "
                "INSERT INTO log VALUES(random()), (datetime('now')); END"
            ),
            S("INSERT INTO t VALUES(7, 8)"),
        ]
    )
    assert [r.error for r in out.results] == [None, None]
    assert _triggers(store) == [("ok",)]
    assert store.query([S("SELECT count(*) FROM log")])[0].rows == [(4,)]


def test_an_older_bad_trigger_blocks_neither_new_triggers_nor_its_own_drop(
    tmp_path: Path,
) -> None:
    """A database may hold such a trigger from before these checks: it names itself when
    writes fail, and it stays possible to add other triggers and to drop it."""
    path = tmp_path / "node" / "db.sqlite"
    path.parent.mkdir()
    raw = apsw.Connection(str(path))
    raw.execute(
        "CREATE TABLE t(x); CREATE TABLE log(v); "
        "CREATE TRIGGER old_bad AFTER INSERT ON t BEGIN DELETE FROM _litecdc_changes; END"
    )
    raw.close()
    store = Store(NodeConfig(data_dir=path.parent))
    try:
        fired = store.execute([S("INSERT INTO t VALUES(1)")])
        assert "_litecdc_changes is internal" in (fired.results[0].error or "")
        out = store.execute(
            [S("CREATE TRIGGER good AFTER INSERT ON t BEGIN INSERT INTO log VALUES(new.x); END")]
        )
        assert out.results[0].error is None and out.cid is not None
        out = store.execute([S("DROP TRIGGER old_bad"), S("INSERT INTO t VALUES(2)")])
        assert [r.error for r in out.results] == [None, None]
        assert store.query([S("SELECT v FROM log")])[0].rows == [(2,)]
    finally:
        store.close()


def test_another_triggers_forward_reference_neither_hides_nor_blames(store: Store) -> None:
    """Review: a trigger on the same table naming a table not created yet stopped the
    test compilation (the bad trigger was accepted), and once that table appeared the
    innocent trigger was named for the bad one's refusal. Each trigger is judged alone."""
    store.execute(
        [
            S("CREATE TABLE t(x)"),
            S("CREATE TABLE log(v)"),
            S("CREATE TRIGGER fwd AFTER INSERT ON t BEGIN INSERT INTO audit VALUES(new.x); END"),
        ]
    )
    out = store.execute(
        [
            S(
                "CREATE TRIGGER bad AFTER INSERT ON t BEGIN "
                "INSERT INTO log SELECT name FROM pragma_function_list; END"
            )
        ]
    )
    error = out.results[0].error or ""
    assert "trigger bad" in error and "PRAGMA function_list" in error, error
    assert store.execute([S("CREATE TABLE audit(x)")]).results[0].error is None
    fired = store.execute([S("INSERT INTO t VALUES(1)")])
    assert fired.results[0].error is None
    assert store.query([S("SELECT x FROM audit")])[0].rows == [(1,)]


def test_a_view_read_by_a_bad_trigger_is_named_and_others_are_not_blamed(
    store: Store,
) -> None:
    store.execute(
        [
            S("CREATE TABLE t(x)"),
            S("CREATE TABLE log(v)"),
            S("CREATE VIEW fv AS SELECT name FROM pragma_function_list"),
        ]
    )
    out = store.execute(
        [S("CREATE TRIGGER bad AFTER INSERT ON t BEGIN INSERT INTO log SELECT * FROM fv; END")]
    )
    error = out.results[0].error or ""
    assert error.startswith("trigger bad would make every INSERT on t fail: PRAGMA function_list")
    assert error.endswith("(in fv)"), error


def test_upper_case_internal_names_are_refused_before_they_exist(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.execute(
        [
            S(
                "CREATE TRIGGER up AFTER INSERT ON t BEGIN "
                "INSERT INTO _LITECDC_CDC_STATE VALUES(1); END"
            )
        ]
    )
    assert "internal to litecdc" in (out.results[0].error or ""), out.results[0].error


def test_a_broken_view_does_not_stop_an_unrelated_create(store: Store) -> None:
    """Review: a view whose table was dropped cannot be described; a CREATE TABLE that
    an INSTEAD OF trigger on it names failed with SQLite's 'no such table' for the view."""
    store.execute(
        [
            S("CREATE TABLE x(a)"),
            S("CREATE VIEW v AS SELECT a FROM x"),
            S(
                "CREATE TRIGGER vi INSTEAD OF INSERT ON v BEGIN "
                "INSERT INTO audit VALUES(new.a); END"
            ),
            S("DROP TABLE x"),
        ]
    )
    out = store.execute([S("CREATE TABLE audit(a)")])
    assert out.results[0].error is None and out.cid is not None


def test_a_trigger_on_a_table_the_body_writes_cannot_hide_a_bad_one(store: Store) -> None:
    """Review: a trigger on u naming a missing table stopped the compilation of a bad
    trigger on t whose body writes u, which was then accepted."""
    store.execute(
        [
            S("CREATE TABLE t(a)"),
            S("CREATE TABLE u(a)"),
            S("CREATE TRIGGER tu AFTER INSERT ON u BEGIN INSERT INTO missing VALUES (1); END"),
        ]
    )
    out = store.execute(
        [
            S(
                "CREATE TRIGGER tt AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1); "
                "DELETE FROM _litecdc_changes; END"
            )
        ]
    )
    error = out.results[0].error or ""
    assert "trigger tt" in error and "internal to litecdc" in error, error
