"""The ``litecdc`` Spark data source against a real ``litecdc serve`` process."""

from __future__ import annotations

import json
import math
import re
import struct
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e.litecdc_node import Node, free_port

import litecdc.pipeline.datasource as datasource_module
from litecdc.pipeline.datasource import DEFAULT_PAGE_ROWS, LitecdcOptions
from litecdc.pipeline.source_client import SourceClient
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, ROWID_COLUMN, SEQ_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

FLOATS = [0.1 + 0.2, math.pi, 5e-324, 1.7976931348623157e308, -2.5e-10, 1 / 3]
TEXTS = ["héllo wörld", "日本語", "emoji 🐍🚀", "", "quote ' and \" and \\", "tab\tnewline\n"]


def execute(node: Node, statements: list[Any]) -> Any:
    with node.client() as c:
        return node.execute(c, statements)


def read(spark: SparkSession, node: Node, table: str, **options: Any) -> DataFrame:
    reader = spark.read.format("litecdc").option("url", node.url).option("table", table)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def bits(x: float | None) -> bytes | None:
    return None if x is None else struct.pack("<d", x)


@pytest.fixture(scope="module")
def kinds(node: Node) -> list[tuple[Any, ...]]:
    """Rows of every type, NULLs in every nullable column."""
    rows: list[tuple[Any, ...]] = []
    for i in range(1, 61):
        rows.append(
            (
                i,
                None if i % 10 == 0 else (i - 30) * 2**40,
                None if i % 11 == 0 else FLOATS[i % len(FLOATS)] * (1 if i % 2 else -1),
                None if i % 12 == 0 else TEXTS[i % len(TEXTS)] + str(i),
                None if i % 13 == 0 else bytes([i, 0, 255, i % 7]),
            )
        )
    execute(
        node,
        [
            "CREATE TABLE kinds (id INTEGER PRIMARY KEY, i INTEGER, f REAL, t TEXT, b BLOB)",
            *[
                [
                    "INSERT INTO kinds VALUES (?, ?, ?, ?, ?)",
                    *r[:4],
                    None if r[4] is None else list(r[4]),
                ]
                for r in rows
            ],
        ],
    )
    return rows


def test_snapshot_equals_the_node_rows(spark: SparkSession, node: Node, kinds: list[Any]) -> None:
    df = read(spark, node, "kinds")
    assert df.columns == ["id", "i", "f", "t", "b", CID_COLUMN]
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "bigint",
        "bigint",
        "double",
        "string",
        "binary",
        "bigint",
    ]
    got = sorted(df.collect(), key=lambda r: r["id"])
    assert [(r["id"], r["i"], r["t"], r["b"]) for r in got] == [
        (r[0], r[1], r[3], r[4]) for r in kinds
    ]
    assert [bits(r["f"]) for r in got] == [bits(r[2]) for r in kinds]  # to the last bit
    assert all(r[CID_COLUMN] >= 1 for r in got)


def test_composite_text_key(spark: SparkSession, node: Node) -> None:
    pairs = [(a, b, n) for n, (a, b) in enumerate((a, b) for a in "xyzä" for b in TEXTS)]
    execute(
        node,
        [
            "CREATE TABLE pairs (a TEXT, b TEXT, n INTEGER, PRIMARY KEY (a, b))",
            *[["INSERT INTO pairs VALUES (?, ?, ?)", *p] for p in pairs],
        ],
    )
    df = read(spark, node, "pairs", partitions=3, page_rows=5)
    got = [(r["a"], r["b"], r["n"]) for r in df.collect()]
    assert sorted(got) == sorted(pairs)
    assert len(got) == len(pairs)


def test_rowid_table_without_primary_key(spark: SparkSession, node: Node) -> None:
    values = [("same", 1), ("same", 1), (None, None), ("other", 2)]  # duplicates allowed
    execute(
        node,
        [
            "CREATE TABLE loose (x TEXT, y INTEGER)",
            *[["INSERT INTO loose VALUES (?, ?)", *v] for v in values],
        ],
    )
    df = read(spark, node, "loose")
    assert df.columns == [ROWID_COLUMN, "x", "y", CID_COLUMN]
    got = df.collect()
    assert sorted([r[ROWID_COLUMN] for r in got]) == [1, 2, 3, 4]
    assert sorted(((r["x"], r["y"]) for r in got), key=repr) == sorted(values, key=repr)


@pytest.fixture(scope="module")
def numbers(node: Node) -> int:
    n = 20_000
    execute(
        node,
        [
            "CREATE TABLE numbers (id INTEGER PRIMARY KEY, v TEXT)",
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20000) "
            "INSERT INTO numbers SELECT i, 'v' || i FROM s",
        ],
    )
    return n


def test_parallel_partitions_cover_every_row_once(
    spark: SparkSession, node: Node, numbers: int
) -> None:
    df = read(spark, node, "numbers", partitions=4, page_rows=1500)
    assert df.rdd.getNumPartitions() == 4
    per_partition = df.rdd.glom().map(lambda rows: [r["id"] for r in rows]).collect()
    assert all(per_partition)  # every range has rows
    ids = [i for part in per_partition for i in part]
    assert len(ids) == numbers
    assert sorted(ids) == list(range(1, numbers + 1))
    for part in per_partition:
        assert part == sorted(part)  # key order inside a range


def test_explicit_ranges_read_one_chunk_each(spark: SparkSession, node: Node, numbers: int) -> None:
    ranges = [[None, [100], None], [[100], [5000], 50], [[19_990], None, None]]
    df = read(spark, node, "numbers", ranges=json.dumps(ranges), page_rows=30)
    assert df.rdd.getNumPartitions() == 3
    ids = sorted(r["id"] for r in df.select("id").collect())
    assert ids == [*range(1, 101), *range(101, 151), *range(19_991, 20_001)]


def test_docstring_examples_run(spark: SparkSession, node: Node, capsys: Any) -> None:
    """The module docstring's two examples, as written, against table "orders"."""
    execute(
        node,
        [
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, qty INTEGER)",
            *[["INSERT INTO orders VALUES (?, ?, ?)", i, f"item-{i}", i] for i in range(1, 8)],
        ],
    )
    doc = datasource_module.__doc__ or ""
    examples = [
        textwrap.dedent(block).replace("http://127.0.0.1:4001", node.url)
        for block in re.findall(r"::\n\n((?:    .*\n|\n)+)", doc)
    ]
    assert len(examples) == 2
    snapshot, stream = examples
    exec(snapshot, {"spark": spark})
    assert capsys.readouterr().out.strip() == "7"

    exec(stream, {"spark": spark})  # registers subscription orders-example at the head
    execute(node, ["UPDATE orders SET qty = 0 WHERE id = 1", "DELETE FROM orders WHERE id = 2"])
    names: dict[str, Any] = {"spark": spark}
    exec(stream, names)  # same subscription: starts from its hold
    got = spark.sql("SELECT _litecdc_op, id, _litecdc_cid FROM orders_changes").collect()
    assert [(r[0], r[1]) for r in got] == [("upsert", 1), ("delete", 2)]
    end = json.loads(names["query"].lastProgress["sources"][0]["endOffset"])
    assert end["cid"] >= got[-1][2]
    with SourceClient([node.url]) as c:
        hold = c.subscriptions().get("orders-example")
        assert hold is not None and hold.cid == end["cid"]  # processed: not held any more
        c.unsubscribe("orders-example")


@pytest.fixture(scope="module")
def moves(node: Node) -> tuple[int, list[tuple[str, int, Any]]]:
    """A table and, after cid ``start``, 20 transactions: their events in order.

    Subscription ``moves-stream`` holds them (without a hold the node may prune them as
    soon as another subscriber's hold moves past them)."""
    execute(node, ["CREATE TABLE moves (id INTEGER PRIMARY KEY, v TEXT)"])
    with SourceClient([node.url]) as c:
        start = c.register("moves-stream").cid
    expected: list[tuple[str, int, Any]] = []
    execute(node, [["INSERT INTO moves VALUES (?, ?)", i, f"v{i}"] for i in range(1, 9)])
    expected += [("upsert", i, f"v{i}") for i in range(1, 9)]  # one 8-event transaction
    for i in range(1, 9):
        if i % 3 == 0:
            execute(node, [["DELETE FROM moves WHERE id = ?", i]])
            expected.append(("delete", i, f"v{i}"))
        else:
            execute(node, [["UPDATE moves SET v = ? WHERE id = ?", f"w{i}", i]])
            expected.append(("upsert", i, f"w{i}"))
    for i in range(20, 24):
        execute(node, [["INSERT INTO moves VALUES (?, NULL)", i]])
        expected.append(("upsert", i, None))
    return start, expected


def stream(spark: SparkSession, node: Node, **options: Any) -> DataFrame:
    reader = (
        spark.readStream.format("litecdc")
        .option("url", node.url)
        .option("table", "moves")
        .option("mode", "changes")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_changes_batch_read(spark: SparkSession, node: Node, moves: Any) -> None:
    start, expected = moves
    df = read(spark, node, "moves", mode="changes", after_cid=start, page_rows=3)
    assert df.columns == [CID_COLUMN, SEQ_COLUMN, OP_COLUMN, "id", "v"]
    got = df.collect()
    assert [(r[OP_COLUMN], r["id"], r["v"]) for r in got] == expected
    positions = [(r[CID_COLUMN], r[SEQ_COLUMN]) for r in got]
    assert positions == sorted(positions)
    first_cid = got[0][CID_COLUMN]
    only_first = read(spark, node, "moves", mode="changes", after_cid=start, until_cid=first_cid)
    assert only_first.count() == 8


def test_changes_batch_read_with_nothing_to_read_is_empty(
    spark: SparkSession, node: Node, moves: Any
) -> None:
    """QA: a changes read from the head failed with 'PythonException … AssertionError':
    partitions() returned none, and PySpark then read InputPartition(None)."""
    with SourceClient([node.url]) as client:
        head = client.subscriptions().last_cid
    empty = read(spark, node, "moves", mode="changes", after_cid=head)
    assert empty.count() == 0
    assert empty.columns == [CID_COLUMN, SEQ_COLUMN, OP_COLUMN, "id", "v"]
    assert read(spark, node, "moves", ranges="[]").collect() == []  # no chunk to read
    with pytest.raises(Exception, match=r'"until_cid" \(5\) must be greater than "after_cid"'):
        read(spark, node, "moves", mode="changes", after_cid=5, until_cid=5).count()


def test_stream_available_now_in_cid_order_with_max_events(
    spark: SparkSession, node: Node, moves: Any, tmp_path: Path
) -> None:
    start, expected = moves
    batches: list[tuple[int, list[Any]]] = []

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, df.collect()))

    def run() -> None:
        query = (
            stream(spark, node, starting_cid=start, max_events=5, subscription="moves-stream")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(60)
        assert query.exception() is None

    with SourceClient([node.url]) as c:
        head = c.subscriptions().last_cid
        run()
        non_empty = [rows for _, rows in batches if rows]
        # the 8-event transaction is never split; then at most 5 events a batch
        assert [len(rows) for rows in non_empty] == [8, 5, 5, 2]
        events = [r for rows in non_empty for r in rows]
        assert [(r[OP_COLUMN], r["id"], r["v"]) for r in events] == expected
        positions = [(r[CID_COLUMN], r[SEQ_COLUMN]) for r in events]
        assert positions == sorted(positions)
        hold = c.subscriptions().get("moves-stream")
        assert hold is not None and hold.cid == head  # commit moved the hold

        execute(node, [["INSERT INTO moves VALUES (?, ?)", 99, "late"]])
        head = c.subscriptions().last_cid
        batches.clear()
        run()  # resumes from the checkpoint: only the new change
        assert [[r["id"] for r in rows] for _, rows in batches if rows] == [[99]]
        hold = c.subscriptions().get("moves-stream")
        assert hold is not None and hold.cid == head
        c.unsubscribe("moves-stream")


def test_stream_processing_time_sees_new_changes(spark: SparkSession, node: Node) -> None:
    execute(node, ["CREATE TABLE live (id INTEGER PRIMARY KEY, v INTEGER)"])
    with SourceClient([node.url]) as c:
        head = c.subscriptions().last_cid
    query = (
        spark.readStream.format("litecdc")
        .option("url", node.url)
        .option("table", "live")
        .option("mode", "changes")
        .option("starting_cid", head)
        .load()
        .writeStream.format("memory")
        .queryName("live_changes")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        for i in range(3):
            execute(node, [["INSERT INTO live VALUES (?, ?)", i, i * 10]])
        execute(node, ["UPDATE live SET v = -1 WHERE id = 1"])
        deadline = time.monotonic() + 30
        rows: list[Any] = []
        while time.monotonic() < deadline and len(rows) < 4:
            query.processAllAvailable()
            rows = spark.sql(
                "SELECT id, v FROM live_changes ORDER BY _litecdc_cid, _litecdc_seq"
            ).collect()
        assert [(r["id"], r["v"]) for r in rows] == [(0, 0), (1, 10), (2, 20), (1, -1)]
    finally:
        query.stop()


def test_missing_table_option(spark: SparkSession, node: Node) -> None:
    with pytest.raises(Exception, match='option "table" is required'):
        spark.read.format("litecdc").option("url", node.url).load()
    with pytest.raises(Exception, match='option "url" is required'):
        spark.read.format("litecdc").option("table", "kinds").load()


def test_unknown_table(spark: SparkSession, node: Node) -> None:
    with pytest.raises(Exception, match=r"table 'nosuch' not found"):
        read(spark, node, "nosuch")


def test_unreachable_url(spark: SparkSession) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=rf"source {re.escape(url)}: unreachable"):
        spark.read.format("litecdc").option("url", url).option("table", "t").load()


def test_stream_needs_mode_changes(spark: SparkSession, node: Node, kinds: Any) -> None:
    df = spark.readStream.format("litecdc").option("url", node.url).option("table", "kinds").load()
    with pytest.raises(Exception, match=r'option\("mode", "changes"\)'):
        df.writeStream.format("memory").queryName("nope").start().awaitTermination(30)


def test_options_parse_once_and_pickle() -> None:
    import pickle

    opts = LitecdcOptions.parse(
        {
            "URL": "http://a:1, http://b:2",
            "table": "t",
            "partitions": "8",
            "ranges": "[[null, [5], 10]]",
            "password": "hunter2",
        }
    )
    assert opts.urls == ("http://a:1", "http://b:2")
    assert (
        opts.partitions == 8 and opts.page_rows == DEFAULT_PAGE_ROWS and opts.max_events == 100_000
    )
    assert opts.starting_cid is None and opts.mode == "snapshot"
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert "hunter2" not in repr(opts)
    with pytest.raises(Exception, match='"partitions" must be an integer'):
        LitecdcOptions.parse({"url": "http://a:1", "table": "t", "partitions": "many"})
    with pytest.raises(Exception, match='"ranges" must be a JSON list'):
        LitecdcOptions.parse({"url": "http://a:1", "table": "t", "ranges": "[1]"})
    with pytest.raises(Exception, match='option "ca_cert": cannot read /nonexistent'):
        LitecdcOptions.parse({"url": "https://a:1", "table": "t", "ca_cert": "/nonexistent"})
    with pytest.raises(Exception, match='"mode" must be'):
        LitecdcOptions.parse({"url": "http://a:1", "table": "t", "mode": "stream"})


def test_stream_of_an_expired_subscription_fails_instead_of_skipping(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Restarting at the head would silently skip what the node pruned."""
    capped = Node(tmp_path / "capped", "--retention-cids", "3").start()
    try:
        execute(capped, ["CREATE TABLE moves (id INTEGER PRIMARY KEY, v TEXT)"])
        with SourceClient([capped.url]) as client:
            client.register("late")
            for i in range(8):  # more than 3 commits behind; the keeper expires the hold
                execute(capped, [["INSERT INTO moves VALUES (?, ?)", i, "x"]])
            deadline = time.monotonic() + 30
            while not client.subscriptions().get("late").expired:  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                time.sleep(0.2)
        query = (
            stream(spark, capped, subscription="late")
            .writeStream.format("memory")
            .queryName("late_changes")
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="hold expired"):
            query.awaitTermination(60)
    finally:
        capped.stop()
