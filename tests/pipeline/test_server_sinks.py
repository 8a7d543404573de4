"""PipelineServer with real sinks, against a real node: what it decides for the message
sinks and MariaDB.

- a column with a DEFAULT added while ``pipeline run`` was stopped is copied again to
  NATS and RabbitMQ too (the decision compares the table description recorded for the
  subscription with the source's, whatever the sink);
- a new subscription reusing an old one's name does not inherit its NATS progress;
- ±infinity reads the same in a REAL column and an untyped one;
- a MariaDB key too long for its column, or a PostgreSQL key too long for its index, stops
  the subscription with an error naming it, until the row is deleted at the source — then
  it goes on;
- a subscription re-created under its name loses no NATS message to de-duplication, nor
  a RabbitMQ message or a webhook to a consumer that de-duplicates;
- ``verify`` counts a row a Delta mirror holds twice as a difference.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pytest
from e2e.litecdc_node import Node
from fakes.webhook_receiver import WebhookReceiver
from pipeline_proc import execute, rounds_until_caught_up, wait_until_pruned_past
from sink_contract import consume, incompressible, nats_raw_messages, rabbitmq_messages

from litecdc.pipeline import control
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.server import PipelineServer
from litecdc.pipeline.sinks.base import ChangeBatch
from litecdc.pipeline.sinks.registry import open_sink
from litecdc.pipeline.source_client import SourceClient
from litecdc.pipeline.verify import verify

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark

Docs = Callable[[], list[dict[str, Any]]]  # the documents sent since the last call


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    opened = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    yield opened
    opened.close()


def tag() -> str:
    return uuid.uuid4().hex[:10]


def run(store: MetadataStore, spark: SparkSession) -> PipelineServer:
    """One ``pipeline run --until-caught-up`` (a failing subscription gives up quickly)."""
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    server.run(until_caught_up=True)
    return server


def message_sink(kind: str, request: pytest.FixtureRequest) -> tuple[str, Docs]:
    """A fresh NATS stream or RabbitMQ queue: its sink URL, and a reader of what arrived."""
    name = tag()
    if kind == "nats":
        server = request.getfixturevalue("nats_url")
        seen = 0

        def from_stream() -> list[dict[str, Any]]:
            nonlocal seen
            found = nats_raw_messages(server, f"S{name}")
            new, seen = found[seen:], len(found)
            return [doc for _, doc in new]

        return f"{server}?stream=S{name}&subject=t{name}", from_stream
    base = request.getfixturevalue("rabbitmq_url")
    return f"{base}?queue=q{name}", lambda: [d for _, d in rabbitmq_messages(base, f"q{name}")]


def by_key(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(op, row) of the row messages, by key (a snapshot's end carries no row)."""
    rows = ((d["op"], d["row"]) for d in docs if d["op"] != "snapshot_done")
    return sorted(rows, key=lambda x: (x[1]["id"], x[0]))


def snapshot_ends(docs: list[dict[str, Any]]) -> list[int]:
    """The cids of the 'snapshot_done' messages among ``docs``."""
    return [d["cid"] for d in docs if d["op"] == "snapshot_done"]


@pytest.mark.parametrize("kind", ["nats", "rabbitmq"])
def test_column_with_a_default_added_while_stopped_is_copied_again_to_message_sinks(
    node: Node,
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    kind: str,
) -> None:
    """QA: the restart decision read the sink's added_columns, which only the mirror sinks
    set: NATS and RabbitMQ consumers never learnt the existing rows' value of the column
    (a running server did re-copy; a restarted one did not)."""
    table = f"dflt_{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2, 3)])
    url, sent = message_sink(kind, request)
    control.subscribe(store, name=table, sources=node.url, table=table, sink=url)
    assert run(store, spark).states[table].last_error is None
    first = sent()
    assert by_key(first) == [("snapshot", {"id": i, "a": f"a{i}"}) for i in (1, 2, 3)]
    assert first[-1]["op"] == "snapshot_done"

    with node.client() as c:  # while no server runs
        execute(c, [f"DELETE FROM {table} WHERE id = 2"])
        execute(c, [f"ALTER TABLE {table} ADD COLUMN c TEXT DEFAULT 'dflt'"])
        execute(c, [[f"INSERT INTO {table}(id, a) VALUES(?, ?)", 4, "a4"]])
    assert run(store, spark).states[table].last_error is None
    docs = sent()
    # first the changes it had not had, up to the ADD COLUMN (the node refuses a read
    # across it): the new snapshot cannot tell a consumer about the row deleted meanwhile
    # (pipeline QA: such deletes were lost, consumers kept the rows)
    assert [(d["op"], d["row"]["id"]) for d in docs[:1]] == [("delete", 2)]
    # then every row again, with the value SQLite gave it, and the end of that snapshot
    assert by_key(docs[1:]) == [
        ("snapshot", {"id": i, "a": f"a{i}", "c": "dflt"}) for i in (1, 3, 4)
    ]
    assert docs[-1]["op"] == "snapshot_done" and snapshot_ends(docs) == [docs[-1]["cid"]]
    assert consume(first + docs) == {(i,): {"id": i, "a": f"a{i}", "c": "dflt"} for i in (1, 3, 4)}
    assert [c["name"] for c in (store.mirrored_spec(table) or {})["columns"]] == ["id", "a", "c"]


@pytest.mark.parametrize("kind", ["nats", "rabbitmq"])
def test_column_with_a_default_added_while_running_sends_the_pending_changes_first(
    node: Node,
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    kind: str,
) -> None:
    """Pipeline QA: the re-copy started at once, skipping the changes not sent yet: a row
    deleted before the column came got no delete message, and consumers kept it."""
    table = f"dflr_{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2, 3)])
    url, sent = message_sink(kind, request)
    control.subscribe(store, name=table, sources=node.url, table=table, sink=url)
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        rounds_until_caught_up(server, node, table)
        assert by_key(sent()) == [("snapshot", {"id": i, "a": f"a{i}"}) for i in (1, 2, 3)]
        with node.client() as c:
            execute(c, [f"DELETE FROM {table} WHERE id = 2"])
            execute(c, [f"ALTER TABLE {table} ADD COLUMN c TEXT DEFAULT 'dflt'"])
        rounds_until_caught_up(server, node, table)
    finally:
        server.close()
    docs = sent()
    assert [(d["op"], d["row"]["id"]) for d in docs[:1]] == [("delete", 2)]
    assert by_key(docs[1:]) == [("snapshot", {"id": i, "a": f"a{i}", "c": "dflt"}) for i in (1, 3)]
    assert docs[-1]["op"] == "snapshot_done"


def test_a_table_created_again_after_changes_not_sent_yet_is_copied_again(
    node: Node, spark: SparkSession, store: MetadataStore, request: pytest.FixtureRequest
) -> None:
    """Pipeline QA: a delete not sent yet, then DROP TABLE and CREATE again: sending the
    changes it had not had before the re-copy read events from before the reshape, which
    the node refuses (another shape) — the subscription failed on every retry and was
    never copied again. It is copied again; the snapshot's end tells of the rows gone."""
    table = f"drc_{tag()}"
    create = f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"
    with node.client() as c:
        execute(c, [create])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2, 3)])
    url, sent = message_sink("nats", request)
    control.subscribe(store, name=table, sources=node.url, table=table, sink=url)
    assert run(store, spark).states[table].last_error is None
    first = sent()
    with node.client() as c:  # while no server runs
        execute(c, [f"DELETE FROM {table} WHERE id = 1"])
        execute(c, [f"DROP TABLE {table}", create, f"INSERT INTO {table} VALUES(3, 'new')"])
    assert run(store, spark).states[table].last_error is None
    docs = sent()
    assert docs[-1]["op"] == "snapshot_done"
    assert consume(first + docs) == {(3,): {"id": 3, "a": "new"}}


@pytest.mark.parametrize("kind", ["nats", "rabbitmq"])
def test_consumer_drops_rows_deleted_while_the_position_expired_at_the_snapshot_done_message(
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    kind: str,
) -> None:
    """Pipeline QA: once the node pruned past a subscription (its retention cap), the
    deletes it had not sent were gone; the re-snapshot re-sent the rows left, and a NATS
    or RabbitMQ consumer could not tell which of its rows were not among them (no end of
    the snapshot was sent). Now 'snapshot_done' says: rows not re-sent are gone."""
    table = f"exp_{tag()}"
    capped = Node(tmp_path / "capped", "--retention-cids", "3").start()
    try:
        with capped.client() as c:
            execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
            execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2, 3)])
        url, sent = message_sink(kind, request)
        control.subscribe(store, name=table, sources=capped.url, table=table, sink=url)
        assert run(store, spark).states[table].last_error is None
        first = sent()
        assert consume(first) == {(i,): {"id": i, "a": f"a{i}"} for i in (1, 2, 3)}

        # while no pipeline runs: a delete, then more commits than the node keeps
        with capped.client() as c:
            execute(c, [f"DELETE FROM {table} WHERE id = 2"])
            for i in range(4, 10):
                execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"]])
        applied = store.progress(table).last_log_index or 0
        wait_until_pruned_past(capped, table, applied)
        assert run(store, spark).states[table].last_error is None
        docs = first + sent()
        assert docs[-1]["op"] == "snapshot_done"
        assert [d["key"] for d in docs if d["op"] == "delete"] == []  # it was pruned
        expected = {(i,): {"id": i, "a": f"a{i}"} for i in (1, 3, 4, 5, 6, 7, 8, 9)}
        assert consume(docs) == expected
    finally:
        capped.stop()


@pytest.mark.parametrize(
    "change", ["DROP TABLE {t}", "ALTER TABLE {t} ADD COLUMN c INTEGER DEFAULT 7"]
)
def test_a_table_to_copy_again_whose_position_expired_meanwhile_is_copied_again(
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    change: str,
) -> None:
    """Reshape QA: reshaped (or given a column with a DEFAULT) while no pipeline ran, and
    pruned past meanwhile, a message sink's subscription failed on every retry ('changes
    after cid 3 are no longer available') and was never copied again: sending it the
    changes it had not had, before the re-copy, met the expired position."""
    table = f"rx_{tag()}"
    create = f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"
    capped = Node(tmp_path / "capped", "--retention-cids", "3").start()
    try:
        with capped.client() as c:
            execute(c, [create])
            execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2)])
        url, sent = message_sink("nats", request)
        control.subscribe(store, name=table, sources=capped.url, table=table, sink=url)
        assert run(store, spark).states[table].last_error is None
        first = sent()
        with capped.client() as c:  # while no pipeline runs
            statements = [change.format(t=table)]
            if change.startswith("DROP"):
                statements += [create, f"INSERT INTO {table} VALUES(3, 'a3')"]
            execute(c, statements)
            for i in range(6):  # more commits than the node keeps: the hold expires
                execute(
                    c,
                    [
                        f"CREATE TABLE IF NOT EXISTS f_{table}(x)",
                        f"INSERT INTO f_{table} VALUES({i})",
                    ],
                )
        applied = store.progress(table).last_log_index or 0
        wait_until_pruned_past(capped, table, applied)
        assert run(store, spark).states[table].last_error is None
        with capped.client() as c:
            r = c.get("/db/query", params={"q": f"SELECT * FROM {table}", "associative": ""})
            source = {(row["id"],): row for row in r.json()["results"][0].get("rows", [])}
        assert consume(first + sent()) == source
    finally:
        capped.stop()


def test_new_subscription_reusing_a_name_does_not_skip_changes_to_nats(
    node: Node, spark: SparkSession, store: MetadataStore, nats_url: str
) -> None:
    """QA: the NATS sink keeps the cid it applied through in a JetStream KV keyed by stream
    and subscription name, which outlives the subscription: a new one of the same name
    (here: the old one had got to cid 1,000,000 on another source) skipped every change
    up to that cid, and the run reported them applied."""
    table, name = f"reuse_{tag()}", tag()
    url = f"{nats_url}?stream=S{name}&subject=t{name}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2)])
        spec = SourceClient([node.url]).table_spec(table)
    old = open_sink(url, spec, "reused")  # what the old subscription left behind
    try:
        assert old.write_changes(
            spec.change_schema().empty_table(), ChangeBatch("reused", 0, 10**6)
        )
    finally:
        old.close()

    control.subscribe(store, name="reused", sources=node.url, table=table, sink=url)
    assert run(store, spark).states["reused"].last_error is None
    with node.client() as c:
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", 3, "a3"]])
        execute(c, [f"DELETE FROM {table} WHERE id = 1"])
    assert run(store, spark).states["reused"].last_error is None
    docs = [doc for _, doc in nats_raw_messages(nats_url, f"S{name}")]
    assert [(d["op"], d["key"]) for d in docs if d["op"] not in ("snapshot", "snapshot_done")] == [
        ("upsert", {"id": 3}),
        ("delete", {"id": 1}),
    ]


def test_a_new_subscription_takes_over_a_kept_mirror_another_source_filled(
    node: Node, spark: SparkSession, store: MetadataStore, tmp_path: Path
) -> None:
    """Sinks QA: a subscription re-created under its name on another source, its Delta,
    PostgreSQL or MariaDB mirror kept, left the mirror stale, silently: the old rows'
    cids (the other source's) were above every cid here, so the version guard kept
    them against the snapshot, and the sweep too. The server has the sink disown them
    when the new subscription registers (review: the sinks' own test alone would pass
    with the server's call gone)."""
    import pyarrow as pa

    table, name = f"kept_{tag()}", f"kept{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2)])
        spec = SourceClient([node.url]).table_spec(table)
    url = f"delta:{tmp_path}/kept"
    old = open_sink(url, spec, name)  # what the other source's subscription left
    try:
        far = 10**6
        old.write_snapshot(
            pa.Table.from_pylist(
                [
                    {"id": 1, "a": "other", "_litecdc_cid": far},
                    {"id": 3, "a": "x", "_litecdc_cid": far},
                ],
                schema=spec.row_schema(),
            )
        )
    finally:
        old.close()

    control.subscribe(store, name=name, sources=node.url, table=table, sink=url)
    assert run(store, spark).states[name].last_error is None
    report = verify(store.get_subscription(name))
    assert report.ok, report
    mirrored = open_sink(url, spec, name)
    try:
        rows = mirrored.read_rows().sort_by("id").to_pylist()
    finally:
        mirrored.close()
    assert rows == [{"id": 1, "a": "a1"}, {"id": 2, "a": "a2"}]


def test_infinity_reads_the_same_in_a_real_and_an_untyped_column(
    node: Node, spark: SparkSession, store: MetadataStore, request: pytest.FixtureRequest
) -> None:
    """QA: a REAL column's -inf was sent as "-Infinity", an untyped column's (which the
    node sends as text, as Python writes the number) as "-inf"."""
    table = f"inf_{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, r REAL, u)"])
        execute(c, [f"INSERT INTO {table} VALUES(1, 9e999, 9e999), (2, -9e999, -9e999)"])
    url, sent = message_sink("nats", request)
    control.subscribe(store, name=table, sources=node.url, table=table, sink=url)
    assert run(store, spark).states[table].last_error is None
    with node.client() as c:
        execute(c, [f"INSERT INTO {table} VALUES(3, -9e999, -9e999)"])
    assert run(store, spark).states[table].last_error is None
    rows = [(op, row["id"], row["r"], row["u"]) for op, row in by_key(sent())]
    assert rows == [
        ("snapshot", 1, "inf", "inf"),
        ("snapshot", 2, "-inf", "-inf"),
        ("upsert", 3, "-inf", "-inf"),
    ]


def _long_key_stops_the_subscription_until_the_row_is_deleted(
    node: Node,
    spark: SparkSession,
    store: MetadataStore,
    *,
    sink: str,
    long_key: str,
    short_keys: list[str],
    error_parts: list[str],
) -> None:
    """A row whose key the sink cannot hold fails the subscription, naming the key column,
    in the snapshot and in the change log; once the row is deleted at the source (in a
    later batch), the subscription goes on and the mirror equals the source."""
    table = f"keys_{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(region TEXT, n INTEGER, v TEXT, "
                    "PRIMARY KEY (region, n))"])  # fmt: skip
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?, ?)", r, 1, "v"] for r in short_keys])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?, ?)", long_key, 2, "long"]])
    control.subscribe(
        store, name=table, sources=node.url, table=table, sink=sink,
        options={"max_events": 1},  # one transaction per batch: the delete comes in a later one
    )  # fmt: skip

    def fails_naming_the_key_column() -> None:
        error = run(store, spark).states[table].last_error
        assert error is not None, "the long key was accepted"
        assert f"table {table} with key" in error, error
        for part in error_parts:
            assert part in error, error

    fails_naming_the_key_column()  # in the snapshot
    with node.client() as c:
        execute(c, [[f"DELETE FROM {table} WHERE n = ?", 2]])
    assert run(store, spark).states[table].last_error is None
    assert verify(store.get_subscription(table)).ok

    with node.client() as c:  # in the change log, then more commits
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?, ?)", long_key, 3, "again"]])
        execute(c, [[f"UPDATE {table} SET v = ? WHERE n = ?", "longer still", 3]])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?, ?)", "c", 1, "after"]])
    fails_naming_the_key_column()
    with node.client() as c:
        execute(c, [[f"DELETE FROM {table} WHERE n = ?", 3]])
        execute(c, [[f"UPDATE {table} SET v = ? WHERE region = ?", "last", "a"]])
    assert run(store, spark).states[table].last_error is None
    report = verify(store.get_subscription(table))
    assert report.ok and report.sink_rows == len(short_keys) + 1, report.differences


def test_mariadb_key_too_long_stops_the_subscription_until_the_row_is_deleted_at_the_source(
    node: Node, spark: SparkSession, store: MetadataStore, mariadb_db_url: str
) -> None:
    """QA: a text key longer than the mirror's VARBINARY(3064) key column failed with the
    server's 'Data too long for column', and kept failing after the row was deleted at the
    source: the delete's key went through a staging table with the same limit."""
    _long_key_stops_the_subscription_until_the_row_is_deleted(
        node, spark, store,
        sink=f"{mariadb_db_url}?table=m",
        long_key="k" * 4000,
        short_keys=["a", "b"],
        error_parts=[
            "m at mysql://",
            "key column 'region' is varbinary(3064), at most 3064 bytes",
            "its value is 4000 bytes",
            "delete the row",
        ],
    )  # fmt: skip


def test_postgresql_key_too_long_for_its_index_stops_the_subscription_until_the_row_is_deleted(
    node: Node, spark: SparkSession, store: MetadataStore, postgresql_db_url: str
) -> None:
    """QA: a primary key longer than a PostgreSQL btree entry holds (2,704 bytes, after
    compression) failed with 'index row size … exceeds btree version 4 maximum 2704',
    naming no row, and kept failing after the row was deleted at the source: the server's
    look-ahead only knew MariaDB's refusals."""
    _long_key_stops_the_subscription_until_the_row_is_deleted(
        node, spark, store,
        sink=f"{postgresql_db_url}?table=m",
        long_key=incompressible(4000),
        # 50,000 times one letter compresses to a few hundred bytes: that key fits
        short_keys=["a", "b", "k" * 50_000],
        error_parts=[
            "public.m at postgresql://",
            "key column 'region' holds 4000 bytes",
            "at most 2704 bytes, after compression",
            "delete the row or shorten its key at the source",
        ],
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["nats", "rabbitmq", "webhook"])
def test_subscription_recreated_under_its_name_loses_nothing_to_a_deduplicating_consumer(
    kind: str,
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """QA: message ids were SUBSCRIPTION:cid-seq-op (NATS), cid-seq-op (RabbitMQ's
    message_id) and SUBSCRIPTION-AFTER-END-PART (the webhook's webhook-id): a subscription
    re-created under its name on another source with the same history (so the same cids)
    sent the old one's ids again, and JetStream — or a consumer de-duplicating on them, as
    it should — dropped every message of the new one as one it already had."""
    with contextlib.ExitStack() as stack:
        if kind == "nats":
            server, stream = request.getfixturevalue("nats_url"), f"S{tag()}"
            url = f"{server}?stream={stream}&subject=t{stream}"
        elif kind == "rabbitmq":
            base, queue = request.getfixturevalue("rabbitmq_url"), f"q{tag()}"
            url = f"{base}?queue={queue}"
        else:
            receiver = stack.enter_context(WebhookReceiver())
            url = receiver.url
        for site in ("old", "new"):
            node = Node(tmp_path / site / "data").start()
            try:
                with node.client() as c:
                    execute(c, ["CREATE TABLE orders(id INTEGER PRIMARY KEY, site TEXT)"])
                    execute(c, [["INSERT INTO orders VALUES(?, ?)", 1, site]])
                control.subscribe(store, name="orders", sources=node.url, table="orders", sink=url)
                assert run(store, spark).states["orders"].last_error is None
                with node.client() as c:
                    execute(c, [["INSERT INTO orders VALUES(?, ?)", 2, site]])
                assert run(store, spark).states["orders"].last_error is None
                assert control.unsubscribe(store, "orders") is None
            finally:
                node.stop()
        if kind == "nats":  # what JetStream kept (it de-duplicates itself)
            sent = nats_raw_messages(server, stream)
        elif kind == "rabbitmq":
            sent = rabbitmq_messages(base, queue)
        else:  # one message per request, its events inside
            sent = [(str(r.header("webhook-id")), r.json_body) for r in receiver.accepted]
    seen: set[str] = set()
    kept: list[dict[str, Any]] = []  # what the consumer keeps: the first of each id
    for msg_id, doc in sent:
        if msg_id not in seen and doc.get("kind", doc.get("op")) != "snapshot_done":
            seen.add(msg_id)
            kept.extend(doc.get("events", []) if kind == "webhook" else [doc])
    assert [(d["op"], d["row"]["id"], d["row"]["site"]) for d in kept] == [
        ("snapshot", 1, "old"),
        ("upsert", 2, "old"),
        ("snapshot", 1, "new"),
        ("upsert", 2, "new"),
    ]
    if kind != "webhook":  # SUBSCRIPTION:REGISTRATION:ID, one registration each
        # per site: its snapshot row, the snapshot's end and its upsert
        old, new = ({i.rsplit(":", 1)[0] for i, _ in half} for half in (sent[:3], sent[3:]))
        assert len(old) == len(new) == 1 and old != new


def test_verify_counts_a_row_the_delta_mirror_holds_twice_as_a_difference(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: a row appended again to a caught-up Delta mirror gave "source 10 rows, sink 11
    rows, 0 difference(s)" and exit 0: rows were matched in a dict by key, where the
    copies collapsed, and the counts were not compared."""
    from click.testing import CliRunner
    from deltalake import DeltaTable, write_deltalake

    from litecdc.cli import cli

    table = f"dup_{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"v{i}"] for i in range(1, 11)])
    lake = tmp_path / "lake"
    control.subscribe(store, name=table, sources=node.url, table=table, sink=f"delta:{lake}")
    with SourceClient([node.url]) as client:  # the mirror as a caught-up run leaves it
        spec = client.table_spec(table)
        rows = client.rows(table, limit=100)
    sink = open_sink(f"delta:{lake}", spec, table)
    sink.write_snapshot(rows.table)
    sink.close()
    assert verify(store.get_subscription(table)).ok

    mirror = DeltaTable(str(lake))
    again = mirror.to_pyarrow_table().filter(pc.equal(pc.field("id"), 3))
    write_deltalake(mirror, again, mode="append")  # the row a second time, unchanged
    report = verify(store.get_subscription(table))
    assert (report.source_rows, report.sink_rows, report.total_differences) == (10, 11, 1)
    assert not report.ok
    (difference,) = report.differences
    assert (difference.kind, difference.key) == ("duplicate", [3])
    assert difference.describe().startswith("key [3]: 2 rows at the sink, 1 at the source")

    meta = sqlite_url(tmp_path / "meta.db")
    result = CliRunner().invoke(cli, ["pipeline", "verify", table, "--meta", meta])
    assert result.exit_code == 1, result.output
    assert "key [3]: 2 rows at the sink" in result.output
    assert "sink 11 rows, 1 difference(s)" in result.output


def test_a_rabbitmq_batch_blocked_by_an_alarm_is_retried_only_after_its_messages_settled(
    node: Node,
    spark: SparkSession,
    store: MetadataStore,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pipeline QA: a batch the broker blocked (a memory alarm) failed after
    BLOCKED_TIMEOUT and the server closed its sink: the broker still took that attempt's
    unread messages once the alarm cleared, interleaved with the retry's. The server now
    keeps such a sink for the retry, which sends nothing while the broker blocks and waits
    for those messages first: every copy of the first attempt comes before the retry."""
    from litecdc.localservers import RabbitMQServer
    from litecdc.pipeline.sinks import rabbitmq

    broker: RabbitMQServer = request.getfixturevalue("rabbitmq_server")
    monkeypatch.setattr(rabbitmq, "BLOCKED_TIMEOUT", 2.0)
    table, queue = f"alarm_{tag()}", f"q{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, v TEXT)"])
    control.subscribe(
        store, name=table, sources=node.url, table=table, sink=f"{broker.url}?queue={queue}"
    )
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        rounds_until_caught_up(server, node, table)  # the (empty) snapshot, and its end
        with node.client() as c:
            execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, "x" * 200] for i in range(300)])
        broker.ctl("set_vm_memory_high_watermark", "0.00001")
        try:
            for _ in range(2):  # blocked, then still blocked
                server.run_round()
                error = server.states[table].last_error
                assert error is not None and "blocked the connection for more than 2 s" in error
                time.sleep(0.2)  # (past the retry's back-off)
        finally:
            broker.ctl("set_vm_memory_high_watermark", "0.4")  # RabbitMQ's default
        time.sleep(0.2)
        rounds_until_caught_up(server, node, table)
    finally:
        server.close()
    ids = [message_id for message_id, doc in rabbitmq_messages(broker.url, queue)]
    changes = [i for i in ids if i.endswith("-upsert")]
    assert len(set(changes)) == 300
    retry = changes[-300:]
    stale = changes[:-300]
    assert stale == retry[: len(stale)]  # a prefix of the batch, once, then all of it


def test_a_subscription_whose_sink_is_down_shows_its_lag(
    node: Node, spark: SparkSession, store: MetadataStore
) -> None:
    """Ops QA: with the sink down the step failed before it read anything, and the lag
    figures stayed as they were — all 0 for a run started then — while `pipeline status`
    said the subscription was hundreds of cids behind: a lag alert never fired."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from litecdc.localservers import free_port

    table, name = f"down_{tag()}", f"down{tag()}"
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in (1, 2, 3)])
    sink = f"postgresql://u:p@127.0.0.1:{free_port()}/db?table=t&connect_timeout=1"
    control.subscribe(store, name=name, sources=node.url, table=table, sink=sink)
    head = SourceClient([node.url]).table_info(table).last_cid
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        server.run_round()  # fails: the sink does not answer
        time.sleep(0.2)  # (lag_seconds: how long it has been behind, read when scraped)
        state = server.states[name]
        assert state.last_error is not None
        assert (state.source_cid, state.applied_cid, state.lag_cids) == (head, 0, head)
        samples = {
            s.name: s.value
            for family in text_string_to_metric_families(
                generate_latest(server.metrics.registry).decode()
            )
            for s in family.samples
            if s.labels.get("subscription") == name
        }
        assert samples["litecdc_pipeline_lag_cids"] == head
        assert samples["litecdc_pipeline_failing"] == 1
        assert samples["litecdc_pipeline_lag_seconds"] >= 0.2
    finally:
        server.close()
