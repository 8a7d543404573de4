"""What cannot be replayed identically is refused before commit, with the reason."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest
from test_replay import _follower_replay, contents_of_store

from litecdc import NodeConfig, Statement, Store

S = Statement


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("INSERT INTO t VALUES(last_insert_rowid())", "use the last_insert_id the write returns"),
        ("INSERT INTO t VALUES(changes())", "depends on the connection's previous statement"),
        ("INSERT INTO t VALUES(total_changes())", "depends on the connection's history"),
        ("INSERT INTO t VALUES(sqlite_version())", "differs between builds of SQLite"),
        ("INSERT INTO t VALUES(fts5_source_id())", "differs between builds of SQLite"),
        ("INSERT INTO t VALUES(fts3_tokenizer('simple'))", "the address of a tokenizer"),
        ("CREATE TEMP TABLE tmp(x)", "temporary objects exist on one connection only"),
        ("ATTACH 'other.db' AS other", "attached databases are not replicated"),
        ("PRAGMA journal_mode=DELETE", "PRAGMA journal_mode changes connection or file state"),
        # (engine QA: a no-op on the node, but heading a journal replayed into an empty file
        # it made a UTF-16 one)
        ("PRAGMA encoding = 'UTF-16le'", "PRAGMA encoding changes connection or file state"),
        (
            "PRAGMA foreign_keys = 1",
            "replicated; it is not allowed in writes: foreign key constraints are enforced on "
            "every node started with `litecdc serve --fk` (rqlite's -fk)",
        ),
        (
            "INSERT INTO t SELECT page_count FROM pragma_page_count",
            "PRAGMA page_count reads connection or file state that differs between replicas",
        ),
        ("INSERT INTO t SELECT count(*) FROM dbstat", "dbstat describes the file layout"),
        (
            "INSERT INTO t SELECT name FROM pragma_function_list",
            "PRAGMA function_list lists what this node's SQLite build",
        ),
        # refused for what the statement names, even when no row would be read
        ("INSERT INTO t SELECT name FROM pragma_function_list WHERE 0", "PRAGMA function_list"),
        ("INSERT INTO t SELECT name FROM pragma_module_list", "PRAGMA module_list lists"),
        ("INSERT INTO t SELECT * FROM pragma_compile_options", "PRAGMA compile_options lists"),
        ("INSERT INTO t SELECT count(*) FROM pragma_pragma_list", "PRAGMA pragma_list lists"),
        ("INSERT INTO t SELECT name FROM pragma_collation_list", "PRAGMA collation_list lists"),
        ("INSERT INTO t SELECT name FROM main.pragma_function_list", "PRAGMA function_list"),
        ("PRAGMA function_list", "can differ between replicas"),
        ("BEGIN", "transaction control statements are not allowed"),
        ("SAVEPOINT s", "transaction control statements are not allowed"),
        ("CREATE VIRTUAL TABLE v USING fts5(x)", "virtual tables are not supported"),
    ],
)
def test_unreplayable_writes_are_refused(store: Store, sql: str, reason: str) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    before = store.journal.last_cid()
    out = store.execute([S(sql)])
    assert out.cid is None
    assert reason in (out.results[0].error or ""), out.results[0].error
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]


def test_reads_may_use_them(store: Store) -> None:
    result = store.query([S("SELECT sqlite_version(), changes(), random() IS NOT NULL")])[0]
    assert result.error is None and result.rows and result.rows[0][2] == 1
    for pragma in ("function_list", "module_list", "compile_options", "pragma_list"):
        listed = store.query([S(f"SELECT count(*) FROM pragma_{pragma}")])[0]
        assert listed.error is None and listed.rows and listed.rows[0][0] > 0, pragma
    assert store.query([S("PRAGMA function_list")])[0].rows


def test_build_dependent_pragmas_are_refused_through_views_too(store: Store) -> None:
    store.execute(
        [S("CREATE TABLE t(x)"), S("CREATE VIEW fl AS SELECT name FROM pragma_function_list")]
    )
    before = store.journal.last_cid()
    out = store.execute([S("INSERT INTO t SELECT name FROM fl")])
    assert "PRAGMA function_list lists" in (out.results[0].error or ""), out.results[0].error
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) > 0 FROM fl")])[0].rows == [(1,)]


def test_a_table_named_like_a_pragma_is_an_ordinary_table(store: Store) -> None:
    store.execute(
        [
            S("CREATE TABLE t(x)"),
            S("CREATE TABLE pragma_function_list(name)"),
            S("INSERT INTO pragma_function_list VALUES('mine')"),
        ]
    )
    out = store.execute([S("INSERT INTO t SELECT name FROM pragma_function_list")])
    assert out.results[0].error is None and out.cid is not None
    assert store.query([S("SELECT x FROM t")])[0].rows == [("mine",)]


def test_introspection_pragmas_are_allowed_in_writes(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.execute([S("PRAGMA table_info(t)"), S("INSERT INTO t VALUES(1)")])
    assert out.results[0].error is None and out.results[0].rows
    assert out.cid is not None


def test_random_differs_between_entries_but_not_between_replays(store: Store) -> None:
    store.execute([S("CREATE TABLE t(r)")])
    store.execute([S("INSERT INTO t VALUES(random())")])
    store.execute([S("INSERT INTO t VALUES(random())")])
    rows = store.query([S("SELECT r FROM t")])[0].rows or []
    assert len({r[0] for r in rows}) == 2


def test_statistics_are_written_by_analyze_only(store: Store) -> None:
    """A client's rows in sqlite_stat1 would reach each replica's planner only at its next
    schema load (a restart): plans — and the rowids of INSERT … SELECT — would differ."""
    store.execute(
        [
            S("CREATE TABLE t(a, b)"),
            S("CREATE INDEX ia ON t(a)"),
            S("INSERT INTO t VALUES(1, 2)"),
            S("ANALYZE t"),
        ]
    )
    before = store.journal.last_cid()
    for sql in (
        "UPDATE sqlite_stat1 SET stat = '10 1'",
        "DELETE FROM sqlite_stat1",
        "DROP INDEX ia; DELETE FROM sqlite_stat1",  # judged per statement of the string
    ):
        out = store.execute([S(sql)])
        assert "sqlite_stat1 cannot be written directly" in (out.results[0].error or ""), sql
    assert store.journal.last_cid() == before
    # SQLite's own writes of them: ANALYZE again, DROP INDEX / TABLE, RENAME
    fine = store.execute(
        [S("ANALYZE t"), S("ALTER TABLE t RENAME TO t2"), S("DROP INDEX ia"), S("DROP TABLE t2")]
    )
    assert [r.error for r in fine.results] == [None] * 4 and fine.cid is not None


def test_statements_run_on_the_node_as_their_journal_text_replays(tmp_path: Path) -> None:
    """QA: a literal is not a bound value to SQLite. The node ran ``? OR random()`` with
    1 bound (random() called), its journal text ``1 OR random()`` is folded (not called),
    so every later random() of a replay differed; CREATE TABLE … AS named and typed its
    columns after ``?`` on the node and after the literals on replay."""
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.execute([S("CREATE TABLE f(a, b)")])
    leader.execute([S("INSERT INTO f(a, b) VALUES (? OR random(), random())", (1,))])
    leader.execute([S("CREATE TABLE c AS SELECT ?, 'x' || ?, ? AS n", (5, "abc", "a\x00b"))])
    leader.execute([S("INSERT INTO c VALUES (1, 2, 3)")])  # n: TEXT affinity on replay
    follower = _follower_replay(leader, tmp_path / "follower")
    assert contents_of_store(follower) == contents_of_store(leader)
    columns = S("SELECT name, type FROM pragma_table_xinfo('c')")
    assert follower.query([columns])[0].rows == leader.query([columns])[0].rows


@pytest.mark.parametrize(
    "size",
    ["1e300", "-1e300", "'٣'", "' 7'", "'+5x'", "'x'", "2.9", "-3", "0", "'1e3'", "x'33'", "NULL"],
)
def test_randomblob_takes_its_size_as_sqlite_does(store: Store, size: str) -> None:
    """Determinism QA: randomblob(1e300) gave 1 byte (SQLite: string or blob too big),
    randomblob('٣') 3 bytes (SQLite: 1 — it reads ASCII digits only)."""
    plain = apsw.Connection(":memory:")
    try:
        expected: object = plain.execute(f"SELECT length(randomblob({size}))").fetchall()[0][0]
    except apsw.TooBigError:
        expected = "too big"
    store.execute([S("CREATE TABLE IF NOT EXISTS b(v)")])
    out = store.execute([S(f"INSERT INTO b VALUES (length(randomblob({size}))) RETURNING v")])
    got = out.results[0].rows[0][0] if out.results[0].rows else out.results[0].error
    assert got == expected or (expected == "too big" and "too big" in str(got)), got
