"""Splitting an uploaded SQL text into statements (db/load.py), as SQLite's shell does."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from litecdc.db.load import children_first, is_dump_wrapper, load_statements, split_statements

TRICKY = (
    'CREATE TABLE "a;b"(x, [c;d], `e;f`);\n'
    "INSERT INTO \"a;b\" VALUES('it''s; fine', 'x', 'y');\n"
    '/* a block; comment */ INSERT INTO "a;b" VALUES(1, 2, 3);\n'
    "-- a line; comment\n"
    'CREATE TRIGGER t AFTER INSERT ON "a;b" BEGIN\n'
    "  UPDATE \"a;b\" SET x = CASE WHEN NEW.x > 0 THEN 'p;' ELSE 'n' END;\n"
    '  DELETE FROM "a;b" WHERE 0;\n'
    "END;\n"
    'INSERT INTO "a;b" VALUES(5, 6, 7)'  # the last one without its ';'
)


def test_semicolons_in_strings_names_comments_and_trigger_bodies_do_not_split() -> None:
    statements = split_statements(TRICKY)
    assert len(statements) == 5
    assert "".join(statements) == TRICKY  # nothing lost or added
    assert all(apsw.complete(s if s.rstrip().endswith(";") else s + ";") for s in statements)
    assert statements[3].lstrip().startswith("-- a line; comment\nCREATE TRIGGER")
    # and SQLite runs them to the same database as the whole text
    whole, split = apsw.Connection(":memory:"), apsw.Connection(":memory:")
    whole.execute(TRICKY)
    for statement in statements:
        split.execute(statement)
    query = 'SELECT * FROM "a;b" ORDER BY rowid'
    assert whole.execute(query).fetchall() == split.execute(query).fetchall()


@pytest.mark.parametrize(
    ("statement", "wrapper"),
    [
        ("PRAGMA foreign_keys=OFF;", True),
        ("  pragma  FOREIGN_KEYS = 0 ;", True),
        ("PRAGMA main.foreign_keys(off);", True),
        ("BEGIN TRANSACTION;", True),
        ("\n-- dumped by sqlite3\nBEGIN;", True),
        ("begin immediate transaction;", True),
        ("COMMIT;", True),
        ("END TRANSACTION;", True),
        ("PRAGMA foreign_key_check;", False),
        ("PRAGMA user_version=3;", False),
        ("ROLLBACK;", False),  # a dump that failed: the load must fail, not drop it
        ("CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1; END;", False),
        ("INSERT INTO begin VALUES(1);", False),
    ],
)
def test_a_dumps_wrapper_is_recognised(statement: str, wrapper: bool) -> None:
    assert is_dump_wrapper(statement) is wrapper


def test_the_statements_a_load_runs() -> None:
    dump = (
        "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE t(x);\n"
        "INSERT INTO t VALUES(1);\n;\n  ;\nCOMMIT;\n-- the end\n"
    )
    assert load_statements(dump) == ["\nCREATE TABLE t(x);", "\nINSERT INTO t VALUES(1);"]
    assert load_statements("-- only a comment") == []
    assert load_statements("INSERT INTO t VALUES('unterminated;") == [
        "INSERT INTO t VALUES('unterminated;"  # left whole: SQLite reports the error
    ]


@pytest.mark.parametrize(
    ("pragma", "deferred"),
    [
        ("PRAGMA foreign_keys=OFF;", True),
        ("pragma main.foreign_keys = 'off';", True),
        ("PRAGMA foreign_keys(0);", True),
        ("PRAGMA foreign_keys=ON;", False),
    ],
)
def test_a_dumps_foreign_keys_off_becomes_deferred_checks_with_fk(
    pragma: str, deferred: bool
) -> None:
    """foreign_keys cannot change inside the load's transaction: with --fk, the checks
    wait for its end instead (the closest), so a dump's rows load in the dump's order."""
    text = f"{pragma}\nBEGIN TRANSACTION;\nINSERT INTO t VALUES(1);\nCOMMIT;\n"
    expected = ["PRAGMA defer_foreign_keys=ON;"] if deferred else []
    assert load_statements(text, defer_foreign_keys=True) == [
        *expected,
        "\nINSERT INTO t VALUES(1);",
    ]
    assert load_statements(text) == ["\nINSERT INTO t VALUES(1);"]


def test_tables_are_emptied_children_first() -> None:
    references = {"kid": {"MOM"}, "mom": {"mom", "gran"}, "gran": set(), "x": {"y"}, "y": {"x"}}
    assert children_first(["gran", "mom", "kid"], references) == ["kid", "mom", "gran"]
    # a cycle: in its given order, after what is free
    assert children_first(["x", "y", "gran"], references) == ["gran", "x", "y"]
    assert children_first([], references) == []


def test_a_file_row_past_sqlites_statement_limit_says_so(tmp_path: Path) -> None:
    """Scale QA: a file holding a 510 MB blob failed to load with SQLite's bare "string or
    blob too big" (its row, as hex SQL text for the journal, passed the 1,000,000,000-byte
    statement limit). The limit is lowered here, on the node's own connection, to stand in
    for a blob of that size."""
    from litecdc import NodeConfig, Statement, Store
    from litecdc.errors import LoadError

    made = tmp_path / "big.db"
    conn = apsw.Connection(str(made))
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")
    conn.execute("INSERT INTO t VALUES(1, ?)", (bytes(20_000),))
    conn.close()
    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    try:
        store.execute([Statement("CREATE TABLE kept(x)"), Statement("INSERT INTO kept VALUES(1)")])
        store.engine._writer.limit(apsw.SQLITE_LIMIT_SQL_LENGTH, 30_000)
        with pytest.raises(LoadError) as refused:
            store.load(made.read_bytes())
        message = str(refused.value)
        assert message.startswith("load: the SQLite file failed: string or blob too big"), message
        assert "larger than SQLite's limit of 1,000,000,000 bytes a statement" in message
        assert store.query([Statement("SELECT x FROM kept")])[0].rows == [(1,)]  # unchanged
    finally:
        store.close()
