"""Row-change capture: every op, every value type, full before/after images."""

from __future__ import annotations

import math
from pathlib import Path

import apsw
import pytest

from litecdc import NodeConfig, Statement, Store
from litecdc.errors import LoadError

S = Statement


def test_insert_update_delete_with_full_images_and_exact_types(store: Store) -> None:
    store.execute(
        [S("CREATE TABLE t(id INTEGER PRIMARY KEY, i INTEGER, f REAL, s TEXT, b BLOB, n)")]
    )
    big, tiny = 2**63 - 1, 5e-324
    out = store.execute(
        [
            S(
                "INSERT INTO t VALUES(?, ?, ?, ?, ?, ?)",
                (1, -(2**63), tiny, "é\x00", b"\x00\xff", None),
            ),
            S("INSERT INTO t VALUES(2, ?, ?, '', X'', NULL)", (big, math.inf)),
            S("UPDATE t SET s = 'changed' WHERE id = 1"),
            S("DELETE FROM t WHERE id = 2"),
        ],
        transaction=True,
    )
    changes = store.changes(out.cid - 1, 100)  # type: ignore[operator]
    assert [(c.cid, c.seq, c.table, c.op) for c in changes] == [
        (out.cid, 1, "t", "insert"),
        (out.cid, 2, "t", "insert"),
        (out.cid, 3, "t", "update"),
        (out.cid, 4, "t", "delete"),
    ]
    first = {"id": 1, "i": -(2**63), "f": tiny, "s": "é\x00", "b": b"\x00\xff", "n": None}
    second = {"id": 2, "i": big, "f": math.inf, "s": "", "b": b"", "n": None}
    assert changes[0].before is None and changes[0].after == first
    assert changes[1].after == second
    assert changes[2].before == first and changes[2].after == {**first, "s": "changed"}
    assert changes[3].before == second and changes[3].after is None
    assert [(c.old_rowid, c.new_rowid, c.pk) for c in changes] == [
        (None, 1, {"id": 1}),
        (None, 2, {"id": 2}),
        (1, 1, {"id": 1}),
        (2, None, {"id": 2}),
    ]
    assert all(isinstance(c.after["b"], bytes) for c in changes[:2] if c.after)


@pytest.mark.parametrize(
    "columns",
    [
        ('"class"', '"a b"', '"f0"', '"é"'),  # any identifier-free names: encoded via a Struct
        ('"quo""te"', '"back\\slash"', '"tab\tname"'),  # names msgspec cannot rename to
    ],
)
def test_images_and_keys_are_the_maps_of_the_column_names(
    store: Store, columns: tuple[str, ...]
) -> None:
    names = [c[1:-1].replace('""', '"') for c in columns]
    store.execute([S(f"CREATE TABLE odd({', '.join(columns)}, PRIMARY KEY({columns[1]}))")])
    values = (*(1, "k", 2.5)[: len(columns) - 1], b"\x00")
    placeholders = ", ".join("?" * len(columns))
    out = store.execute(
        [
            S(f"INSERT INTO odd VALUES({placeholders})", values),
            S(f"UPDATE odd SET {columns[0]} = 7"),
            S("DELETE FROM odd"),
        ]
    )
    changes = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    row = dict(zip(names, values, strict=True))
    updated = {**row, names[0]: 7}
    assert [(c.op, c.pk, c.before, c.after) for c in changes] == [
        ("insert", {names[1]: row[names[1]]}, None, row),
        ("update", {names[1]: row[names[1]]}, row, updated),
        ("delete", {names[1]: row[names[1]]}, updated, None),
    ]
    # the stored maps list the columns in table order, as the wire formats show them
    assert [list(c.after or {}) for c in changes[:2]] == [names, names]


def test_primary_key_kinds(store: Store) -> None:
    store.execute(
        [
            S("CREATE TABLE plain(a, b)"),
            S("CREATE TABLE composite(a TEXT, b INTEGER, c, PRIMARY KEY(b, a))"),
            S("CREATE TABLE wr(k TEXT PRIMARY KEY, v) WITHOUT ROWID"),
        ]
    )
    out = store.execute(
        [
            S("INSERT INTO plain VALUES('x', 1)"),
            S("INSERT INTO composite VALUES('x', 2, 3)"),
            S("INSERT INTO wr VALUES('k', 1)"),
            S("UPDATE plain SET rowid = 10"),
        ]
    )
    changes = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    assert [c.pk for c in changes] == [{"rowid": 1}, {"b": 2, "a": "x"}, {"k": "k"}, {"rowid": 10}]
    assert (changes[3].old_rowid, changes[3].new_rowid) == (1, 10)


def test_trigger_and_cascade_changes_are_captured(store: Store) -> None:
    store.execute(
        [
            S("CREATE TABLE t(x)"),
            S("CREATE TABLE log(msg)"),
            S(
                "CREATE TRIGGER tr AFTER INSERT ON t "
                "BEGIN INSERT INTO log VALUES('got ' || new.x); END"
            ),
        ]
    )
    out = store.execute([S("INSERT INTO t VALUES(5)")])
    assert [(c.table, c.after) for c in store.changes(out.cid - 1, 10)] == [  # type: ignore[operator]
        ("t", {"x": 5}),
        ("log", {"msg": "got 5"}),
    ]
    assert out.snapshot == 2  # trigger's target log counts as written


def test_delete_all_rows_reports_each_row(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    store.execute([S("INSERT INTO t VALUES(1)"), S("INSERT INTO t VALUES(2)")])
    out = store.execute([S("DELETE FROM t")])
    assert [c.before for c in store.changes(out.cid - 1, 10)] == [{"x": 1}, {"x": 2}]  # type: ignore[operator]


def test_replace_conflict_reports_the_replaced_row(store: Store) -> None:
    store.execute([S("CREATE TABLE t(k PRIMARY KEY, v)"), S("INSERT INTO t VALUES('a', 1)")])
    out = store.execute([S("INSERT OR REPLACE INTO t VALUES('a', 2)")])
    changes = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    assert [(c.op, c.before, c.after) for c in changes] == [
        ("delete", {"k": "a", "v": 1}, None),
        ("insert", None, {"k": "a", "v": 2}),
    ]


def test_internal_tables_reject_writes_and_emit_nothing(store: Store) -> None:
    out = store.execute(
        [
            S("INSERT INTO _litecdc_changes(cid) VALUES(1)"),
            S("DELETE FROM _litecdc_journal"),
            S("DROP TABLE _litecdc_journal"),
            S("CREATE INDEX i ON _litecdc_changes(tbl)"),
        ]
    )
    assert all("internal to litecdc" in (r.error or "") for r in out.results)
    assert out.cid is None
    assert store.changes(0, 10) == []
    # reads are allowed
    assert store.query([S("SELECT count(*) FROM _litecdc_journal")])[0].rows == [(1,)]


def test_litecdcs_names_are_taken_in_any_case(store: Store) -> None:
    """Security QA: CREATE TABLE _LITECDC_CDC_STATE (SQLite compares names without case)
    was accepted; litecdc's CREATE TABLE IF NOT EXISTS then took it for its own, and the
    client's high watermark of 10**9 silenced CDC delivery."""
    store.execute([S("CREATE TABLE t(x)")])
    out = store.execute(
        [
            S("CREATE TABLE _LITECDC_CDC_STATE(name TEXT PRIMARY KEY, value)"),
            S("CREATE TABLE _LiteCDC_holds(junk)"),
            S("CREATE VIEW _LITECDC_V AS SELECT 1"),
            S("CREATE INDEX _LITECDC_I ON t(x)"),
            S("CREATE TRIGGER _Litecdc_tr AFTER INSERT ON t BEGIN SELECT 1; END"),
            S("ALTER TABLE t RENAME TO _LITECDC_T"),
        ]
    )
    assert out.cid is None
    for result in out.results[:5]:
        assert "is internal to litecdc and cannot be changed" in str(result.error), result
    assert "reserved for litecdc's internal tables; rename it" in str(out.results[5].error)
    tables = store.query([S("SELECT lower(name) FROM sqlite_schema WHERE name LIKE '_lite%'")])
    assert ("_litecdc_cdc_state",) not in tables[0].rows and ("t",) not in tables[0].rows


def test_foreign_keys_to_litecdcs_tables_are_refused(store: Store) -> None:
    """Engine QA: CREATE TABLE … REFERENCES _litecdc_journal was accepted; with --fk the
    node's journal trim then failed on it, or (ON DELETE CASCADE) deleted the client's
    rows with no change event, differently on each replica."""
    store.execute([S("CREATE TABLE t(x)"), S("CREATE TABLE p(id INTEGER PRIMARY KEY)")])
    before = store.journal.last_cid()
    for sql in (
        "CREATE TABLE fk(x REFERENCES _litecdc_journal(cid))",
        "CREATE TABLE fk(x REFERENCES _LITECDC_JOURNAL(cid) ON DELETE CASCADE)",
        "CREATE TABLE fk(x, FOREIGN KEY(x) REFERENCES _litecdc_changes(cid))",
        "ALTER TABLE t ADD COLUMN y REFERENCES _litecdc_holds(name)",
    ):
        out = store.execute([S(sql)])
        assert out.cid is None, sql
        assert "one of litecdc's internal tables, is not allowed" in str(out.results[0].error)
    assert store.journal.last_cid() == before
    columns = store.query([S("SELECT name FROM pragma_table_info('t')")])[0].rows
    assert columns == [("x",)]
    assert store.query([S("SELECT count(*) FROM sqlite_schema WHERE name = 'fk'")])[0].rows == [
        (0,)
    ]
    # a foreign key between client tables is as before
    assert store.execute([S("CREATE TABLE c(x REFERENCES p(id))")]).results[0].error is None


@pytest.mark.parametrize("params", ["ab", b"ab", {1, 2}, 5])
def test_parameters_that_are_not_a_sequence_or_mapping_are_refused(
    store: Store, params: object
) -> None:
    """Engine QA: a str was bound as its characters (('ab') stored 'a', 'b'), a bytes as
    its byte values; other kinds got APSW's words."""
    store.execute([S("CREATE TABLE t(a, b)")])
    before = store.journal.last_cid()
    wanted = f"a mapping of names to values; got {type(params).__name__}"
    for transaction in (False, True):
        statements = [S("INSERT INTO t VALUES(?, ?)", params)] * 2  # type: ignore[arg-type]
        out = store.execute(statements, transaction=transaction)
        assert out.cid is None
        assert wanted in str(out.results[0].error), out.results
    read = store.query([S("SELECT ?, ?", params), S("SELECT 2")])  # type: ignore[arg-type]
    assert wanted in str(read[0].error) and read[1].rows == [(2,)]
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]


def test_litecdcs_table_under_a_name_in_another_case_from_before_stays_internal(
    tmp_path: Path,
) -> None:
    """Review QA: a _LITECDC_CDC_STATE a client made before the prefix was reserved in
    any case is litecdc's table for SQLite; it was writable (and renamable) under that
    stored name."""
    from litecdc import NodeConfig

    plain = apsw.Connection(str(tmp_path / "db.sqlite"))
    plain.execute("CREATE TABLE _LITECDC_CDC_STATE(name TEXT PRIMARY KEY, value)")
    plain.close()
    adopted = Store(NodeConfig(data_dir=tmp_path))
    try:
        out = adopted.execute(
            [
                S("INSERT INTO _LITECDC_CDC_STATE VALUES('hwm', 1000000000)"),
                S("ALTER TABLE _LITECDC_CDC_STATE RENAME TO mine"),
                S("DROP TABLE _litecdc_cdc_state"),
            ]
        )
        for result in out.results:
            assert "internal to litecdc" in str(result.error), result
        assert adopted.execute([S("CREATE TABLE other(y)")]).results[0].error is None
    finally:
        adopted.close()


def test_objects_in_litecdcs_names_from_before_are_warned_of_and_can_be_renamed_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A data directory may hold such objects from before litecdc refused the names: the
    node warns at start, DDL goes on (review QA: with two of them every DDL failed, each
    naming the other, the renames included), and the renames that fix them work."""
    from litecdc import NodeConfig

    plain = apsw.Connection(str(tmp_path / "db.sqlite"))
    plain.execute(
        "CREATE TABLE _LITECDC_MINE(x); INSERT INTO _LITECDC_MINE VALUES(1);"
        "CREATE TABLE _LITECDC_MINE2(y); CREATE INDEX _LITECDC_I ON _LITECDC_MINE2(y)"
    )
    plain.close()
    with caplog.at_level("WARNING", logger="litecdc.db"):
        adopted = Store(NodeConfig(data_dir=tmp_path))
    assert "_LITECDC_MINE: names starting with _litecdc_" in caplog.text
    try:
        out = adopted.execute(
            [
                S("CREATE TABLE other(y)"),
                S("ALTER TABLE _LITECDC_MINE RENAME TO mine"),
                S("DROP INDEX _LITECDC_I"),
                S("ALTER TABLE _LITECDC_MINE2 RENAME TO mine2"),
            ]
        )
        assert [r.error for r in out.results] == [None] * 4
        assert adopted.query([S("SELECT x FROM mine")])[0].rows == [(1,)]
        out = adopted.execute([S("ALTER TABLE mine RENAME TO _LITECDC_BACK")])
        assert "reserved for litecdc's internal tables" in str(out.results[0].error)
    finally:
        adopted.close()


def test_virtual_generated_columns_are_refused_with_a_reason(store: Store) -> None:
    out = store.execute([S("CREATE TABLE t(a, b AS (a * 2) VIRTUAL)")])
    assert "VIRTUAL generated column b" in (out.results[0].error or "")
    out = store.execute(
        [S("CREATE TABLE t(a, b AS (a * 2) STORED)"), S("INSERT INTO t(a) VALUES(2)")]
    )
    assert store.changes(0, 10)[0].after == {"a": 2, "b": 4}


@pytest.mark.parametrize("transaction", [True, False])
def test_captured_changes_match_table_contents_after_a_mixed_workload(
    store: Store, transaction: bool
) -> None:
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    store.execute(
        [S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(50)], transaction=transaction
    )
    store.execute(
        [S("UPDATE t SET v = v * 10 WHERE id % 3 = 0"), S("DELETE FROM t WHERE id % 5 = 0")],
        transaction=transaction,
    )
    mirror: dict[int, object] = {}
    for change in store.changes(0, 10_000):
        if change.op == "delete":
            del mirror[change.old_rowid]  # type: ignore[arg-type]
        else:
            mirror[change.new_rowid] = change.after["v"]  # type: ignore[index]
    rows = store.query([S("SELECT id, v FROM t")])[0].rows
    assert mirror == dict(rows or [])


def test_schema_changes_inside_a_transaction_keep_each_event_labelled(store: Store) -> None:
    store.execute([S("CREATE TABLE t(a)"), S("INSERT INTO t VALUES(1)")])
    out = store.execute(
        [
            S("INSERT INTO t VALUES(2)"),
            S("ALTER TABLE t ADD COLUMN b DEFAULT 'x'"),
            S("INSERT INTO t VALUES(3, 'y')"),
            S("DELETE FROM t"),
            S("DROP TABLE t"),
            S("CREATE TABLE t(z PRIMARY KEY)"),
            S("INSERT INTO t VALUES('new')"),
        ],
        transaction=True,
    )
    changes = store.changes(out.cid - 1, 100)  # type: ignore[operator]
    assert [(c.op, c.before, c.after) for c in changes] == [
        ("insert", None, {"a": 2}),
        ("insert", None, {"a": 3, "b": "y"}),
        ("delete", {"a": 1, "b": "x"}, None),
        ("delete", {"a": 2, "b": "x"}, None),
        ("delete", {"a": 3, "b": "y"}, None),
        ("insert", None, {"z": "new"}),
    ]
    assert changes[-1].pk == {"z": "new"}


def test_load_replaces_everything_as_one_captured_transaction(store: Store, tmp_path: Path) -> None:
    store.execute([S("CREATE TABLE old(x)"), S("INSERT INTO old VALUES(1)")])
    source = apsw.Connection(str(tmp_path / "source.db"))
    source.execute(
        "CREATE TABLE fresh(id INTEGER PRIMARY KEY, v BLOB); "
        "INSERT INTO fresh VALUES(1, x'00ff'), (2, NULL); CREATE INDEX fv ON fresh(v)"
    )
    source.close()
    out = store.load((tmp_path / "source.db").read_bytes())
    assert out.cid is not None
    changes = store.changes(out.cid - 1, 100)
    assert [(c.table, c.op) for c in changes] == [
        ("old", "delete"),
        ("fresh", "insert"),
        ("fresh", "insert"),
    ]
    assert store.query([S("SELECT * FROM fresh")])[0].rows == [(1, b"\x00\xff"), (2, None)]
    assert "no such table" in (store.query([S("SELECT * FROM old")])[0].error or "")


def test_load_of_sql_text_runs_it_on_the_database_as_rqlite_does(store: Store) -> None:
    """rqlite executes an uploaded SQL text (only a SQLite file replaces the database);
    litecdc dropped every table not in the text, and a text without writes emptied the
    database. The dump's BEGIN/COMMIT/PRAGMA foreign_keys wrapper is left out."""
    store.execute([S("CREATE TABLE keep(x)"), S("INSERT INTO keep VALUES(1)")])
    out = store.load(
        b"PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\nCREATE TABLE d(a);\n"
        b"INSERT INTO d VALUES('it''s;');\n-- a comment; with a semicolon\n"
        b"CREATE TRIGGER dt AFTER INSERT ON d BEGIN INSERT INTO keep VALUES(NEW.a); END;\n"
        b"INSERT INTO d VALUES(2);\nCOMMIT;\n"
    )
    assert out.cid is not None
    assert store.query([S("SELECT a FROM d")])[0].rows == [("it's;",), (2,)]
    assert store.query([S("SELECT x FROM keep")])[0].rows == [(1,), (2,)]
    changes = store.changes(out.cid - 1, 100)
    assert [(c.table, c.op, c.after) for c in changes] == [
        ("d", "insert", {"a": "it's;"}),
        ("d", "insert", {"a": 2}),
        ("keep", "insert", {"x": 2}),  # by the trigger the text created
    ]
    entry = store.journal_page(out.cid - 1, 1).entries[0]
    assert "BEGIN" not in entry.query.replace("BEGIN INSERT", "") and "COMMIT" not in entry.query
    before = store.journal.last_cid()
    for text in (b"SELECT count(*) FROM keep", b"-- nothing but a comment\n"):
        if text.startswith(b"SELECT"):
            assert store.load(text).cid is None  # nothing written: nothing committed
        else:
            with pytest.raises(LoadError, match=r"^load: the SQL text holds no statement$"):
                store.load(text)
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT count(*) FROM keep")])[0].rows == [(2,)]
    with pytest.raises(LoadError, match=r"^load: the SQL text failed: table d already exists$"):
        store.load(b"CREATE TABLE d(a); INSERT INTO keep VALUES(3);")
    assert store.journal.last_cid() == before


def test_load_of_text_that_is_not_utf8_is_refused_clearly(store: Store, tmp_path: Path) -> None:
    """A SQLite file holding such text ended /db/load with HTTP 500 (UnicodeDecodeError
    in the dump); litecdc refuses to store it from any write, with a message that says so."""
    source = apsw.Connection(str(tmp_path / "bad.db"))
    source.execute("CREATE TABLE inv(id INTEGER PRIMARY KEY, v TEXT)")
    source.execute("INSERT INTO inv VALUES(1, CAST(x'41ff41' AS TEXT))")
    source.close()
    before = store.journal.last_cid()
    with pytest.raises(LoadError) as refused:
        store.load((tmp_path / "bad.db").read_bytes())
    assert str(refused.value).startswith(
        "load: table inv holds text that is not valid UTF-8 (invalid start byte at byte 1: "
    )
    with pytest.raises(
        LoadError, match=r"^load: the SQL text failed: text that is not valid UTF-8"
    ):
        store.load(b"CREATE TABLE t(v TEXT); INSERT INTO t VALUES(CAST(x'ff' AS TEXT));")
    out = store.execute(
        [S("CREATE TABLE t(v TEXT)"), S("INSERT INTO t VALUES(CAST(x'ff' AS TEXT))")]
    )
    assert out.results[1].error == (
        "text that is not valid UTF-8 (invalid start byte at byte 0): litecdc keeps text as "
        "UTF-8; store such bytes as a BLOB (X'…' without CAST … AS TEXT)"
    )
    assert store.journal.last_cid() == before + 1  # only the CREATE TABLE


def test_returning_text_that_is_not_utf8_fails_that_statement_alone(store: Store) -> None:
    """SQL-surface QA: the row RETURNING gave failed to convert with the statement still
    running: the savepoint could not be rolled back ("SQL statements in progress"), the
    request was a 500 that lost its valid statements, and the next writes failed too."""
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")])
    before = store.journal.last_cid()
    bad = "UPDATE t SET b = x'ff' WHERE id = 1 RETURNING CAST(b AS TEXT)"
    out = store.execute(
        [S("INSERT INTO t VALUES(1, x'41')"), S(bad), S("INSERT INTO t VALUES(3, x'43')")]
    )
    assert out.results[0].error is None and out.results[2].error is None
    assert out.results[1].error is not None
    assert out.results[1].error.startswith("text that is not valid UTF-8 (invalid start byte")
    assert store.journal.last_cid() == before + 1
    for transaction in (False, True):
        out = store.execute([S(bad)], transaction=transaction)
        assert out.results[0].error is not None and "not valid UTF-8" in out.results[0].error
        out = store.execute([S("INSERT INTO t(b) VALUES(x'45')")])  # the next write
        assert out.results[0].error is None
    rows = store.query([S("SELECT id, b FROM t ORDER BY id")])[0].rows
    assert rows == [(1, b"A"), (3, b"C"), (4, b"E"), (5, b"E")]
    changes = [(c.op, c.after) for c in store.changes(before, 100)]
    assert changes == [
        ("insert", {"id": 1, "b": b"A"}), ("insert", {"id": 3, "b": b"C"}),
        ("insert", {"id": 4, "b": b"E"}), ("insert", {"id": 5, "b": b"E"}),
    ]  # fmt: skip
    # a read of such text is refused the same way, and leaves its reader usable
    out = store.query([S("SELECT id, CAST(x'ff' AS TEXT) FROM t")])
    assert out[0].error is not None
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(4,)]


def test_load_takes_a_wal_mode_file_such_as_a_backup(store: Store, tmp_path: Path) -> None:
    """Backups (litecdc's and rqlite's) are WAL-mode files; an in-memory scratch database
    cannot open those as they are."""
    store.execute(
        [S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"), S("INSERT INTO t VALUES(1, 'a')")]
    )
    store.backup(tmp_path / "backup.db")
    backup = (tmp_path / "backup.db").read_bytes()
    assert backup[18:20] == b"\x02\x02"  # WAL mode
    store.execute([S("INSERT INTO t VALUES(2, 'b')")])
    assert store.load(backup).cid is not None
    assert store.query([S("SELECT * FROM t")])[0].rows == [(1, "a")]

    wal = apsw.Connection(str(tmp_path / "other.db"))
    wal.execute("PRAGMA journal_mode=WAL").fetchall()
    wal.execute("CREATE TABLE w(x); INSERT INTO w VALUES(42)")
    wal.close()
    assert store.load((tmp_path / "other.db").read_bytes()).cid is not None
    assert store.query([S("SELECT * FROM w")])[0].rows == [(42,)]


def test_a_backup_finishes_while_writes_go_on(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backup QA: a 90 MB database's /db/backup never finished under a light, steady
    write load — copied 1024 pages at a time, it started again from page 1 after every
    commit in between. It is copied in one read transaction now: the writes go on (WAL)
    and the copy is the database as it was when it began. Here the writer commits after
    every step of the copy, as a steady load does sooner or later."""
    store.execute(
        [S("CREATE TABLE big(id INTEGER PRIMARY KEY, b BLOB)"), S("CREATE TABLE tick(x)")]
    )
    for _ in range(3):  # ~12 MB: three of the old chunks
        store.execute(
            [
                S(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                    "WHERE i < 1000) INSERT INTO big(b) SELECT randomblob(4000) FROM n"
                )
            ]
        )
    steps: list[int] = []

    class Copy:
        def __init__(self, inner: apsw.Backup) -> None:
            self.inner = inner

        def __enter__(self) -> Copy:
            self.inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> object:
            return self.inner.__exit__(*exc)

        @property
        def done(self) -> bool:
            return bool(self.inner.done)

        def step(self, pages: int = -1) -> bool:
            steps.append(pages)
            assert len(steps) < 100, "the copy starts again after every write"
            done = bool(self.inner.step(pages))
            store.execute([S("INSERT INTO tick VALUES(1)")])  # the writer commits meanwhile
            return done

    class WritesBetweenSteps(apsw.Connection):
        def backup(self, *args: object) -> Copy:  # type: ignore[override]
            return Copy(super().backup(*args))  # type: ignore[arg-type]

    monkeypatch.setattr(apsw, "Connection", WritesBetweenSteps)
    store.backup(tmp_path / "backup.db")
    monkeypatch.undo()
    copy = apsw.Connection(str(tmp_path / "backup.db"))
    assert copy.execute("SELECT count(*) FROM big").fetchall() == [(3000,)]
    assert copy.execute("SELECT count(*) FROM tick").fetchall() == [(0,)]  # (as it began)
    assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    copy.close()
    assert store.query([S("SELECT count(*) FROM tick")])[0].rows == [(len(steps),)]


def test_load_of_garbage_is_refused_and_changes_nothing(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    before = store.journal.last_cid()
    for body in (b"\xff\xfe not text", b"THIS IS NOT SQL", b"SQLite format 3\x00" + b"\x00" * 50):
        with pytest.raises(LoadError):
            store.load(body)
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT x FROM t")])[0].rows == [(1,)]


def test_load_of_a_damaged_file_that_still_reads_is_refused(store: Store, tmp_path: Path) -> None:
    """QA: a leaf page whose cell count was lowered by 2 reads as 2 rows fewer; the load
    replaced every table with what it read, and the 2 rows were gone without a word."""
    made = apsw.Connection(str(tmp_path / "damaged.db"))
    made.execute("CREATE TABLE big(id INTEGER PRIMARY KEY, v)")
    made.executemany("INSERT INTO big VALUES(?, ?)", [(i, "x" * 50) for i in range(1, 21)])
    made.close()
    data = bytearray((tmp_path / "damaged.db").read_bytes())
    page = 4096  # page 2: the table's only (leaf) page
    assert data[page] == 0x0D
    cells = int.from_bytes(data[page + 3 : page + 5], "big")
    data[page + 3 : page + 5] = (cells - 2).to_bytes(2, "big")
    store.execute([S("CREATE TABLE keep(v)"), S("INSERT INTO keep VALUES('precious')")])
    before = store.journal.last_cid()
    with pytest.raises(LoadError, match=r"^load: the uploaded SQLite file is damaged: "):
        store.load(bytes(data))
    assert store.journal.last_cid() == before
    assert store.query([S("SELECT v FROM keep")])[0].rows == [("precious",)]


def test_load_of_a_file_whose_rows_break_a_constraint_says_so(store: Store, tmp_path: Path) -> None:
    """SQL-surface QA: a sound file holding a row its CHECK refuses (written with
    ignore_check_constraints) was called "damaged"."""
    made = apsw.Connection(str(tmp_path / "checked.db"))
    made.execute("PRAGMA ignore_check_constraints = ON")
    made.execute("CREATE TABLE k(id INTEGER PRIMARY KEY, v INTEGER CHECK (v > 0))")
    made.execute("INSERT INTO k VALUES(1, 5), (2, -1)")
    made.close()
    before = store.journal.last_cid()
    with pytest.raises(LoadError) as refused:
        store.load((tmp_path / "checked.db").read_bytes())
    assert str(refused.value) == (
        "load: the uploaded SQLite file holds rows its tables' constraints refuse: CHECK "
        "constraint failed in k; fix or delete those rows, then load it again"
    )
    assert store.journal.last_cid() == before


def test_load_of_a_file_with_a_table_in_litecdcs_names_says_so(
    store: Store, tmp_path: Path
) -> None:
    """QA: a client table _litecdc_mine in the file was left out of the load without a
    word (a view on it then failed with "no such table")."""
    made = apsw.Connection(str(tmp_path / "plain.db"))
    made.execute("CREATE TABLE _litecdc_mine(x); CREATE TABLE ok(y)")
    made.close()
    store.execute([S("CREATE TABLE keep(v)")])
    with pytest.raises(LoadError, match=r"has a table named _litecdc_mine: names starting"):
        store.load((tmp_path / "plain.db").read_bytes())
    assert store.query([S("SELECT count(*) FROM keep")])[0].rows == [(0,)]
    # a litecdc backup's own internal tables are no problem
    store.backup(tmp_path / "backup.db")
    assert store.load((tmp_path / "backup.db").read_bytes()).cid is not None


def test_a_backup_with_recreated_views_and_trailing_comments_loads_both_ways(
    store: Store, tmp_path: Path
) -> None:
    """Backup QA: v2 reads v1, which was created again after it — the dump creates v2
    first, and litecdc's check of the new view's columns failed it ("no such table:
    main.v1"); a view ending in a -- comment swallowed the dump's ';' (sqlite3 could not
    load it either)."""
    from litecdc import NodeConfig

    store.execute(
        [
            S("CREATE TABLE t1(x)"),
            S("INSERT INTO t1 VALUES(1)"),
            S("CREATE VIEW v1 AS SELECT * FROM t1"),
            S("CREATE VIEW v2 AS SELECT * FROM v1"),
            S("DROP VIEW v1"),
            S("CREATE VIEW v1 AS SELECT x FROM t1"),
            S("CREATE VIEW vc AS SELECT x FROM t1 -- trailing comment"),
        ]
    )
    store.backup(tmp_path / "backup.db")
    for n, body in enumerate([(tmp_path / "backup.db").read_bytes(), store.dump_sql().encode()]):
        other = Store(NodeConfig(data_dir=tmp_path / f"other{n}"))
        try:
            outcome = other.load(body)
            assert outcome.cid is not None, outcome.results
            rows = other.query([S("SELECT * FROM v2"), S("SELECT * FROM vc")])
            assert [r.rows for r in rows] == [[(1,)], [(1,)]]
        finally:
            other.close()
    plain = apsw.Connection(":memory:")
    plain.execute(store.dump_sql())  # sqlite3 reads it as well
    assert plain.execute("SELECT * FROM vc").fetchall() == [(1,)]


def test_writes_to_an_adopted_table_with_a_virtual_column_say_why_they_fail(
    tmp_path: Path,
) -> None:
    """QA: they failed with "column index out of range" (CREATE and ALTER explain it)."""
    from litecdc import NodeConfig

    plain = apsw.Connection(str(tmp_path / "db.sqlite"))
    plain.execute("CREATE TABLE g(a, b AS (a * 2) VIRTUAL); INSERT INTO g(a) VALUES(1)")
    plain.close()
    adopted = Store(NodeConfig(data_dir=tmp_path))
    try:
        out = adopted.execute([S("INSERT INTO g(a) VALUES(2)"), S("DELETE FROM g")])
        for result in out.results:
            assert str(result.error).startswith("table g has VIRTUAL generated column b"), result
        assert adopted.query([S("SELECT a, b FROM g")])[0].rows == [(1, 2)]
    finally:
        adopted.close()


@pytest.mark.parametrize(
    "statistics",
    [
        # sqlite3 3.40's .dump of an analyzed database
        "ANALYZE sqlite_schema;\nINSERT INTO sqlite_stat1 VALUES('t','tv','3 2');\n",
        # rqlite's dump (db.go's Dump)
        "ANALYZE \"sqlite_master\";\nINSERT INTO \"sqlite_stat1\" VALUES('t','tv','3 2');\n",
        # other spellings a tool may write
        "INSERT OR REPLACE INTO \"main\".\"sqlite_stat1\" VALUES('t','tv','3 2');\n",
    ],
)
def test_a_dump_of_an_analyzed_database_loads(store: Store, statistics: str) -> None:
    """Backup QA: its rows of sqlite_stat1 are refused (a client may not write the
    planner's statistics), so the whole load failed; they are left out now."""
    dump = (
        "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\n"
        "CREATE TABLE t(id INTEGER PRIMARY KEY, v);\n"
        "INSERT INTO t VALUES(1,'a');\nINSERT INTO t VALUES(2,'b');\nINSERT INTO t VALUES(3,'a');\n"
        f"{statistics}CREATE INDEX tv ON t(v);\nCOMMIT;\n"
    )
    # on a node that has statistics of its own (review QA: the dump's ANALYZE sqlite_schema
    # then empties the statistics tables, which a client may not do either)
    store.execute([S("CREATE TABLE z(a)"), S("CREATE INDEX za ON z(a)"), S("ANALYZE z")])
    outcome = store.load(dump.encode())
    assert outcome.cid is not None, outcome.results
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(3,)]
    assert store.execute([S("ANALYZE t")]).results[0].error is None  # as the docs advise


def test_dump_and_load_tables_with_generated_columns(store: Store, tmp_path: Path) -> None:
    from litecdc import NodeConfig

    store.execute(
        [
            S("CREATE TABLE g(a INTEGER PRIMARY KEY, b, c AS (b * 2) STORED)"),
            S("INSERT INTO g(a, b) VALUES(1, 21)"),
        ]
    )
    dump = store.dump_sql()
    assert 'INSERT INTO "g"("a","b") VALUES(1,21);' in dump
    other = Store(NodeConfig(data_dir=tmp_path / "other", source_workers=0))
    try:
        out = other.load(dump.encode())
        assert out.cid is not None
        assert other.query([S("SELECT * FROM g")])[0].rows == [(1, 21, 42)]
    finally:
        other.close()


def _sqlite_file(path: Path, script: str) -> bytes:
    conn = apsw.Connection(str(path))
    conn.execute(script)
    conn.close()
    return path.read_bytes()


def test_load_of_a_file_fires_none_of_the_old_triggers(store: Store, tmp_path: Path) -> None:
    """QA: clearing the old rows fired the old delete trigger: its audit rows were in the
    change log, never deleted — a consumer rebuilding the tables from it kept them."""
    store.execute(
        [
            S("CREATE TABLE audit(id INTEGER PRIMARY KEY, msg)"),
            S("CREATE TABLE orders(id INTEGER PRIMARY KEY, v)"),
            S(
                "CREATE TRIGGER orders_del AFTER DELETE ON orders BEGIN "
                "INSERT INTO audit(msg) VALUES('deleted ' || old.id); END"
            ),
            S("INSERT INTO orders(v) VALUES('a'), ('b')"),
            S("DELETE FROM orders WHERE id = 2"),
        ]
    )
    backup = tmp_path / "backup.db"
    store.backup(backup)
    store.execute([S("INSERT INTO orders(v) VALUES('c')")])
    out = store.load(backup.read_bytes())
    assert out.cid is not None
    changes = store.changes(out.cid - 1, 100)
    deleted = sorted((c.table, c.pk["id"]) for c in changes if c.op == "delete")
    inserted = sorted((c.table, c.pk["id"]) for c in changes if c.op == "insert")
    assert deleted == [("audit", 1), ("orders", 1), ("orders", 2)]  # the rows there were
    assert inserted == [("audit", 1), ("orders", 1)]  # the file's rows
    assert not [c for c in changes if c.op == "update"]
    assert store.query([S("SELECT * FROM audit")])[0].rows == [(1, "deleted 2")]


def test_load_keeps_autoincrement_high_water_marks_and_rowids(store: Store, tmp_path: Path) -> None:
    """QA: a restored backup reused deleted AUTOINCREMENT ids (sqlite_sequence was not
    carried), and renumbered the rowids of tables without an INTEGER PRIMARY KEY — their
    key in change events."""
    store.execute(
        [
            S("CREATE TABLE ai(id INTEGER PRIMARY KEY AUTOINCREMENT, v)"),
            S("INSERT INTO ai(v) VALUES(1), (2), (3)"),
            S("DELETE FROM ai WHERE id = 3"),
            S("CREATE TABLE nr(v)"),
            S('CREATE TABLE "rowid taken"(rowid, oid, w)'),  # names the rowid as _rowid_
            S("CREATE TABLE dq(id INTEGER PRIMARY KEY DESC, v)"),  # id is no rowid (QA)
            S("INSERT INTO dq VALUES(5, 'a'), (9, 'b')"),
            S("DELETE FROM dq WHERE id = 5"),
            S("INSERT INTO nr VALUES(1), (2), (3)"),
            S('INSERT INTO "rowid taken" VALUES(7, 8, 9), (10, 11, 12)'),
            S("DELETE FROM nr WHERE v < 3"),
            S('DELETE FROM "rowid taken" WHERE w = 9'),
        ]
    )
    dump = store.dump_sql()
    assert "INSERT INTO sqlite_sequence(name, seq) VALUES('ai', 3);" in dump
    backup = tmp_path / "backup.db"
    store.backup(backup)
    store.execute([S("INSERT INTO nr VALUES(4)")])
    for load in (backup.read_bytes(), dump.encode()):
        out = store.load(load)
        assert out.cid is not None
        rows = store.query(
            [
                S("SELECT rowid, v FROM nr"),
                S('SELECT _rowid_, * FROM "rowid taken"'),
                S("SELECT seq FROM sqlite_sequence WHERE name = 'ai'"),
                S("SELECT rowid, * FROM dq"),
            ]
        )
        assert [r.rows for r in rows] == [[(3, 3)], [(2, 10, 11, 12)], [(3,)], [(2, 9, "b")]]
        if load is not dump:  # (SQL text runs on the tables as they are: one load only)
            break
    next_id = store.execute([S("INSERT INTO ai(v) VALUES(4)")])
    assert next_id.results[0].last_insert_id == 4  # 3 was used once: never again


def test_load_of_related_rows_with_foreign_keys_enforced(tmp_path: Path) -> None:
    """QA: with --fk, reloading a node's own backup failed (its parents were deleted
    before their children), as did a file whose child table was created before its
    parent (no such table) or whose rows reference later ones."""
    from litecdc import NodeConfig

    store = Store(NodeConfig(data_dir=tmp_path / "fk", foreign_keys=True))
    try:
        store.execute(
            [
                S("CREATE TABLE p(id INTEGER PRIMARY KEY)"),
                S("CREATE TABLE c(id INTEGER PRIMARY KEY, pid REFERENCES p ON DELETE SET NULL)"),
                S("CREATE TABLE r(id INTEGER PRIMARY KEY, pid REFERENCES p ON DELETE RESTRICT)"),
                S("INSERT INTO p VALUES(1)"),
                S("INSERT INTO c VALUES(1, 1)"),
                S("INSERT INTO r VALUES(1, 1)"),
            ]
        )
        backup = tmp_path / "backup.db"
        store.backup(backup)
        out = store.load(backup.read_bytes())
        assert out.cid is not None
        changes = store.changes(out.cid - 1, 100)
        assert sorted(c.op for c in changes) == ["delete"] * 3 + ["insert"] * 3  # no SET NULL
        kid_first = _sqlite_file(
            tmp_path / "kid_first.db",
            "CREATE TABLE kid(id INTEGER PRIMARY KEY, pid REFERENCES mom(id));"
            "CREATE TABLE mom(id INTEGER PRIMARY KEY, boss REFERENCES mom(id));"
            "INSERT INTO mom VALUES(1, 2), (2, NULL); INSERT INTO kid VALUES(1, 1);",
        )
        assert store.load(kid_first).cid is not None
        assert store.query([S("SELECT * FROM mom")])[0].rows == [(1, 2), (2, None)]
        # its SQL dump loads into an empty node: tables created first, checks deferred
        # in place of the dump's PRAGMA foreign_keys=OFF
        other = Store(NodeConfig(data_dir=tmp_path / "other", foreign_keys=True))
        try:
            assert other.load(store.dump_sql().encode()).cid is not None
            assert other.query([S("SELECT * FROM mom")])[0].rows == [(1, 2), (2, None)]
        finally:
            other.close()
        broken = _sqlite_file(
            tmp_path / "broken.db",
            "CREATE TABLE kid(id INTEGER PRIMARY KEY, pid REFERENCES mom(id));"
            "CREATE TABLE mom(id INTEGER PRIMARY KEY); INSERT INTO kid VALUES(1, 99);",
        )
        before = store.journal.last_cid()
        with pytest.raises(LoadError, match="FOREIGN KEY constraint failed"):
            store.load(broken)
        assert store.journal.last_cid() == before
        assert store.query([S("SELECT * FROM kid")])[0].rows == [(1, 1)]
    finally:
        store.close()


def test_foreign_key_cascades_are_enforced_and_captured(tmp_path: Path) -> None:
    from litecdc import NodeConfig

    store = Store(NodeConfig(data_dir=tmp_path / "fk", foreign_keys=True))
    store.execute(
        [
            S("CREATE TABLE parent(id INTEGER PRIMARY KEY)"),
            S(
                "CREATE TABLE child(id INTEGER PRIMARY KEY, "
                "p REFERENCES parent(id) ON DELETE CASCADE)"
            ),
            S("INSERT INTO parent VALUES(1)"),
            S("INSERT INTO child VALUES(10, 1)"),
        ]
    )
    bad = store.execute([S("INSERT INTO child VALUES(11, 99)")])
    assert bad.results[0].error == "FOREIGN KEY constraint failed"
    out = store.execute([S("DELETE FROM parent WHERE id = 1")])
    assert [(c.table, c.op) for c in store.changes(out.cid - 1, 10)] == [  # type: ignore[operator]
        ("parent", "delete"),
        ("child", "delete"),
    ]
    assert store.query([S("SELECT count(*) FROM child")])[0].rows == [(0,)]
    store.close()


def test_without_rowid_changes_have_no_rowids(store: Store) -> None:
    store.execute([S("CREATE TABLE w(k TEXT PRIMARY KEY, v) WITHOUT ROWID")])
    out = store.execute(
        [S("INSERT INTO w VALUES('a', 1)"), S("UPDATE w SET v = 2"), S("DELETE FROM w")]
    )
    changes = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    assert [(c.op, c.old_rowid, c.new_rowid, c.pk) for c in changes] == [
        ("insert", None, None, {"k": "a"}),
        ("update", None, None, {"k": "a"}),
        ("delete", None, None, {"k": "a"}),
    ]


def test_litecdc_bookkeeping_never_becomes_a_change(store: Store) -> None:
    """A batch of log entries records the node's applied revision in the same SQLite
    transaction; that row change used to stay in the capture buffer and be saved with
    the next internal entry (cluster QA: webhook events for _litecdc_node_state)."""
    from litecdc.db.schema import CREATE_CDC_STATE

    store.execute([S("CREATE TABLE t(x)")])
    store.engine.in_one_transaction([lambda: None], state={"applied_revision": 7})
    store.engine.in_one_transaction([lambda: None], state={"applied_revision": 8})
    store.journal.commit_internal(CREATE_CDC_STATE)
    out = store.execute([S("INSERT INTO t VALUES(1)")])
    assert [(c.table, c.op) for c in store.changes(0, 100)] == [("t", "insert")]
    assert out.cid is not None


@pytest.mark.parametrize("transaction", [False, True])
def test_a_failed_string_that_changed_the_schema_leaves_later_images_right(
    store: Store, transaction: bool
) -> None:
    """QA: the string's ALTER was rolled back with it, but the shape captured after the
    ALTER stayed: every later image of the table lacked column b (or named it 'bee')."""
    store.execute(
        [
            S("CREATE TABLE sd(id INTEGER PRIMARY KEY, a, b)"),
            S("INSERT INTO sd VALUES(1, 'a', 'b')"),
        ]
    )
    for ddl in ("ALTER TABLE sd DROP COLUMN b", "ALTER TABLE sd RENAME COLUMN b TO bee"):
        out = store.execute(
            [S(f"{ddl}; UPDATE sd SET a = 'x'; SELECT * FROM nosuch")], transaction=transaction
        )
        assert out.cid is None and "no such table: nosuch" in str(out.results[0].error)
    out = store.execute([S("UPDATE sd SET a = 'y'")])
    (change,) = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    assert change.before == {"id": 1, "a": "a", "b": "b"}
    assert change.after == {"id": 1, "a": "y", "b": "b"}


def test_a_failed_string_that_recreated_a_table_leaves_its_key_right(
    store: Store,
) -> None:
    store.execute([S("CREATE TABLE sk(id INTEGER PRIMARY KEY, v)")])
    out = store.execute(
        [
            S(
                "DROP TABLE sk; CREATE TABLE sk(k TEXT PRIMARY KEY, v) WITHOUT ROWID; "
                "INSERT INTO sk VALUES('a', 1); SELECT * FROM nosuch"
            )
        ],
        transaction=True,
    )
    assert out.cid is None
    out = store.execute([S("INSERT INTO sk VALUES(2, 'b')")])
    (change,) = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    assert (change.pk, change.new_rowid, change.after) == ({"id": 2}, 2, {"id": 2, "v": "b"})


def test_an_image_of_another_length_than_its_shape_fails_instead_of_dropping_values() -> None:
    from litecdc.db.capture import TableShape

    shape = TableShape("t", ("id", "a", "b"), (), True)
    with pytest.raises(RuntimeError, match="has 2 values, but its shape as known has 3"):
        shape.image((1, "a"))


def test_before_images_of_rows_older_than_a_real_default_hold_the_float(store: Store) -> None:
    """QA: SQLite hands a row written before ADD COLUMN … REAL DEFAULT 3 its default
    unconverted as the old value: the before image said 3 where every read says 3.0."""
    store.execute(
        [S("CREATE TABLE rr(id INTEGER PRIMARY KEY, q)"), S("INSERT INTO rr VALUES(1, 1)")]
    )
    store.execute([S("ALTER TABLE rr ADD COLUMN price REAL DEFAULT 3")])
    store.execute([S("ALTER TABLE rr ADD COLUMN n NUMERIC DEFAULT 3.0")])
    (read,) = store.query([S("SELECT price, n FROM rr")])[0].rows
    assert [type(v) for v in read] == [float, int]  # what every read of the row gives
    out = store.execute([S("UPDATE rr SET q = 2"), S("DELETE FROM rr")], transaction=True)
    update, delete = store.changes(out.cid - 1, 10)  # type: ignore[operator]
    for image in (update.before, update.after, delete.before):
        assert image is not None
        assert type(image["price"]) is float and image["price"] == 3.0
        assert type(image["n"]) is int and image["n"] == 3  # as SQLite reads it


def _user_objects(store: Store) -> list[tuple[str, str]]:
    rows = store.query(
        [S("SELECT type, name FROM sqlite_schema WHERE name NOT LIKE '\\_litecdc\\_%' ESCAPE '\\' "
           "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY 1, 2")]
    )[0].rows  # fmt: skip
    return [(str(kind), str(name)) for kind, name in rows]


def test_a_load_that_other_writes_overtake_replaces_the_tables_they_left(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backup QA: a SQLite file's load lists the tables it deletes and drops before it
    runs; a table created in between survived the "replacement", and one dropped in
    between failed the load with "no such table" (a table the client never named; two
    loads at once did the same). The load checks, where it runs, that the tables are
    those it listed, and is made again when they are not; nothing of a raced attempt
    stays."""
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY)"), S("CREATE TABLE nopk(x)")])
    data = _sqlite_file(tmp_path / "file.db", "CREATE TABLE f(id INTEGER PRIMARY KEY, v)")
    making = store.engine.load_statements
    meanwhile = ["CREATE TABLE late(a)", "DROP TABLE nopk"]  # one after each of two makings

    def overtaken(data: bytes) -> list[Statement]:
        statements = making(data)
        if meanwhile:
            store.execute([S(meanwhile.pop(0))])
        return statements

    monkeypatch.setattr(store.engine, "load_statements", overtaken)
    assert store.load(data).cid is not None
    assert meanwhile == []
    assert _user_objects(store) == [("table", "f")]

    # overtaken every time: refused, nothing of the file there, what the others did kept
    created = iter(range(100))

    def always_overtaken(data: bytes) -> list[Statement]:
        statements = making(data)
        store.execute([S(f"CREATE TABLE late{next(created)}(a)")])
        return statements

    monkeypatch.setattr(store.engine, "load_statements", always_overtaken)
    with pytest.raises(LoadError) as refused:
        store.load(_sqlite_file(tmp_path / "other.db", "CREATE TABLE g(x)"))
    assert str(refused.value) == (
        "load: the database's tables changed while each of 5 attempts was prepared (other "
        "schema changes or loads ran meanwhile); nothing changed: load it again"
    )
    assert _user_objects(store) == [("table", "f")] + [("table", f"late{i}") for i in range(5)]


def test_a_utf16_database_loads_a_file(tmp_path: Path) -> None:
    """Review: the load's check listed the tables sorted by Python, the run by SQLite —
    which orders a UTF-16 database's names otherwise (`a` and `ā`): every load of a
    SQLite file was refused as raced."""
    data_dir = tmp_path / "node"
    data_dir.mkdir()
    made = apsw.Connection(str(data_dir / "db.sqlite"))
    made.execute("PRAGMA encoding='UTF-16le'; CREATE TABLE a(x); CREATE TABLE \"ā\"(x)")
    made.close()
    store = Store(NodeConfig(data_dir=data_dir, source_workers=0))
    try:
        data = _sqlite_file(tmp_path / "file.db", "CREATE TABLE f(id INTEGER PRIMARY KEY)")
        assert store.load(data).cid is not None
        assert _user_objects(store) == [("table", "f")]
    finally:
        store.close()


def test_a_dump_writes_zeros_as_sqlite3_does_and_loads_them_exactly(
    store: Store, tmp_path: Path
) -> None:
    """The journal writes +0.0 as (0.0+0) (a minus before it must not fold it into -0.0);
    a dump has no minus before its values and writes 0.0, as sqlite3's .dump does."""
    store.execute([S("CREATE TABLE z(a, b)"), S("INSERT INTO z VALUES(?, ?)", (0.0, -0.0))])
    dump = store.dump_sql()
    assert "VALUES(1,0.0,(-0.0));" in dump, dump
    plain = apsw.Connection(":memory:")
    plain.execute(dump)
    a, b = plain.execute("SELECT a, b FROM z").fetchall()[0]
    assert (math.copysign(1, a), math.copysign(1, b)) == (1.0, -1.0)
