"""rqlite's /db/request: reads go to a reader, anything that writes is one journaled commit."""

from __future__ import annotations

from litecdc import Statement, Store

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
