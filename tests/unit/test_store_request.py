"""rqlite's /db/request: reads go to a reader, anything that writes is one journaled commit."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import apsw
import pytest

from litecdc import Mode, NodeConfig, Statement, Store
from litecdc.db import engine as engine_module
from litecdc.db.access import WAL_CHECKPOINT_REFUSED
from litecdc.db.engine import VACUUM_REFUSED, WRITE_LIMIT_ERROR
from litecdc.db.read_limit import CLIENT_LEFT, QUERY_TIMEOUT, ReadLimit

S = Statement


def test_parameterised_write_is_routed_to_the_write_path(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.request(
        [S("INSERT INTO t VALUES(?)", (1,)), S("SELECT x FROM t WHERE x = ?", (1,))]
    )
    assert out.cid is not None
    assert out.results[0].rows_affected == 1
    assert out.results[1].rows == [(1,)]


def test_reads_only_are_not_journaled(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(7)")])
    last = store.journal.last_cid()
    out = store.request([S("SELECT x FROM t WHERE x = :v", {"v": 7}), S("SELECT 1; SELECT 2")])
    assert out.cid is None and store.journal.last_cid() == last
    assert out.results[0].rows == [(7,)]


def test_write_after_a_read_in_one_string_is_a_write(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.request([S("SELECT 1; INSERT INTO t VALUES(2)")])
    assert out.cid is not None
    assert store.query([S("SELECT x FROM t")])[0].rows == [(2,)]


def test_bad_statement_reports_its_error(store: Store) -> None:
    out = store.request([S("SELEC nonsense")])
    assert out.results[0].error is not None and "syntax error" in out.results[0].error


def test_queries_cannot_leave_a_reader_inside_a_transaction(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    for sql in ("BEGIN", "SAVEPOINT s", "CREATE TEMP TABLE tmp(x)", "PRAGMA query_only=0"):
        result = store.query([S(sql)])[0]
        assert (result.error is not None and "not allowed in queries" in result.error) or (
            "with a value changes connection state" in (result.error or "")
        ), result.error
    store.execute([S("INSERT INTO t VALUES(2)")])
    assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(2,)]  # not a stale snapshot
    assert store.query([S("SELECT count(*) FROM t")], transaction=True)[0].rows == [(2,)]


def test_several_statements_in_one_string_report_the_last(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    result = store.query([S("SELECT 1 AS a; SELECT 2 AS b, 3 AS c")])[0]
    assert (result.columns, result.rows) == (["b", "c"], [(2, 3)])


def test_changes_page_resumes_inside_a_transaction(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    out = store.execute([S("INSERT INTO t VALUES(?)", (i,)) for i in range(5)], transaction=True)
    cid = out.cid
    assert cid is not None
    first = store.changes(cid - 1, 3)
    rest = store.changes(first[-1].cid, 10, after_seq=first[-1].seq)
    assert [(c.cid, c.seq) for c in first + rest] == [(cid, s) for s in range(1, 6)]


def test_every_read_gets_its_result_after_an_error(store: Store) -> None:
    """rqlite's queryWithConn appends the error and goes on, with `transaction` too
    (litecdc stopped there: a client matching results to statements lost the rest)."""
    statements = [S("SELECT 1"), S("SELECT * FROM nosuch"), S("SELECT 2")]
    for transaction in (True, False):
        results = store.query(statements, transaction=transaction)
        assert [(r.rows, bool(r.error)) for r in results] == [
            ([(1,)], False),
            (None, True),
            ([(2,)], False),
        ]


def test_named_values_for_positional_parameters_are_explained(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x)")])
    wrote = store.execute([S("INSERT INTO t VALUES(?)", {"1": "one"})]).results[0].error
    read = store.query([S("SELECT ?", {"1": "one"})])[0].error
    assert (
        wrote
        == read
        == (
            "the statement uses positional parameters (?), but the values were sent as an "
            'object; send them as an array: ["SQL", value, ...]'
        )
    )


def test_too_few_values_say_so_in_rqlites_words(store: Store) -> None:
    store.execute([S("CREATE TABLE t(x, y)")])
    wrote = store.execute([S("INSERT INTO t VALUES(?, ?)", (1,))]).results[0].error
    read = store.query([S("SELECT ?, ?", (1,))])[0].error
    assert wrote == read == "not enough args to execute query: want 2 got 1"
    # a text of several statements, in go-sqlite3's counts (fuzz QA: APSW's own words said
    # "uses 1 and there are 1 supplied"): want = the failing statement's parameters, got =
    # every value given to a write (its exec), the values left in a read (its query)
    last = store.journal.last_cid()
    two = "INSERT INTO t VALUES(?, 0); INSERT INTO t VALUES(?, 0)"
    assert store.execute([S(two, ("x",))]).results[0].error == (
        "not enough args to execute query: want 1 got 1"
    )
    assert store.execute([S("INSERT INTO t VALUES(?, ?); SELECT ?")]).results[0].error == (
        "not enough args to execute query: want 2 got 0"
    )
    assert store.query([S("SELECT ?; SELECT ?, ?", (1, 2))])[0].error == (
        "not enough args to execute query: want 2 got 1"
    )
    assert store.query([S("SELECT ?; SELECT ?")])[0].error == (
        "not enough args to execute query: want 1 got 0"
    )
    assert store.journal.last_cid() == last


RUNAWAY = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def test_a_read_past_its_db_timeout_stops_with_rqlites_error(store: Store) -> None:
    """rqlite's db_timeout: the read is interrupted, and the reads after it do not run."""
    limit = ReadLimit(0.05)
    results = store.query([S("SELECT 1"), S(RUNAWAY), S("SELECT 2")], limit=limit)
    assert results[0].rows == [(1,)]
    assert [r.error for r in results[1:]] == [QUERY_TIMEOUT, QUERY_TIMEOUT]
    # inside a read transaction too, and the reader is left without a limit or transaction
    results = store.query([S(RUNAWAY)], transaction=True, limit=ReadLimit(0.05))
    assert results[0].error == QUERY_TIMEOUT
    heavy = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 300000) "
    assert store.query([S(heavy + "SELECT count(*) FROM c")])[0].rows == [(300000,)]
    out = store.request([S(RUNAWAY)], limit=ReadLimit(0.05))
    assert out.read_only and out.results[0].error == QUERY_TIMEOUT


def test_a_cancelled_read_stops_and_says_its_client_left(store: Store) -> None:
    limit = ReadLimit()
    threading.Timer(0.1, limit.cancel).start()
    results = store.query([S(RUNAWAY), S("SELECT 1")], limit=limit)
    assert [r.error for r in results] == [CLIENT_LEFT, CLIENT_LEFT]
    assert store.query([S("SELECT 3")], limit=ReadLimit(60))[0].rows == [(3,)]


ENDLESS_WRITE = (
    "INSERT INTO e(v) SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
    "SELECT x + 1 FROM c) SELECT x FROM c) WHERE x < ?"
)


def test_a_write_statement_that_never_ends_is_stopped_at_the_step_limit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Security QA: a statement without end held the write lock for good (and, in a
    cluster, every node's apply loop). The limit counts SQLite steps (here lowered to a
    million, about 10 ms): the statement fails, the next one runs with a limit of its own."""
    monkeypatch.setattr(engine_module, "_WRITE_LIMIT_CHECKS", 100)
    store.execute([S("CREATE TABLE e(v)")])
    last = store.journal.last_cid()
    # SQLite ends the transaction of an interrupted INSERT/UPDATE/DELETE: the request fails
    out = store.execute([S(ENDLESS_WRITE, (0,)), S("INSERT INTO e VALUES(1)")])
    assert out.cid is None and out.results[0].error == WRITE_LIMIT_ERROR
    assert str(out.results[1].error).startswith("not run: ")
    assert store.journal.last_cid() == last
    # a read stopped so fails alone
    out = store.execute([S(RUNAWAY), S("INSERT INTO e VALUES(1)")])
    assert [r.error for r in out.results] == [WRITE_LIMIT_ERROR, None]
    assert store.journal.last_cid() == last + 1  # the insert alone
    assert store.query([S("SELECT v FROM e")])[0].rows == [(1,)]
    # in a transaction, batched (one executemany): the whole request is rolled back
    out = store.execute([S(ENDLESS_WRITE, (0,)), S(ENDLESS_WRITE, (-1,))], transaction=True)
    assert out.cid is None and out.results[0].error == WRITE_LIMIT_ERROR
    # a long write of litecdc's own, or many short statements, are not limited together
    big = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) "
    out = store.execute([S(big + "INSERT INTO e SELECT x FROM c")] * 3)
    assert [r.error for r in out.results] == [None] * 3


def _vm_steps(sql: str) -> int:
    """The SQLite steps ``sql`` runs on a fresh database with table e(v)."""
    import apsw

    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE e(v)")
    steps = [0]

    def count() -> bool:
        steps[0] += 1
        return False

    conn.set_progress_handler(count, 1)
    conn.execute(sql, can_cache=False).fetchall()
    return steps[0]


def test_the_step_limit_counts_a_repeated_statement_alike_on_every_run(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas must agree on whether a statement ran past the limit. SQLite counts a
    cached statement's steps across its runs and checks at multiples of the interval, so
    the same statement, taken from the cache with another history, was checked at other
    steps; statements without parameters (all that replicas run) are prepared afresh."""
    grow = (
        "INSERT INTO e SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
        "SELECT x + 1 FROM c LIMIT {}) SELECT x FROM c)"
    )
    interval = engine_module.WRITE_CHECK_STEPS
    # a statement whose steps end in the second half of an interval: a run whose checks
    # start mid-interval (a cached statement's second run) has one check more
    sql = next(
        grow.format(n)
        for n in range(1000, 5000, 7)
        if _vm_steps(grow.format(n)) % interval >= interval // 2
    )
    monkeypatch.setattr(engine_module, "_WRITE_LIMIT_CHECKS", _vm_steps(sql) // interval)
    store.execute([S("CREATE TABLE e(v)")])
    out = store.execute([S(sql)] * 4)  # (one request: the statement stays in the cache)
    assert [r.error for r in out.results] == [None] * 4


def test_close_stops_a_read_and_a_write_still_running_on_other_threads(
    tmp_path: Path,
) -> None:
    """Review QA: closing failed on the busy reader connection (and waited for the
    write), so a stopping node closed nothing and stayed up."""
    from litecdc import NodeConfig

    config = NodeConfig(data_dir=tmp_path / "n")
    store = Store(config)
    store.execute([S("CREATE TABLE e(v)"), S("INSERT INTO e VALUES(1)")])
    outcomes: list[object] = []

    def run(call: Callable[[], object]) -> None:
        try:
            outcomes.append(call())
        except Exception as exc:  # (a write interrupted at close raises: it is aborted)
            outcomes.append(exc)

    read = threading.Thread(target=run, args=(lambda: store.query([S(RUNAWAY)]),))
    write = threading.Thread(target=run, args=(lambda: store.execute([S(ENDLESS_WRITE, (0,))]),))
    read.start()
    write.start()
    threading.Event().wait(0.3)  # both are running in SQLite
    store.close()
    read.join(10)
    write.join(10)
    assert not read.is_alive() and not write.is_alive() and len(outcomes) == 2
    again = Store(config)  # everything was closed: the data directory opens again
    try:
        assert again.query([S("SELECT v FROM e")])[0].rows == [(1,)]  # nothing half-written
    finally:
        again.close()


def test_telling_whether_a_string_writes_does_not_run_its_last_statement(store: Store) -> None:
    """Review QA: /db/request ran every read of a string of several twice (once to tell
    whether it writes, once to answer), spending db_timeout twice. Only the statements
    before the last run to tell; here the last would never end."""
    answer: list[bool] = []
    check = threading.Thread(
        target=lambda: answer.append(store.is_read_only([S(f"SELECT 1; {RUNAWAY}")])),
        daemon=True,
    )
    check.start()
    check.join(60)  # (a hang guard)
    assert answer == [True]
    assert store.is_read_only([S("SELECT 1; CREATE TABLE w(x)")]) is False


def _start_a_long_write(store: Store) -> tuple[threading.Thread, list[object]]:
    """A write of 200,000 small statements on a thread, begun; what it returned or raised
    lands in the list."""
    outcomes: list[object] = []

    def run() -> None:
        try:
            outcomes.append(
                store.execute([S("INSERT INTO e VALUES(?)", (i,)) for i in range(200_000)])
            )
        except Exception as exc:
            outcomes.append(exc)

    write = threading.Thread(target=run)
    write.start()
    while store.engine._write_depth == 0:  # (the write has begun)
        threading.Event().wait(0.01)
    return write, outcomes


def test_close_stops_a_write_of_many_statements_between_two_of_them(tmp_path: Path) -> None:
    """Review QA: SQLite's interrupt ends the statement that runs, not the next: a /db/load
    of many statements at SIGTERM went on after close() and was committed (3 runs in 5)."""
    from litecdc import NodeConfig

    config = NodeConfig(data_dir=tmp_path / "n")
    store = Store(config)
    store.execute([S("CREATE TABLE e(v)")])
    write, outcomes = _start_a_long_write(store)
    store.close()
    write.join(60)
    assert len(outcomes) == 1 and isinstance(outcomes[0], apsw.InterruptError), outcomes
    again = Store(config)
    try:
        assert again.query([S("SELECT count(*) FROM e")])[0].rows == [(0,)]
        assert again.journal.last_cid() == 2  # the CREATE TABLE's entry, nothing after
    finally:
        again.close()


def test_interrupt_writes_aborts_the_write_in_progress_only(store: Store) -> None:
    """What a cluster node leaving does to its apply loop's write (it waited for it)."""
    store.execute([S("CREATE TABLE e(v)")])
    last = store.journal.last_cid()
    write, outcomes = _start_a_long_write(store)
    store.engine.interrupt_writes()
    write.join(60)
    assert isinstance(outcomes[0], apsw.InterruptError), outcomes
    assert store.journal.last_cid() == last
    store.engine.interrupt_writes()  # none in progress: the next write is not affected
    assert store.execute([S("INSERT INTO e VALUES(1)")]).cid == last + 1


def test_vacuum_and_wal_checkpoint_are_refused_saying_why(store: Store, tmp_path: Path) -> None:
    """Fuzz QA: VACUUM was refused as "ATTACH and DETACH are not allowed" (a query) or
    "cannot VACUUM from within a transaction" (a write), and a query's PRAGMA
    wal_checkpoint as "disk I/O error", which sends an operator looking for disk faults."""
    store.execute([S("CREATE TABLE t(x)"), S("INSERT INTO t VALUES(1)")])
    last = store.journal.last_cid()
    target = tmp_path / "copy.db"
    for sql in ("VACUUM", "  /* c */ vacuum main", f"VACUUM INTO '{target}'"):
        assert store.query([S(sql)])[0].error == VACUUM_REFUSED
        assert store.execute([S(sql)]).results[0].error == VACUUM_REFUSED
    assert not target.exists()
    # in a string of several too; other statements keep their own errors (review)
    assert store.execute([S("INSERT INTO t VALUES(2); VACUUM")]).results[0].error == (
        VACUUM_REFUSED
    )
    assert store.query([S("SELECT 1; /* a;b */ VACUUM")])[0].error == VACUUM_REFUSED
    for sql, error in [
        ("/* a */ SELECT nope /* b */ vacuum FROM t", "no such column: nope"),
        ("/* x */ SELECT 1 FROM nope WHERE 1 /* y */\nvacuum", 'near "vacuum": syntax error'),
        ("SELECT 'x; vacuum' FROM nope", "no such table: nope"),
    ]:
        assert store.query([S(sql)])[0].error == error
        assert store.execute([S(sql)]).results[0].error == error
    assert store.query([S("ATTACH 'x.db' AS x")])[0].error == "ATTACH and DETACH are not allowed"
    for sql in ("PRAGMA wal_checkpoint", "PRAGMA main.wal_checkpoint(TRUNCATE)"):
        assert store.query([S(sql)])[0].error == WAL_CHECKPOINT_REFUSED
        assert store.execute([S(sql)]).results[0].error == WAL_CHECKPOINT_REFUSED
    assert store.journal.last_cid() == last
    assert store.query([S("SELECT x FROM t")])[0].rows == [(1,)]


def test_a_batched_statement_that_ends_the_transaction_fails_the_request(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: runs of one statement go through one executemany inside a transaction;
    an execution that ended the whole SQLite transaction (ON CONFLICT ROLLBACK, the step
    limit) left no savepoint to go back to, and the request raised "no such savepoint"
    (in a cluster, every node's apply loop stopped at it for good)."""
    store.execute([S("CREATE TABLE t(v UNIQUE)"), S("INSERT INTO t VALUES(1)")])
    last = store.journal.last_cid()
    q = "INSERT OR ROLLBACK INTO t VALUES(?)"
    out = store.execute([S(q, (2,)), S(q, (3,)), S(q, (1,)), S(q, (4,))], transaction=True)
    assert out.cid is None
    assert [(r.error, r.last_insert_id) for r in out.results] == [
        (None, 2), (None, 3), ("UNIQUE constraint failed: t.v", None)
    ]  # fmt: skip
    literal = "INSERT OR ROLLBACK INTO t VALUES(1)"  # a log entry's texts: no parameters
    out = store.execute([S(literal)] * 3, transaction=True)
    assert out.cid is None and out.results[-1].error == "UNIQUE constraint failed: t.v"
    # the step limit inside one execution of a batch
    monkeypatch.setattr(engine_module, "_WRITE_LIMIT_CHECKS", 100)
    store.execute([S("CREATE TABLE e(v)")])
    endless_if = (  # endless when its parameter is true
        "INSERT INTO e(v) SELECT x FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL "
        "SELECT x + 1 FROM c WHERE ? OR x < 3) SELECT x FROM c) WHERE x < 0"
    )
    assert store.execute([S(endless_if, (0,))]).results[0].error is None  # (cached)
    last = store.journal.last_cid()
    out = store.execute([S(endless_if, (0,)), S(endless_if, (1,))], transaction=True)
    assert out.cid is None and out.results[-1].error == WRITE_LIMIT_ERROR
    assert store.journal.last_cid() == last
    assert store.query([S("SELECT v FROM t"), S("SELECT count(*) FROM e")])[0].rows == [(1,)]
    assert store.execute([S(q, (5,))]).cid == last + 1  # the writer goes on


def test_the_vacuum_check_takes_linear_time_on_long_blank_runs(store: Store) -> None:
    """Review: a pattern nesting ``\\s+`` in a repetition took exponential time on a run of
    blanks not followed by VACUUM (checked whenever a query's ATTACH was refused), and
    held the whole process meanwhile. Here it must answer at once (pytest-timeout guards)."""
    sql = "ATTACH 'x' AS y;" + " " * 5000 + "x"
    assert store.query([S(sql)])[0].error == "ATTACH and DETACH are not allowed"
    many = "ATTACH 'x' AS y" + "; /*" * 20000  # (took 20 s searched at each ';')
    assert store.query([S(many)])[0].error == "ATTACH and DETACH are not allowed"
    assert store.query([S("ATTACH 'a;vacuum' AS b")])[0].error == (
        "ATTACH and DETACH are not allowed"
    )
    assert store.query([S(";" + " \n" * 3000 + "/* c */ VACUUM")])[0].error == VACUUM_REFUSED


def test_a_query_after_a_schema_change_describes_the_columns_as_they_are(
    store: Store, tmp_path: Path
) -> None:
    """Cluster QA: APSW keeps a cached statement's columns as first prepared, so after
    ALTER TABLE a repeated SELECT * named the old columns next to the new values (and an
    associative answer failed with a 500) — on a follower applying the log too."""
    follower = Store(NodeConfig(data_dir=tmp_path / "follower"))
    batched = Store(NodeConfig(data_dir=tmp_path / "batched"))  # a group commit's way
    leader = Store(NodeConfig(data_dir=tmp_path / "leader"))
    leader.journal.set_mode(Mode.LEADER)
    follower.journal.set_mode(Mode.FOLLOWER)
    batched.journal.set_mode(Mode.FOLLOWER)

    def write(statements: list[Statement]) -> None:
        store.execute(statements)
        entry = leader.journal.prepare_entry(statements)
        follower.journal.apply_log_entry(entry, revision=entry.cid)
        assert batched.journal.apply_log_entries([entry], revision=entry.cid) is not None

    write(
        [
            S("CREATE TABLE zz(id INTEGER PRIMARY KEY, a, b)"),
            S("INSERT INTO zz VALUES(1, 'A', 'B')"),
        ]
    )
    every, none = S("SELECT * FROM zz"), S("SELECT * FROM zz WHERE id = 5")
    for node in (store, follower, batched):
        assert [r.columns for r in node.query([every, none])] == [["id", "a", "b"]] * 2
    steps = [
        ("ALTER TABLE zz DROP COLUMN a", ["id", "b"], [(1, "B")]),
        ("ALTER TABLE zz RENAME COLUMN b TO c", ["id", "c"], [(1, "B")]),
        ("ALTER TABLE zz ADD COLUMN d DEFAULT 7", ["id", "c", "d"], [(1, "B", 7)]),
    ]
    # a write's SELECT with parameters, as a /db/request runs it (the writer's cache)
    lookup = S("SELECT * FROM zz WHERE id = ?", (1,))
    for i in range(3):
        store.request([lookup, S("INSERT INTO zz(id) VALUES(?)", (10 + i,))])
    for i, (ddl, columns, rows) in enumerate(steps):
        write([S(ddl)])
        for node in (store, follower, batched):
            got, empty = node.query([every, none])
            assert (got.columns, got.rows[:1], empty.columns) == (columns, rows, columns)
        for j in range(2):
            out = store.request([lookup, S("INSERT INTO zz(id) VALUES(?)", (20 + 2 * i + j,))])
            assert (out.results[0].columns, out.results[0].rows) == (columns, rows)
    for node in (leader, follower, batched):
        node.close()


def _open_files_under(directory: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (the listing's own descriptor is gone)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory.resolve()))
    return count


def test_a_read_thread_that_ends_takes_its_connection_with_it(tmp_path: Path) -> None:
    """Soak QA: each read thread opened a connection that outlived it (the HTTP layer's
    worker threads end after 10 s idle): files and memory grew with every quiet spell,
    until reads failed with "unable to open database file"."""
    store = Store(NodeConfig(data_dir=tmp_path / "n"))
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY)")])
        store.query([S("SELECT 1 FROM t")])  # (this thread's connection, kept)
        before = _open_files_under(tmp_path)
        for _ in range(20):
            read = threading.Thread(target=lambda: store.query([S("SELECT count(*) FROM t")]))
            read.start()
            read.join()
        assert _open_files_under(tmp_path) <= before + 2  # (not 2 per thread: db and -wal)
        # the connections that stay are the live threads' own: this one's still reads
        assert store.query([S("SELECT count(*) FROM t")])[0].rows == [(0,)]
    finally:
        store.close()
