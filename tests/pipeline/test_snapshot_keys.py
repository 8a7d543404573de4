"""Snapshots of tables whose keys Python cannot order as SQLite does: a collation
(NOCASE, RTRIM), an untyped key holding integers, reals and text (mirrored as text,
ordered as numbers-then-text), blobs, and NULLs in a primary key (SQLite lets several
rows hold them). Only the node compares keys — it cuts the ranges and pages through
each — so every row reaches the sink, or the subscription says why it cannot.

A real node and ``PipelineServer`` on the module's Spark session (``local[2]``), into
Delta Lake and Parquet; small ``page_rows`` make many ranges and rounds.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pyarrow as pa
import pytest
from e2e.litecdc_node import Node
from pipeline_proc import execute

from litecdc.errors import SchemaMismatchError
from litecdc.pipeline import control
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.server import (
    GIVE_UP_FAILURES,
    PipelineServer,
    check_null_keys,
    chunk_count,
)
from litecdc.pipeline.sinks.registry import open_sink
from litecdc.pipeline.source_client import SourceClient
from litecdc.pipeline.tables import TableSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    opened = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    yield opened
    opened.close()


def run(store: MetadataStore, spark: SparkSession) -> PipelineServer:
    """One ``pipeline run --until-caught-up`` (a failing subscription gives up quickly)."""
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    server.run(until_caught_up=True)
    return server


def subscribe(store: MetadataStore, node: Node, table: str, sink: str, **options: Any) -> str:
    name = f"{table}-{uuid.uuid4().hex[:6]}"
    control.subscribe(store, name=name, sources=node.url, table=table, sink=sink, options=options)
    return name


def mirror(store: MetadataStore, node: Node, name: str) -> list[tuple[Any, ...]]:
    """Subscription ``name``'s mirror: its rows (table columns), sorted."""
    sub = store.get_subscription(name)
    with SourceClient(node.url) as client:
        spec = client.table_spec(sub.table_name)
    sink = open_sink(sub.sink, spec, name, prepare=False)
    try:
        rows: pa.Table = sink.read_rows()
    finally:
        sink.close()
    return sorted(tuple(r.values()) for r in rows.to_pylist())


def source_rows(c: httpx.Client, sql: str) -> list[tuple[Any, ...]]:
    r = c.get("/db/query", params={"q": sql})
    assert r.status_code == 200, r.text
    return [tuple(v) for v in r.json()["results"][0].get("values", [])]


def mixed_case_keys(n: int, seed: int) -> list[str]:
    """``n`` keys distinct under NOCASE, in both cases and with characters between the
    cases in byte order ('_' sorts between 'Z' and 'a' in binary, not in NOCASE)."""
    rng = random.Random(seed)
    keys: dict[str, str] = {}
    while len(keys) < n:
        k = "".join(rng.choice("aBcD_xY[") for _ in range(rng.randint(1, 4)))
        keys.setdefault(k.lower(), k)
    return list(keys.values())


def test_collated_keys_reach_the_sink_every_row(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """Before, the server assigned rows to ranges and took each range's last key in
    Python's byte order: with NOCASE keys it lost rows (c / D of a..h at --page-rows 2;
    thousands of a larger mixed-case table)."""
    with node.client() as c:
        execute(c, ["CREATE TABLE ci (k TEXT COLLATE NOCASE PRIMARY KEY, v INTEGER)"])
        execute(c, [["INSERT INTO ci VALUES(?, ?)", k, i] for i, k in enumerate("abcDefgh")])
        execute(c, ["CREATE TABLE ci_big (k TEXT COLLATE NOCASE PRIMARY KEY, v INTEGER)"])
        keys = mixed_case_keys(600, seed=3)
        execute(c, [["INSERT INTO ci_big VALUES(?, ?)", k, i] for i, k in enumerate(keys)])
        execute(c, ["CREATE TABLE rt (k TEXT COLLATE RTRIM PRIMARY KEY, v INTEGER) WITHOUT ROWID"])
        execute(
            c,
            [
                ["INSERT INTO rt VALUES(?, ?)", k, i]
                for i, k in enumerate(["b  ", "a", "a b", "B", "c ", "ab", " a", "_"])
            ],
        )
        execute(
            c,
            [
                "CREATE TABLE cc (a TEXT COLLATE NOCASE, b INTEGER, v INTEGER, "
                "PRIMARY KEY (a, b)) WITHOUT ROWID"
            ],
        )
        execute(
            c,
            [
                ["INSERT INTO cc VALUES(?, ?, ?)", k, j, i * 10 + j]
                for i, k in enumerate(keys[:60])
                for j in range(3)
            ],
        )
    cases = [
        ("ci", {"partitions": 2, "page_rows": 2}),
        ("ci_big", {"partitions": 4, "page_rows": 37}),
        ("rt", {"partitions": 2, "page_rows": 3}),
        ("cc", {"partitions": 3, "page_rows": 11}),
    ]
    names = {
        table: subscribe(store, node, table, f"delta:{tmp_path / table}", **options)
        for table, options in cases
    }
    server = run(store, spark)
    assert all(s.last_error is None for s in server.states.values()), server.states
    with node.client() as c:
        for table, name in names.items():
            columns = "a, b, v" if table == "cc" else "k, v"
            expected = sorted(source_rows(c, f"SELECT {columns} FROM {table}"))
            assert mirror(store, node, name) == expected, table


def test_untyped_mixed_type_and_blob_keys_reach_the_sink_every_row(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """An untyped key column is mirrored as text, but ordered and compared by SQLite as
    the values stored: every integer before any text. Before, paging went on from the
    mirrored text ("2" sorts after every integer: rows 3 and 10 lost) or failed
    comparing an int with a str in Python (a snapshot stuck forever)."""
    with node.client() as c:
        execute(c, ["CREATE TABLE kv (k PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO kv VALUES(?, ?)", k, f"v{k}"] for k in (1, 2, 10, 3)])
        execute(c, ["CREATE TABLE mixed (k PRIMARY KEY, v INTEGER)"])
        mixed: list[Any] = [1, 2, 10, 3, -4, 2.5, 1e300, -0.5, "a", "B", "10x", "", "zz", "Ω"]
        execute(c, [["INSERT INTO mixed VALUES(?, ?)", k, i] for i, k in enumerate(mixed)])
        execute(c, ["CREATE TABLE bk (k BLOB PRIMARY KEY, v INTEGER) WITHOUT ROWID"])
        blobs = [b"", b"\x00", b"\x00\x00", b"\x7f", b"\x80", b"\xff", b"a", b"\xff\xff"]
        execute(c, [["INSERT INTO bk VALUES(?, ?)", k, i] for i, k in enumerate(blobs)])
    cases = [
        ("kv", "kv-1", {"partitions": 1, "page_rows": 2}),
        ("kv", "kv-2", {"partitions": 2, "page_rows": 1}),
        ("mixed", "mixed", {"partitions": 2, "page_rows": 3}),
        ("bk", "bk", {"partitions": 3, "page_rows": 2}),
    ]
    names = {
        path: subscribe(store, node, table, f"delta:{tmp_path / path}", **options)
        for table, path, options in cases
    }
    server = run(store, spark)
    assert all(s.last_error is None for s in server.states.values()), server.states
    as_text = {1: "1", 2: "2", 10: "10", 3: "3", -4: "-4", 2.5: "2.5", 1e300: "1e+300",
               -0.5: "-0.5"}  # fmt: skip
    for path in ("kv-1", "kv-2"):
        assert mirror(store, node, names[path]) == sorted(
            (as_text[k], f"v{k}") for k in (1, 2, 10, 3)
        ), path
    assert mirror(store, node, names["mixed"]) == sorted(
        (k if isinstance(k, str) else as_text[k], i) for i, k in enumerate(mixed)
    )
    assert mirror(store, node, names["bk"]) == sorted((k, i) for i, k in enumerate(blobs))


def test_infinite_real_keys_reach_the_sink_every_row(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """A REAL key can hold ±infinity. Before, the node sent such a key as JSON null (a
    NULL key: a range cut there, or paging on from there, meant other rows), and the
    metadata store refused to record it (not JSON): the subscription failed for good."""
    keys = [-math.inf, math.inf, *(i / 4 for i in range(-10, 11))]
    with node.client() as c:
        execute(c, ["CREATE TABLE fk (k REAL PRIMARY KEY, v INTEGER)"])
        # as SQL literals: JSON has no infinity to bind
        execute(c, [f"INSERT INTO fk VALUES({k!r}, {i})".replace("inf", "9e999")
                    for i, k in enumerate(keys)])  # fmt: skip
    cases = {
        "fk-1": {"partitions": 1, "page_rows": 1},  # every key a range's end
        "fk-2": {"partitions": 3, "page_rows": 2},
        "fk-3": {"partitions": 2, "page_rows": 50},  # one range ending at +inf
    }
    names = {
        path: subscribe(store, node, "fk", f"delta:{tmp_path / path}", **options)
        for path, options in cases.items()
    }
    server = run(store, spark)
    assert all(s.last_error is None for s in server.states.values()), server.states
    expected = sorted((k, i) for i, k in enumerate(keys))
    for path, name in names.items():
        assert mirror(store, node, name) == expected, path
    # ranges were cut at both infinities, recorded as the node sends them
    bounds = [r.upper_key for r in store.progress(names["fk-1"]).ranges]
    assert [{"float": "-inf"}] in bounds and [{"float": "inf"}] in bounds, bounds
    # the change log after it: the infinite rows change and go
    with node.client() as c:
        execute(c, ["UPDATE fk SET v = 100 WHERE k = 9e999", "DELETE FROM fk WHERE k = -9e999"])
    server = run(store, spark)
    assert all(s.last_error is None for s in server.states.values()), server.states
    expected = sorted((k, 100 if k == math.inf else i) for i, k in enumerate(keys) if i != 0)
    for name in names.values():
        assert mirror(store, node, name) == expected


def test_a_blob_in_an_untyped_key_column_is_refused_naming_table_column_and_key(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """An untyped column is mirrored as text, which a blob is not: the subscription stops
    with the node's error (as for any value that does not fit its column), not with one
    of comparing keys."""
    with node.client() as c:
        execute(c, ["CREATE TABLE kb (k PRIMARY KEY, v INTEGER)"])
        execute(c, [["INSERT INTO kb VALUES(?, ?)", k, i] for i, k in enumerate([1, "a", b"\x01"])])
    name = subscribe(store, node, "kb", f"delta:{tmp_path / 'kb'}", partitions=2, page_rows=1)
    error = run(store, spark).states[name].last_error or ""
    assert "table kb column k: a BLOB value at key ['AQ=='] does not fit" in error, error
    assert "mirrored type string (declared 'no type')" in error and "\n" not in error


def test_null_keys_reach_a_parquet_log_and_a_mirror_refuses_them_until_fixed(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """SQLite lets a TEXT PRIMARY KEY hold NULL, in several rows. Before, the split key
    [null] made ranges that matched nothing: the snapshot copied 0 rows and the run
    ended as if all were well. Now a Parquet log gets every row; a Delta mirror, keyed
    by the primary key, refuses such rows naming the table and the reason, and goes on
    once they have keys — also when one arrives later, through the change log."""
    with node.client() as c:
        execute(c, ["CREATE TABLE np (k TEXT PRIMARY KEY, v TEXT)"])
        execute(c, ["INSERT INTO np VALUES (NULL, 'a'), (NULL, 'b'), ('x', 'c')"])
    log_dir = tmp_path / "np-log"
    subscribe(store, node, "np", f"parquet:{log_dir}", partitions=2, page_rows=1)
    assert run(store, spark).states
    snapshot = spark.read.parquet(str(log_dir / "snapshot")).collect()
    assert sorted((r["k"] or "", r["v"]) for r in snapshot) == [("", "a"), ("", "b"), ("x", "c")]

    lake = f"delta:{tmp_path / 'np-lake'}"
    name = subscribe(store, node, "np", lake, partitions=2, page_rows=1)
    server = run(store, spark)
    state = server.states[name]
    assert state.failures == GIVE_UP_FAILURES
    assert state.last_error is not None
    assert "table np: 2 row(s) have NULL in the primary key (k)" in state.last_error
    assert "delta mirror" in state.last_error and "\n" not in state.last_error
    assert store.progress(name).stage == "snapshot"

    with node.client() as c:
        execute(c, ["UPDATE np SET k = 'n-' || v WHERE k IS NULL"])
    server = run(store, spark)
    assert server.states[name].last_error is None
    expected = [("n-a", "a"), ("n-b", "b"), ("x", "c")]
    assert mirror(store, node, name) == expected

    # a row with a NULL key through the change log: the table is copied again, which
    # refuses it as the first snapshot did, until it has a key
    with node.client() as c:
        execute(c, ["INSERT INTO np VALUES (NULL, 'late')"])
    server = run(store, spark)
    assert "1 row(s) have NULL in the primary key" in (server.states[name].last_error or "")
    with node.client() as c:
        execute(c, ["UPDATE np SET k = 'n-late' WHERE k IS NULL"])
    server = run(store, spark)
    assert server.states[name].last_error is None
    assert mirror(store, node, name) == [*expected[:2], ("n-late", "late"), expected[2]]


class _Sink:
    """What ``check_null_keys`` asks of a sink."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


def test_a_message_sink_refuses_rows_that_share_a_null_key() -> None:
    """One row of a NULL key is a message like any other; two would carry the same key
    and snapshot message id (a broker keeps one): refused, naming table and reason."""
    spec = TableSpec.from_json(
        {
            "table": "np",
            "columns": [{"name": "k", "arrow": "string"}, {"name": "v", "arrow": "string"}],
            "key": ["k"],
        }
    )

    def rows(*keys: str | None) -> pa.Table:
        return pa.table({"k": list(keys), "v": ["x"] * len(keys), "_litecdc_cid": [1] * len(keys)})

    log_sink: Any = _Sink("log")
    mirror_sink: Any = _Sink("mirror")
    check_null_keys(spec, rows(None, "a", "b"), log_sink)
    check_null_keys(spec, rows("a", "b"), mirror_sink)
    with pytest.raises(SchemaMismatchError, match=r"table np: 2 rows share the key \[null\]"):
        check_null_keys(spec, rows(None, "a", None), log_sink)
    with pytest.raises(SchemaMismatchError, match=r"NULL in the primary key \(k\)"):
        check_null_keys(spec, rows("a", None), mirror_sink)


def test_chunks_follow_page_rows_within_the_nodes_limit() -> None:
    assert chunk_count(0, 2, 100) == 2
    assert chunk_count(8, 2, 2) == 4
    assert chunk_count(1001, 2, 100) == 11
    assert chunk_count(10**9, 2, 200_000) == 1024


def test_rows_appended_after_registration_come_through_the_change_log(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """The last range ends at the table's last key when the subscription registers: rows
    appended later (an append-only table's) are not read into it all through the
    snapshot, the change log brings them."""
    with node.client() as c:
        execute(c, ["CREATE TABLE app (id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO app VALUES(?, ?)", i, f"v{i}"] for i in range(1, 21)])
    name = subscribe(store, node, "app", f"delta:{tmp_path / 'app'}", partitions=2, page_rows=5)
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    server.run_round()  # registers: 4 ranges of 5 rows, the last one ending at key [20]
    ranges = store.progress(name).ranges
    assert [(r.lower_key, r.upper_key) for r in ranges][-1] == ([15], [20])
    with node.client() as c:
        execute(c, [["INSERT INTO app VALUES(?, ?)", i, f"v{i}"] for i in range(21, 41)])
    server.run(until_caught_up=True)
    assert store.progress(name).rows_copied == 20
    with node.client() as c:
        assert mirror(store, node, name) == sorted(source_rows(c, "SELECT id, v FROM app"))
