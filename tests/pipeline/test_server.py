"""PipelineServer's own decisions, against a real node and metadata store: a failing
subscription backs off and, under ``until_caught_up``, the run gives up on it instead
of waiting forever, once the others have caught up. A source table changed in a way the sink
cannot follow fails its subscription; one reshaped in a way that looks unchanged (dropped
and created again, its last column dropped and added again) is copied again."""

from __future__ import annotations

import shutil
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from deltalake import DeltaTable
from e2e.litecdc_node import Node, free_port
from pipeline_proc import execute, rounds_until_caught_up, wait_until_pruned_past

from litecdc.errors import MetadataError
from litecdc.pipeline import control
from litecdc.pipeline import server as server_module
from litecdc.pipeline.metadata import MetadataStore, Progress, sqlite_url
from litecdc.pipeline.server import GIVE_UP_FAILURES, PipelineServer
from litecdc.pipeline.verify import verify

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "node").start()
    yield started
    started.stop()


def test_until_caught_up_gives_up_on_a_subscription_that_keeps_failing(
    node: Node, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        closed = free_port()  # a PostgreSQL sink nobody listens for
        control.subscribe(
            store, name="down", sources=node.url, table="t",
            sink=f"postgresql://postgres@127.0.0.1:{closed}/x",
        )  # fmt: skip
        # Spark is never reached: the sink fails to open first (hence no session here)
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        failing = server.run(until_caught_up=True)
        assert failing == 1
        state = server.states["down"]
        assert state.failures == GIVE_UP_FAILURES
        assert state.last_error is not None and "postgresql sink" in state.last_error
        assert str(closed) in state.last_error
        assert "\n" not in state.last_error  # libpq's message spans two lines
        assert store.progress("down").stage is None  # nothing recorded for it
    finally:
        store.close()


def test_an_unsubscribe_racing_the_registration_leaves_no_hold(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QA: `unsubscribe` released the hold (there was none yet), `run` registered one, then
    the subscription was removed, and `run` only said "removed while a step ran": the
    hold stayed on the node (its changes kept, the name refused to a new subscribe)."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="raced", sources=node.url, table="t", sink=f"delta:{tmp_path / 'lake'}"
        )
        start_register = store.start_register

        def unsubscribed_meanwhile(name: str, cid: int) -> Progress:
            store.remove_subscription(name)  # (what `unsubscribe` does once it released)
            return start_register(name, cid)

        monkeypatch.setattr(store, "start_register", unsubscribed_meanwhile)
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        server.run_round()
        holds = httpx.get(f"{node.url}/cdc/subscriptions").json()["subscriptions"]
        assert [h["name"] for h in holds] == []
        assert "raced" not in server.states or server.states["raced"].last_error is None
    finally:
        store.close()


def test_until_caught_up_gives_up_on_an_unsubscribe_the_source_refuses_saying_how_to_end_it(
    tmp_path: Path,
) -> None:
    """Docs QA: unsubscribed with a user allowed only to query, the hold could not be
    released (401); each `run --until-caught-up` failed on it with the bare 401."""
    auth = tmp_path / "auth.json"
    auth.write_text(
        '[{"username": "admin", "password": "a", "perms": ["all"]},'
        ' {"username": "reader", "password": "r", "perms": ["query", "ready"]}]'
    )
    secured = Node(tmp_path / "node", "--auth", str(auth)).start()
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        with httpx.Client(base_url=secured.url, auth=("admin", "a")) as c:
            execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
        control.subscribe(
            store, name="r", sources=secured.url, table="t", sink=f"delta:{tmp_path / 'l'}",
            options={"user": "reader", "password": "r"},
        )  # fmt: skip
        refused = control.unsubscribe(store, "r")
        assert refused is not None and "401" in refused  # only marked for removal
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        assert server.run(until_caught_up=True) == 1
        state = server.states["r"]
        assert state.failures == GIVE_UP_FAILURES
        error = state.last_error or ""
        assert "unsubscribed, but its hold on the source cannot be released" in error, error
        assert "401" in error
        assert "`litecdc pipeline unsubscribe --force r`" in error
        (left,) = store.list_subscriptions(include_cancelled=True)
        assert left.name == "r" and left.cancel  # still pending: nothing lost
    finally:
        store.close()
        secured.stop()


def test_a_pending_unsubscribe_is_given_up_on_when_the_source_or_the_store_fails_it(
    node: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: with the source down the hint spoke of permissions; and a store failing to
    remove the subscription had its failures forgotten with it, each time: never given
    up, `--until-caught-up` waited on it for good."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="stuck", sources=node.url, table="t", sink=f"delta:{tmp_path / 's'}"
        )
        remove = store.remove_subscription

        def refuse(name: str) -> None:
            if name == "stuck":
                raise MetadataError("metadata database SQLite …: disk I/O error")
            remove(name)

        monkeypatch.setattr(store, "remove_subscription", refuse)
        store.request_cancel("stuck")  # (never registered: the source has no hold to release)
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        assert server.run(until_caught_up=True) == 1
        assert server.states["stuck"].failures == GIVE_UP_FAILURES
        assert "disk I/O error" in (server.states["stuck"].last_error or "")

        control.subscribe(
            store, name="gone", sources=node.url, table="t", sink=f"delta:{tmp_path / 'g'}"
        )
        node.stop()
        refused = control.unsubscribe(store, "gone")
        assert refused is not None and "unreachable" in refused
        server = PipelineServer(store, spark=None, poll_interval=0.01, retry_delay=0.01)  # type: ignore[arg-type]
        assert server.run(until_caught_up=True) == 2
        error = server.states["gone"].last_error or ""
        assert "cannot be released" in error and "unreachable" in error, error
        assert "releasing needs the source to answer" in error
        assert "allowed to execute" not in error
    finally:
        store.close()


@pytest.mark.spark
def test_until_caught_up_finishes_the_others_before_giving_up_on_a_failing_one(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Docs QA: one subscription given up (5 failures, a second or so) ended the run
    while a healthy one was still copying its table: every run exited there, and that
    one never caught up."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, f"v{i}"] for i in range(1, 2001)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="down", sources=node.url, table="t",
            sink=f"postgresql://postgres@127.0.0.1:{free_port()}/x",
        )  # fmt: skip
        control.subscribe(
            store, name="ok", sources=node.url, table="t", sink=f"delta:{tmp_path / 'l'}",
            options={"page_rows": 100},
        )  # fmt: skip
        server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
        assert server.run(until_caught_up=True) == 1
        assert server.states["down"].failures == GIVE_UP_FAILURES
        assert server.states["ok"].last_error is None
        assert store.progress("ok").stage == "incremental"
        assert verify(store.get_subscription("ok")).ok
    finally:
        store.close()


@pytest.mark.spark
@pytest.mark.parametrize(
    ("change", "gone"),
    [("ALTER TABLE t RENAME COLUMN b TO c", "b"), ("ALTER TABLE t DROP COLUMN b", "b")],
)
def test_a_column_dropped_or_renamed_at_the_source_fails_the_subscription_until_rebuilt(
    node: Node, tmp_path: Path, spark: SparkSession, change: str, gone: str
) -> None:
    """The check is against what the sink mirrors (kept in the metadata store), so the
    failure holds across retries and restarts: before, a restarted server took the new
    table as its baseline and went on with a stale or half-empty column."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"])
        execute(c, [["INSERT INTO t VALUES(?, ?, ?)", i, f"a{i}", i] for i in range(20)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="s", sources=node.url, table="t", sink=f"delta:{tmp_path / 'lake'}"
        )

        def run() -> PipelineServer:
            server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
            server.run(until_caught_up=True)
            return server

        store.set_failure("s", "left by a run that stopped while it failed")
        assert run().states["s"].failures == 0
        assert store.failure("s") is None  # cleared by the first round that worked
        assert [c["name"] for c in (store.mirrored_spec("s") or {})["columns"]] == ["id", "a", "b"]
        with node.client() as c:
            execute(c, [change, "INSERT INTO t(id, a) VALUES(100, 'after')"])
        for _ in range(2):  # a first server, then a restarted one: both refuse
            state = run().states["s"]
            assert state.failures == GIVE_UP_FAILURES
            assert state.last_error is not None and "cannot follow" in state.last_error
            assert f"dropped or renamed: ['{gone}']" in state.last_error
            (report,) = control.status(store, "s")
            assert report.failure is not None and "cannot follow" in report.failure[0]
            assert "FAILING since" in report.describe()
        assert store.progress("s").last_log_index is not None
        # verify says so too (schema QA: PostgreSQL's "column … does not exist", or a
        # Delta mirror's every row a difference, the new column read as NULLs)
        refused = _verify_cli(store, tmp_path, "s")
        assert refused.exit_code == 1, refused.output
        assert "error: subscription s: nothing to compare: table t changed" in refused.output
        assert f"dropped or renamed: ['{gone}']" in refused.output, refused.output
    finally:
        store.close()


def _verify_cli(store: MetadataStore, tmp_path: Path, name: str) -> Any:
    from click.testing import CliRunner

    from litecdc.cli import cli

    return CliRunner().invoke(
        cli, ["pipeline", "verify", name, "--meta", sqlite_url(tmp_path / "meta.db")]
    )


def _mirrored_to_delta(
    node: Node, tmp_path: Path, spark: SparkSession, table: str, name: str
) -> MetadataStore:
    """A metadata store (the caller closes it) with ``name``, which has mirrored a new
    table ``table`` of five rows into a Delta table and caught up."""
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, a TEXT)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, f"a{i}"] for i in range(5)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    control.subscribe(
        store, name=name, sources=node.url, table=table, sink=f"delta:{tmp_path / 'lake'}"
    )
    PipelineServer(store, spark, poll_interval=0.01).run(until_caught_up=True)
    return store


@pytest.mark.spark
def test_verify_refuses_a_mirror_that_has_not_taken_an_added_column_yet(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Compared in the source's columns of today, a Delta mirror read the column the run
    had not added yet as NULLs (every row a difference) and PostgreSQL's answer was
    "column … does not exist"; once the run took it, verify compares."""
    store = _mirrored_to_delta(node, tmp_path, spark, "t", "s")
    try:
        with node.client() as c:
            execute(c, ["ALTER TABLE t ADD COLUMN b INTEGER", "UPDATE t SET b = id"])
        refused = _verify_cli(store, tmp_path, "s")
        assert refused.exit_code == 1, refused.output
        assert "column(s) b the mirror has not taken yet" in refused.output, refused.output
        PipelineServer(store, spark, poll_interval=0.01).run(until_caught_up=True)
        compared = _verify_cli(store, tmp_path, "s")
        assert compared.exit_code == 0, compared.output
        assert "s: source 5 rows" in compared.output and "0 difference(s)" in compared.output
    finally:
        store.close()


@pytest.mark.spark
@pytest.mark.parametrize("ending", ["stop", "owner claim lost"])
def test_a_stop_cancels_a_steps_spark_read_and_waits_for_writes_only(
    node: Node,
    tmp_path: Path,
    spark: SparkSession,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    ending: str,
) -> None:
    """CI: SIGTERM came while a step's read (a Spark job) was slow at a busy start: it
    outlasted STOP_WAIT, and the step's write was then cut ("stopped mid-step"; once the
    step was even left behind and the process crashed at exit). A stop cancels the Spark
    jobs of the steps in flight: the read is done again by the next run — and so does any
    other end but caught up (review: Ctrl-C, the owner's claim lost). Here the read is a
    Spark job that sleeps a minute."""
    import logging
    import threading

    from pyspark.sql.functions import udf

    store = _mirrored_to_delta(node, tmp_path, spark, "sr", "sr")
    try:
        with node.client() as c:
            execute(c, ["INSERT INTO sr VALUES(100, 'after')"])
        reading = threading.Event()
        plain_read = PipelineServer._read
        sleepy = udf(lambda x: (time.sleep(60), x)[1], "long")

        def slow_read(self: PipelineServer, running: Any, options: dict[str, str]) -> Any:
            reading.set()
            self.spark.range(1, numPartitions=1).select(sleepy("id")).collect()
            return plain_read(self, running, options)

        server = PipelineServer(store, spark, poll_interval=0.01)
        server._read = types.MethodType(slow_read, server)  # type: ignore[method-assign]
        caplog.set_level(logging.INFO, logger="litecdc.pipeline")
        ended: list[BaseException] = []

        def run() -> None:
            try:
                server.run()
            except MetadataError as exc:
                ended.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        assert reading.wait(120)
        if ending == "stop":
            server.stop()
        else:

            def lost() -> None:
                raise MetadataError("another `litecdc pipeline run` of owner 'x' (injected)")

            monkeypatch.setattr(server_module, "CLAIM_CHECK_INTERVAL", 0.0)
            monkeypatch.setattr(store, "check_owner_claim", lost)
        runner.join(120)
        assert len(ended) == (ending != "stop"), ended
        monkeypatch.undo()
        assert not runner.is_alive()
        assert "subscription sr: stopped while reading; the next run reads it" in caplog.text
        for cut in ("stopped mid-step", "did not end", "left behind"):
            assert cut not in caplog.text, caplog.text
        assert store.failure("sr") is None
        assert not any(t.name.startswith("litecdc-step-") for t in threading.enumerate())
        # the next run reads it
        PipelineServer(store, spark, poll_interval=0.01).run(until_caught_up=True)
        assert verify(store.get_subscription("sr")).ok
    finally:
        store.close()


@pytest.mark.spark
def test_an_error_raised_in_a_spark_worker_is_recorded_as_its_one_line(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Before, the run log and `status` showed Spark's whole wrapping of it: the worker's
    traceback, the JVM's stack and the query plan."""
    with node.client() as c:
        execute(c, ["CREATE TABLE w(id INTEGER PRIMARY KEY, n INTEGER)",
                    "INSERT INTO w VALUES (1, 5), (2, 'not a number')"])  # fmt: skip
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="w", sources=node.url, table="w", sink=f"delta:{tmp_path / 'lake'}"
        )
        server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
        assert server.run(until_caught_up=True) == 1
        error = server.states["w"].last_error
        assert error is not None and error.startswith(f"source {node.url}: GET "), error
        assert "table w column n: a TEXT value at key [2]" in error, error
        assert "\n" not in error and "Traceback" not in error and "Exception" not in error
        (report,) = control.status(store, "w")
        assert report.failure is not None and report.failure[0] == error
        failing = [line for line in report.describe().splitlines() if "FAILING" in line]
        assert len(failing) == 1 and failing[0].endswith(error), report.describe()
    finally:
        store.close()


@pytest.mark.spark
def test_a_subscription_recreated_under_its_name_between_rounds_gets_its_new_sink(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Pipeline QA: `unsubscribe r` then `subscribe r --sink B` while a `pipeline run` was
    running: the run kept its cached connections, registered and snapshotted the new
    subscription into the OLD sink A and applied its changes there; status said caught
    up, verify failed (B did not exist)."""
    with node.client() as c:
        execute(c, ["CREATE TABLE rs(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO rs VALUES(?, ?)", i, f"v{i}"] for i in range(10)])
    old_lake, new_lake = tmp_path / "old", tmp_path / "new"
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(store, name="r", sources=node.url, table="rs", sink=f"delta:{old_lake}")
        server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
        try:
            rounds_until_caught_up(server, node, "r")
            assert control.unsubscribe(store, "r") is None
            control.subscribe(
                store, name="r", sources=node.url, table="rs", sink=f"delta:{new_lake}"
            )
            with node.client() as c:
                execute(c, ["INSERT INTO rs VALUES(100, 'after')", "DELETE FROM rs WHERE id = 0"])
            rounds_until_caught_up(server, node, "r")  # the same server, its connections open
        finally:
            server.close()
        report = verify(store.get_subscription("r"))
        assert report.ok and report.sink_rows == 10, report.differences
        old_rows = DeltaTable(str(old_lake)).to_pyarrow_table()
        assert sorted(old_rows["id"].to_pylist()) == list(range(10))  # left as it was
    finally:
        store.close()


@pytest.mark.parametrize(
    ("now", "named"),
    [
        (("id", "s_old", "s"), "['s']"),  # RENAME s TO s_old, then ADD s
        (("id", "b", "a"), "['a', 'b']"),  # DROP a, then ADD a
        (("id", "b"), "['a']"),
    ],
)
def test_a_column_dropped_or_renamed_and_added_again_is_not_followed(
    now: tuple[str, ...], named: str
) -> None:
    """Pipeline QA: RENAME s TO s_old then ADD s passed the check (compared by name): the
    mirror kept the old values in s and s_old stayed empty. SQLite adds a column at the
    end only, so the mirrored columns must still lead, in their order."""
    from litecdc.errors import SchemaMismatchError
    from litecdc.pipeline.tables import Column, TableSpec, check_followable

    def spec(*names: str) -> TableSpec:
        return TableSpec("t", tuple(Column(n, "TEXT", "string") for n in names), ("id",))

    mirrored = spec("id", "a", "b") if "b" in now else spec("id", "s")
    with pytest.raises(SchemaMismatchError) as refused:
        check_followable(mirrored, spec(*now))
    # what changed, and only that (QA: "key ['id'] -> ['id']" read as a key change)
    assert f"cannot follow (dropped or renamed: {named}); to rebuild" in str(refused.value)
    check_followable(mirrored, spec(*mirrored.column_names, "added"))  # still followed


def test_a_key_become_the_rowid_is_said_so() -> None:
    """Pipeline QA: CREATE TABLE t AS SELECT over a subscribed t (no PRIMARY KEY: the key
    became the rowid) was reported as "dropped or renamed: ['id', 'v'], key ['id'] ->
    ['_litecdc_rowid']": the rowid column, first, moved every column out of place."""
    from litecdc.errors import SchemaMismatchError
    from litecdc.pipeline.tables import ROWID_COLUMN, Column, TableSpec, check_followable

    own = (Column("id", "INT", "int64"), Column("v", "TEXT", "string"))
    mirrored = TableSpec("t", own, ("id",))
    created_from_a_query = TableSpec(
        "t", (Column(ROWID_COLUMN, "INTEGER", "int64"), *own), (ROWID_COLUMN,)
    )
    with pytest.raises(SchemaMismatchError) as refused:
        check_followable(mirrored, created_from_a_query)
    message = str(refused.value)
    assert "cannot follow (key ['id'] -> the rowid (no PRIMARY KEY declared" in message
    assert "dropped or renamed" not in message
    with pytest.raises(SchemaMismatchError, match=r"\(key the rowid -> \['id'\]\)"):
        check_followable(created_from_a_query, mirrored)


def _mirror_is_exact(store: MetadataStore, name: str, rows: int) -> None:
    report = verify(store.get_subscription(name))
    assert report.ok and report.sink_rows == rows, [d.describe() for d in report.differences]


def _reshaped_then_mirrored(
    node: Node,
    store: MetadataStore,
    spark: SparkSession,
    name: str,
    while_running: list[list[str]],
    while_stopped: list[str],
    rows: tuple[int, int],
) -> None:
    """Subscribe ``name`` (made already), change the table with ``while_running`` (one
    commit each) between two rounds of a running server, then with ``while_stopped`` (one
    transaction) while no server runs: each time the mirror ends exact (``rows`` rows),
    from a new copy of the table."""
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        rounds_until_caught_up(server, node, name)
        copied = store.progress(name).init_snapshot_version or 0
        with node.client() as c:
            for statements in while_running:
                execute(c, statements)
        rounds_until_caught_up(server, node, name)  # the same server: its rounds go on
    finally:
        server.close()
    _mirror_is_exact(store, name, rows[0])
    again = store.progress(name).init_snapshot_version or 0
    assert again > copied  # copied again
    with node.client() as c:
        execute(c, while_stopped)
    restarted = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    assert restarted.run(until_caught_up=True) == 0, restarted.states[name].last_error
    _mirror_is_exact(store, name, rows[1])
    assert (store.progress(name).init_snapshot_version or 0) > again


@pytest.mark.spark
def test_a_table_dropped_and_created_again_is_copied_again(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Before, a table dropped and created again with the same columns between two checks
    looked unchanged (DROP TABLE fires no row changes): the Delta mirror kept the rows the
    new table does not have (a documented gap). The node says when the table was last
    reshaped; reshaped after the copy began, it is copied again (the sweep drops the old
    rows)."""
    create = "CREATE TABLE dc(id INTEGER PRIMARY KEY, a TEXT, n INTEGER)"
    with node.client() as c:
        execute(c, [create])
        execute(c, [["INSERT INTO dc VALUES(?, ?, ?)", i, f"a{i}", i] for i in range(1, 21)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(
            store, name="dc", sources=node.url, table="dc", sink=f"delta:{tmp_path / 'lake'}"
        )
        _reshaped_then_mirrored(
            node, store, spark, "dc",
            while_running=[
                ["DROP TABLE dc"],
                [create],
                ["INSERT INTO dc VALUES(2, 'new', -2), (21, 'new', -21)"],
            ],
            while_stopped=["DROP TABLE dc", create, "INSERT INTO dc VALUES(5, 'five', 5)"],
            rows=(2, 1),
        )  # fmt: skip
    finally:
        store.close()


@pytest.mark.spark
def test_the_last_column_dropped_and_added_again_is_copied_again(
    node: Node, tmp_path: Path, spark: SparkSession, postgresql_db_url: str
) -> None:
    """Before, the last column dropped and added again with its type between two checks
    left the description as it was: the PostgreSQL mirror kept the old values in it (the
    source's are NULL, and no row change said so; a documented gap)."""
    with node.client() as c:
        execute(c, ["CREATE TABLE lc(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"])
        execute(c, [["INSERT INTO lc VALUES(?, ?, ?)", i, f"a{i}", i] for i in range(1, 21)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(store, name="lc", sources=node.url, table="lc", sink=postgresql_db_url)
        _reshaped_then_mirrored(
            node, store, spark, "lc",
            while_running=[
                ["ALTER TABLE lc DROP COLUMN b"],
                ["ALTER TABLE lc ADD COLUMN b INTEGER"],
                ["UPDATE lc SET b = 100 WHERE id = 1", "INSERT INTO lc VALUES(21, 'a21', 21)"],
            ],
            while_stopped=[
                "ALTER TABLE lc DROP COLUMN b",
                "ALTER TABLE lc ADD COLUMN b INTEGER",
                "UPDATE lc SET b = -2 WHERE id = 2",
            ],
            rows=(21, 21),
        )  # fmt: skip
    finally:
        store.close()


@pytest.mark.spark
def test_a_table_created_again_under_another_letter_case_keeps_its_mirror(
    node: Node, tmp_path: Path, spark: SparkSession, postgresql_db_url: str
) -> None:
    """Reshape QA: DROP TABLE Kk + CREATE TABLE KK is the same table to SQLite (and was
    re-copied), but a restarted run took the node's new spelling: its PostgreSQL sink
    created a new table "KK" and left the "Kk" mirror stale (verify: relation "KK" does
    not exist). The subscription's spelling names its destination for good."""
    with node.client() as c:
        execute(c, ["CREATE TABLE Kk(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO Kk VALUES(?, ?)", i, f"v{i}"] for i in range(1, 6)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(store, name="kk", sources=node.url, table="Kk", sink=postgresql_db_url)
        _reshaped_then_mirrored(
            node, store, spark, "kk",
            while_running=[
                ["DROP TABLE Kk"],
                ["CREATE TABLE KK(id INTEGER PRIMARY KEY, v TEXT)"],
                ["INSERT INTO KK VALUES(1, 'one'), (7, 'seven')"],
            ],
            while_stopped=[
                "DROP TABLE KK",
                "CREATE TABLE kK(id INTEGER PRIMARY KEY, v TEXT)",
                "INSERT INTO kK VALUES(3, 'three')",
            ],
            rows=(2, 1),
        )  # fmt: skip
        with node.client() as c:
            execute(c, ["INSERT INTO kk VALUES(4, 'four')"])
        restarted = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
        assert restarted.run(until_caught_up=True) == 0, restarted.states["kk"].last_error
        _mirror_is_exact(store, "kk", 2)
    finally:
        store.close()


@pytest.mark.spark
def test_a_quiet_tables_hold_keeps_up_with_a_busy_source(
    tmp_path: Path, spark: SparkSession
) -> None:
    """QA: a caught-up subscription of a quiet table moved its hold every 300 s only;
    commits to other tables expired it past the node's retention cap, and the table was
    copied again and again. The hold now moves once it trails by a quarter of the cap."""
    node = Node(tmp_path / "node", "--retention-cids", "40").start()
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        with node.client() as c:
            execute(c, ["CREATE TABLE quiet(id INTEGER PRIMARY KEY, v)", "CREATE TABLE busy(x)"])
            execute(c, [["INSERT INTO quiet VALUES(?, ?)", i, i] for i in range(10)])
        control.subscribe(
            store, name="quiet", sources=node.url, table="quiet", sink=f"delta:{tmp_path / 'q'}"
        )
        rounds_until_caught_up(server, node, "quiet")
        copied = store.progress("quiet").init_snapshot_version
        for _ in range(6):
            with node.client() as c:
                for k in range(15):
                    execute(c, [["INSERT INTO busy VALUES(?)", k]])
            rounds_until_caught_up(server, node, "quiet")
        assert store.progress("quiet").init_snapshot_version == copied  # never copied again
        with node.client() as c:
            holds = c.get("/cdc/subscriptions").json()
        (hold,) = [h for h in holds["subscriptions"] if h["name"] == "quiet"]
        assert not hold["expired"] and holds["last_cid"] - hold["cid"] <= 40, holds
    finally:
        server.close()
        store.close()
        node.stop()


def one_range_copied(
    node: Node, store: MetadataStore, server: PipelineServer, name: str, table: str, lake: Path
) -> Progress:
    """A 40-row ``table`` subscribed as ``name`` into Delta at ``lake``, cut into 4 ranges of
    10 rows, and the server stepped until the first range is copied: a snapshot under way."""
    with node.client() as c:
        execute(c, [f"CREATE TABLE {table}(id INTEGER PRIMARY KEY, v)"])
        execute(c, [[f"INSERT INTO {table} VALUES(?, ?)", i, i] for i in range(40)])
    control.subscribe(
        store, name=name, sources=node.url, table=table, sink=f"delta:{lake}",
        options={"partitions": 1, "page_rows": 10},
    )  # fmt: skip
    server.run_round()  # registers
    server.run_round()  # copies the first of 4 ranges
    first = store.progress(name)
    assert first.stage == "snapshot" and sum(r.done for r in first.ranges) == 1
    return first


@pytest.mark.spark
def test_a_hold_that_expires_during_the_snapshot_restarts_the_copy_at_once(
    tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the rest of the table was copied first and the expiry found by the first
    incremental round: a copy slower than the node keeps changes was redone whole, for
    ever. Now a snapshot round asks the node (every HOLD_CHECK_INTERVAL) first."""
    monkeypatch.setattr(server_module, "HOLD_CHECK_INTERVAL", 0.0)
    node = Node(tmp_path / "node", "--retention-cids", "5").start()
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        with node.client() as c:
            execute(c, ["CREATE TABLE busy(x)"])
        first = one_range_copied(node, store, server, "slow", "t", tmp_path / "lake")
        with node.client() as c:
            for k in range(12):
                execute(c, [["INSERT INTO busy VALUES(?)", k]])
        wait_until_pruned_past(node, "slow", first.init_snapshot_version or 0)
        server.run_round()
        again = store.progress("slow")
        # copied again from a new registration, not on from the expired one
        assert (again.init_snapshot_version or 0) > (first.init_snapshot_version or 0)
        assert sum(r.done for r in again.ranges) == 0
        assert server.states["slow"].last_error is None
        rounds_until_caught_up(server, node, "slow")
        assert verify(store.get_subscription("slow")).ok
    finally:
        server.close()
        store.close()
        node.stop()


@pytest.mark.spark
def test_a_table_reshaped_during_its_snapshot_is_copied_again_at_once(
    node: Node, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the rest of the old table's copy went on, and the reshape was found by the
    first incremental round, which then copied the whole table again."""
    monkeypatch.setattr(server_module, "SCHEMA_CHECK_INTERVAL", 0.0)
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        first = one_range_copied(node, store, server, "rs", "rs", tmp_path / "lake")
        with node.client() as c:
            execute(c, ["DROP TABLE rs", "CREATE TABLE rs(id INTEGER PRIMARY KEY, v)"])
            execute(c, [["INSERT INTO rs VALUES(?, ?)", i, f"new {i}"] for i in range(5)])
        server.run_round()
        again = store.progress("rs")
        assert (again.init_snapshot_version or 0) > (first.init_snapshot_version or 0)
        assert again.stage == "snapshot" and sum(r.done for r in again.ranges) == 0
        rounds_until_caught_up(server, node, "rs")
        assert verify(store.get_subscription("rs")).ok
    finally:
        server.close()
        store.close()


@pytest.mark.spark
def test_a_column_added_while_a_chunk_is_read_loses_none_of_its_values(
    node: Node, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipeline QA: pages of a chunk read after an ADD COLUMN, with the description taken
    before it, came without the new column's values, and their rows carried cids above
    the commit that wrote them: the change log's update was then older than the row,
    skipped, and the mirror wrong for good (lag 0). The race is made here by dropping the
    new column from what one read returned, as such a read returns it."""
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        one_range_copied(node, store, server, "ac", "ac", tmp_path / "lake")
        read_ranges = server._read_ranges
        raced: list[int] = []

        def racing(running: Any, ranges: Any, min_cid: int) -> Any:
            if raced:
                return read_ranges(running, ranges, min_cid)
            with node.client() as c:
                execute(
                    c,
                    [
                        "ALTER TABLE ac ADD COLUMN extra TEXT",
                        "UPDATE ac SET extra = 'e' || id WHERE id % 10 = 7",
                    ],
                )
            rows, per_range = read_ranges(running, ranges, min_cid)
            raced.append(rows.num_rows)
            return rows.drop_columns([n for n in rows.column_names if n == "extra"]), per_range

        monkeypatch.setattr(server, "_read_ranges", racing)
        rounds_until_caught_up(server, node, "ac")
        rounds_until_caught_up(server, node, "ac")  # (the ALTER came after the first's head)
        assert raced == [10]  # the second range, read at the UPDATE's cid or later
        assert verify(store.get_subscription("ac")).ok
    finally:
        server.close()
        store.close()


@pytest.mark.spark
def test_a_source_restored_from_a_backup_with_the_hold_fails_the_subscription(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """Backup QA: a node restored from a backup taken after the subscription registered
    still had its hold, and once new writes moved its head past the applied cid neither
    check above fired: the mirror followed the other history silently (status lag 1;
    verify: a row stale, one missing, two extra). Its new commits reuse the cids, not
    the marks (the leader's clock and random seed): the subscription fails, saying so."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, "start"] for i in range(1, 4)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        control.subscribe(
            store, name="t", sources=node.url, table="t", sink=f"delta:{tmp_path / 'l'}"
        )
        rounds_until_caught_up(server, node, "t")
        with node.client() as c:
            backup = c.get("/db/backup").content  # (the hold is in it)
            execute(c, [["INSERT INTO t VALUES(?, ?)", i, "first"] for i in (4, 5)])
            execute(c, ["UPDATE t SET v = 'first' WHERE id = 1"])
        rounds_until_caught_up(server, node, "t")
        applied = server.states["t"].applied_cid
        _restore_from_backup(node, backup)
        _commit_until_head_passes(node, applied + 1)  # past the applied cid: other commits
        server.run_round()
        error = server.states["t"].last_error or ""
        assert f"the source's commit {applied} is not the one the sink's data came from" in (
            error
        ), error
        assert "the source's database was replaced" in error
        assert "catching up" not in error  # (another commit of that cid: no lag explains it)
        assert not error.startswith("subscription")  # (whose it is, the caller says)
        assert store.progress("t").last_log_index == applied  # nothing of it applied
    finally:
        server.close()
        store.close()


@pytest.mark.spark
def test_a_source_restored_from_a_backup_taken_mid_snapshot_fails_the_subscription(
    node: Node, tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retest QA: restored from a backup taken while the table was being copied, a source
    numbered its new commits with the cids of rows the snapshot had already copied; their
    versions then made the change log's changes be skipped (verify: 10,001 differences,
    status clean) — the registration's commit, in both histories, told nothing. The
    snapshot marks the newest commit whose rows it copied."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, "start"] for i in range(1, 4)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    backups: list[bytes] = []
    read_ranges = server._read_ranges

    def backup_then_read(running: Any, ranges: Any, min_cid: int) -> Any:
        if not backups:  # registered (the hold is in the backup), nothing copied yet
            with node.client() as c:
                backups.append(c.get("/db/backup").content)
                execute(c, ["UPDATE t SET v = 'first' WHERE id = 2"])  # copied at its cid
        return read_ranges(running, ranges, min_cid)

    monkeypatch.setattr(server, "_read_ranges", backup_then_read)
    try:
        control.subscribe(
            store, name="t", sources=node.url, table="t", sink=f"delta:{tmp_path / 'l'}"
        )
        rounds_until_caught_up(server, node, "t")
        with node.client() as c:
            copied = _head(c)  # (the UPDATE's)
        _restore_from_backup(node, backups[0])
        _commit_until_head_passes(node, copied)  # other commits with the copied row's cid
        server.run_round()
        error = server.states["t"].last_error or ""
        assert f"the source's commit {copied} is not the one the sink's data came from" in (
            error
        ), error
    finally:
        server.close()
        store.close()


def _head(client: httpx.Client) -> int:
    return int(client.get("/status").json()["store"]["last_cid"])


def _restore_from_backup(node: Node, backup: bytes) -> None:
    """Restart the node on a `GET /db/backup` file, as an operator restoring one would."""
    node.stop()
    for leftover in node.data_dir.glob("db.sqlite*"):
        leftover.unlink()
    (node.data_dir / "db.sqlite").write_bytes(backup)
    node.start()


def _commit_until_head_passes(node: Node, cid: int) -> None:
    """Commit rows into `t` until the node's newest commit is past `cid`."""
    with node.client() as c:
        while _head(c) <= cid:
            execute(c, [["INSERT INTO t VALUES(?, ?)", _head(c) + 100, "second"]])


@pytest.mark.spark
def test_a_source_whose_database_was_replaced_fails_the_subscription_until_rebuilt(
    node: Node, tmp_path: Path, spark: SparkSession
) -> None:
    """QA: a node rebuilt from an older backup (a new data directory, POST /db/load) has
    another history, its head behind the applied cid and no hold for the subscription; it
    was taken for the old history (nothing to apply, `status` said lag 0) and the mirror
    stayed wrong. A new copy would not do either: the mirror's versions are the old
    history's cids. The subscription fails, saying so, at once and after a restart."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, "start"] for i in range(1, 101)])
        backup = c.get("/db/backup").content
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    server = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        control.subscribe(
            store, name="t", sources=node.url, table="t", sink=f"delta:{tmp_path / 'l'}"
        )
        rounds_until_caught_up(server, node, "t")
        with node.client() as c:
            for i in range(1, 41):
                execute(c, [["UPDATE t SET v = ? WHERE id = ?", f"first {i}", i]])
        rounds_until_caught_up(server, node, "t")
        applied = server.states["t"].applied_cid
        node.stop()
        shutil.rmtree(node.data_dir)
        node.start()
        with node.client() as c:
            loaded = c.post(
                "/db/load", content=backup, headers={"Content-Type": "application/octet-stream"}
            )
            assert loaded.status_code == 200, loaded.text
            for i in range(1, 31):
                execute(
                    c,
                    [
                        ["UPDATE t SET v = ? WHERE id = ?", f"second {i}", i],
                        ["DELETE FROM t WHERE id = ?", i + 50],
                    ],
                )
        server.run_round()
        error = server.states["t"].last_error or ""
        assert f"is behind what it applied (cid {applied})" in error, error
        assert "the source's database was replaced" in error
        assert "litecdc pipeline unsubscribe t" in error
        assert store.progress("t").last_log_index == applied  # nothing of it applied
    finally:
        server.close()
    restarted = PipelineServer(store, spark, poll_interval=0.01, retry_delay=0.01)
    try:
        assert restarted.run(until_caught_up=True) == 1
        error = restarted.states["t"].last_error or ""
        assert "the node has no hold for it" in error and "was replaced" in error, error
    finally:
        restarted.close()
        store.close()
