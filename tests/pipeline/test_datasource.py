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
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import litecdc.pipeline.datasource as datasource_module
from litecdc.errors import UnloggedChangesError
from litecdc.pipeline.datasource import DEFAULT_PAGE_ROWS, LitecdcOptions, StreamReader
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
    with pytest.raises(Exception, match=r'option\("mode", "changes"\)') as refused:
        df.writeStream.format("memory").queryName("nope").start().awaitTermination(30)
    # PySpark's stream runner used to add an error of its own to ours
    assert "UnboundLocalError" not in str(refused.value)


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
    # QA: a max_rows of `true` passed (a bool is an int); a blank until_cid was 0
    with pytest.raises(Exception, match='"ranges" must be a JSON list'):
        LitecdcOptions.parse({"url": "http://a:1", "table": "t", "ranges": "[[null, null, true]]"})
    assert (
        LitecdcOptions.parse({"url": "http://a:1", "table": "t", "until_cid": " "}).until_cid
        is None
    )
    # QA: credentials in the address were ignored (a 401), and the error showed them
    with pytest.raises(
        Exception, match=r"http://alice:\*\*\*@a:1: credentials go in the user"
    ) as e:
        LitecdcOptions.parse({"url": "http://alice:secret@a:1", "table": "t"})
    assert "secret" not in str(e.value)


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


def test_a_stream_registered_at_its_starting_cid_reads_every_change_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Docs QA: with `starting_cid` and a subscription the node did not know, the hold was
    placed at the head; the node (no other hold) pruned every change before it, and the
    stream failed at once (changes after cid 0 no longer available)."""
    fresh = Node(tmp_path / "fresh").start()
    try:
        execute(fresh, ["CREATE TABLE moves (id INTEGER PRIMARY KEY, v TEXT)"])
        for i in range(4):
            execute(fresh, [["INSERT INTO moves VALUES (?, ?)", i, f"v{i}"]])
        execute(fresh, ["UPDATE moves SET v = 'new' WHERE id = 2"])
        with SourceClient([fresh.url]) as c:
            written = c.subscriptions().last_cid

        def run(name: str, **options: Any) -> list[tuple[Any, ...]]:
            query = (
                stream(spark, fresh, subscription="from-start", **options)
                .writeStream.format("memory")
                .queryName(name)
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(60)
            assert query.exception() is None
            rows = spark.sql(f"SELECT {OP_COLUMN}, id, v FROM {name}").collect()
            return sorted(tuple(r) for r in rows)

        got = run("from_start", starting_cid=0)
        assert got == sorted([*(("upsert", i, f"v{i}") for i in range(4)), ("upsert", 2, "new")])
        with SourceClient([fresh.url]) as c:
            hold = c.subscriptions().get("from-start")
            assert hold is not None and hold.cid >= written  # moved on as it read
            # past its hold now: a start before it cannot be served, and says so
            c.unsubscribe("from-start")
            c.register("keeper")
            execute(fresh, [["INSERT INTO moves VALUES (?, ?)", 9, "late"]])
            c.progress("keeper", c.subscriptions().last_cid)  # the node prunes to it
        with pytest.raises(
            Exception, match=r"cannot place the hold of subscriber 'from-start' at cid 1"
        ):
            run("pruned_past", starting_cid=1)
    finally:
        fresh.stop()


# -- QA of the data source used directly -------------------------------------------------


def test_misspelt_options_are_refused(spark: SparkSession, node: Node, kinds: Any) -> None:
    """QA: `startingcid`, `subscriptoin`, `partition` were ignored — the read went on with
    the defaults (a stream from the head, without a hold), silently."""
    with pytest.raises(Exception, match=r"unknown option\(s\) 'partition'; its options are url"):
        read(spark, node, "kinds", partition=4).count()
    with pytest.raises(Exception, match=r"unknown option\(s\) 'startingcid', 'subscriptoin'"):
        LitecdcOptions.parse(
            {"url": "http://a:1", "table": "t", "startingCid": "5", "subscriptoin": "s"}
        )


def test_a_cid_beyond_the_head_is_refused(spark: SparkSession, node: Node, moves: Any) -> None:
    """QA: a stream starting after a cid beyond the node's head returned nothing, and on
    restart skipped every change up to that cid, silently; an until_cid beyond the head
    failed inside a task, naming a min_cid the user never gave and blaming a restore."""
    with SourceClient([node.url]) as client:
        head = client.subscriptions().last_cid
    beyond = rf"option \"{{}}\" \({head + 95}\) is beyond the node's head \(cid {head}\)"
    query = (
        stream(spark, node, starting_cid=head + 95)
        .writeStream.format("memory")
        .queryName("beyond_changes")
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=beyond.format("starting_cid")):
        query.awaitTermination(60)
    with pytest.raises(Exception, match=beyond.format("until_cid")):
        read(spark, node, "moves", mode="changes", after_cid=1, until_cid=head + 95).count()
    with pytest.raises(Exception, match=beyond.format("after_cid")):
        read(spark, node, "moves", mode="changes", after_cid=head + 95).count()
    assert read(spark, node, "moves", mode="changes", after_cid=head).count() == 0


def test_a_stream_from_a_starting_cid_places_its_subscriptions_hold(
    spark: SparkSession, node: Node
) -> None:
    """QA: with a starting_cid, the subscription was never registered: each commit only
    warned that the node knew no such subscriber, and nothing held the changes."""
    execute(node, ["CREATE TABLE placed (id INTEGER PRIMARY KEY, v TEXT)"])
    with SourceClient([node.url]) as client:
        start = client.register("placed-keeper").cid  # (keeps them until the stream holds)
    execute(node, [["INSERT INTO placed VALUES (?, ?)", i, f"v{i}"] for i in (1, 2)])
    execute(node, ["DELETE FROM placed WHERE id = 1"])
    expected = [("upsert", 1, "v1"), ("upsert", 2, "v2"), ("delete", 1, "v1")]
    with SourceClient([node.url]) as client:
        head = client.subscriptions().last_cid  # (the last event's: the hold goes past it)
    query = (
        stream(spark, node, starting_cid=start, subscription="from-a-cid", table="placed")
        .writeStream.format("memory")
        .queryName("from_a_cid")
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(60) and query.exception() is None
    rows = spark.sql("SELECT * FROM from_a_cid ORDER BY _litecdc_cid, _litecdc_seq").collect()
    assert [(r[OP_COLUMN], r["id"], r["v"]) for r in rows] == expected
    with SourceClient([node.url]) as client:
        hold = client.subscriptions().get("from-a-cid")
        assert hold is not None and hold.cid >= head  # (moving it is a commit itself)
        client.unsubscribe("from-a-cid")
        client.unsubscribe("placed-keeper")


def test_a_column_added_under_a_change_read_fails_it(spark: SparkSession, node: Node) -> None:
    """QA: a change read (a running stream's batches too) whose columns were taken before
    ALTER TABLE … ADD COLUMN left the new column's values out, silently."""
    execute(node, ["CREATE TABLE grows (id INTEGER PRIMARY KEY, v TEXT)"])
    with SourceClient([node.url]) as client:
        start = client.subscriptions().last_cid
    execute(node, ["INSERT INTO grows VALUES (1, 'a')"])
    df = read(spark, node, "grows", mode="changes", after_cid=start)  # (its columns now)
    execute(node, ["ALTER TABLE grows ADD COLUMN w INTEGER"])
    execute(node, ["INSERT INTO grows VALUES (2, 'b', 33)"])
    with pytest.raises(Exception, match=r"table grows gained column\(s\) w after cid"):
        df.collect()
    again = read(spark, node, "grows", mode="changes", after_cid=start).collect()
    assert [(r["id"], r["v"], r["w"]) for r in again] == [(1, "a", None), (2, "b", 33)]


def test_a_table_created_again_during_a_snapshot_read_fails_it(node: Node) -> None:
    """QA: a table dropped and created again while a snapshot paged through it gave rows
    of both versions (594 old, 2406 new), without an error."""
    from litecdc.errors import TableReshapedError
    from litecdc.pipeline.datasource import read_key_range

    create = "CREATE TABLE twice (id INTEGER PRIMARY KEY, gen TEXT)"

    def fill(gen: str) -> list[Any]:
        return [["INSERT INTO twice VALUES (?, ?)", i, gen] for i in range(1, 13)]

    execute(node, [create, *fill("old")])
    with SourceClient([node.url]) as client:
        reshaped = client.table_info("twice").reshaped_cid
        pages = read_key_range(
            client, "twice", None, None, None, 3, ("id", "gen"), reshaped_cid=reshaped
        )
        first = next(pages)
        assert first.column("gen").to_pylist() == ["old"] * 3
        execute(node, ["DROP TABLE twice"])
        execute(node, [create, *fill("new")])
        with pytest.raises(TableReshapedError, match="while it was being read"):
            list(pages)
        # read again: the new version, whole
        pages = read_key_range(
            client, "twice", None, None, None, 3, ("id", "gen"),
            reshaped_cid=client.table_info("twice").reshaped_cid,
        )  # fmt: skip
        assert [g for page in pages for g in page.column("gen").to_pylist()] == ["new"] * 12


def test_a_table_created_again_under_a_running_stream_stops_it(
    spark: SparkSession, node: Node
) -> None:
    """QA: DROP TABLE then CREATE TABLE under a running stream: no event tells of the drop,
    and the stream went on with the new table's inserts — the old rows kept by whatever
    it built. The stream stops, saying the table was reshaped."""
    execute(node, ["CREATE TABLE again (id INTEGER PRIMARY KEY, v TEXT)"])
    with SourceClient([node.url]) as client:
        head = client.subscriptions().last_cid
    query = (
        spark.readStream.format("litecdc")
        .option("url", node.url)
        .option("table", "again")
        .option("mode", "changes")
        .option("starting_cid", head)
        .load()
        .writeStream.format("memory")
        .queryName("again_changes")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        execute(node, ["INSERT INTO again VALUES (1, 'old')"])
        deadline = time.monotonic() + 60
        while not spark.sql("SELECT * FROM again_changes").collect():
            assert time.monotonic() < deadline and query.exception() is None
            time.sleep(0.2)
        # (one commit: while the table is missing, a stream fails with "not found")
        execute(node, ["DROP TABLE again", "CREATE TABLE again (id INTEGER PRIMARY KEY, v TEXT)"])
        execute(node, ["INSERT INTO again VALUES (2, 'new')"])
        with pytest.raises(Exception, match=r"table again was reshaped at cid \d+ .* while this"):
            query.awaitTermination(60)
        assert [r["id"] for r in spark.sql("SELECT id FROM again_changes").collect()] == [1]
    finally:
        query.stop()


def test_a_stream_started_again_after_its_table_was_created_again_stops(
    spark: SparkSession, node: Node, tmp_path: Path
) -> None:
    """QA: run 1 of a checkpointed stream read rows 1 to 3; the table was dropped and created
    again with row 4; run 2 on the checkpoint added row 4 only — its sink then held rows
    1 to 4 where the source held 4. Run 2 stops instead, saying why; so does a new query
    or a batch read from before the drop."""
    execute(node, ["CREATE TABLE later (id INTEGER PRIMARY KEY, v TEXT)"])
    with SourceClient([node.url]) as client:
        head = client.register("later-keeper").cid  # (the node keeps the changes)
    execute(node, [["INSERT INTO later VALUES (?, 'old')", i] for i in (1, 2, 3)])

    def run(starting_cid: int, out: str) -> list[int]:
        query = (
            spark.readStream.format("litecdc")
            .option("url", node.url)
            .option("table", "later")
            .option("mode", "changes")
            .option("starting_cid", starting_cid)
            .load()
            .writeStream.format("parquet")
            .option("path", str(tmp_path / out))
            .option("checkpointLocation", str(tmp_path / f"{out}-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(60)
        return sorted(r["id"] for r in spark.read.parquet(str(tmp_path / out)).collect())

    assert run(head, "out") == [1, 2, 3]
    with SourceClient([node.url]) as client:
        before = client.subscriptions().last_cid
    execute(node, ["DROP TABLE later", "CREATE TABLE later (id INTEGER PRIMARY KEY, v TEXT)"])
    execute(node, ["INSERT INTO later VALUES (4, 'new')"])
    with pytest.raises(Exception, match="after this stream's position"):
        run(head, "out")
    assert sorted(r["id"] for r in spark.read.parquet(str(tmp_path / "out")).collect()) == [1, 2, 3]
    # data-source QA: a new query, or a batch read, from before the DROP went on with the
    # new table's rows, no event telling of the rows dropped. The node records the drop
    # (unlogged_cid): reads across it are refused; from it on they are the new table's
    with SourceClient([node.url]) as client:
        dropped = client.table_info("later").unlogged_cid
    assert dropped == before + 1
    refused = rf"table later: commit {dropped} changed the rows under this name without change"
    with pytest.raises(Exception, match=refused):
        run(before, "new")
    with pytest.raises(Exception, match=refused):
        read(spark, node, "later", mode="changes", after_cid=before).collect()
    assert run(dropped, "new") == [4]
    with SourceClient([node.url]) as client:
        client.unsubscribe("later-keeper")


def test_a_stream_reads_up_to_rows_changed_without_events_then_stops(node: Node) -> None:
    """Data-source QA: a stream went past ADD COLUMN … DEFAULT on a table with rows (the
    rows gained the value, no event told). It reads every change before that commit —
    a delete there still reaches its consumer — then stops, saying why. (The planning
    side of a stream, run here without Spark: what it asks of the node is the same.)"""
    execute(node, ["CREATE TABLE gains (id INTEGER PRIMARY KEY, v TEXT)"])
    execute(node, [["INSERT INTO gains VALUES (?, 'x')", i] for i in (1, 2)])
    with SourceClient([node.url]) as client:
        start = client.register("gains-keeper").cid
    execute(node, ["DELETE FROM gains WHERE id = 1"])
    execute(node, ["ALTER TABLE gains ADD COLUMN d TEXT DEFAULT 'dflt'"])
    execute(node, ["INSERT INTO gains(id) VALUES (3)"])
    opts = LitecdcOptions.parse(
        {"url": node.url, "table": "gains", "mode": "changes", "starting_cid": str(start)}
    )
    reader = StreamReader(opts, ("id", "v", "d"))
    try:
        with SourceClient([node.url]) as client:
            added = client.table_info("gains").unlogged_cid
        assert start < added - 1
        assert reader.initialOffset() == {"cid": start}
        for limit in (ReadAllAvailable(), ReadMaxRows(1000)):
            assert reader.latestOffset({"cid": start}, limit) == {"cid": added - 1}
        with pytest.raises(UnloggedChangesError, match=rf"commit {added} changed the rows"):
            reader.latestOffset({"cid": added - 1}, ReadAllAvailable())
    finally:
        reader.stop()
        with SourceClient([node.url]) as client:
            client.unsubscribe("gains-keeper")
