"""A sink server that hangs — it keeps its connections open and answers nothing (a frozen
process; a network path that drops packets behaves the same) — against real PostgreSQL
and MariaDB servers, frozen with SIGSTOP for the test.

Before: `pipeline run` stepped its subscriptions one after the other in one thread, so a
write waiting on a frozen server held every subscription of the run, for as long as the
server stayed frozen, with no failure shown anywhere.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pymysql
import pytest
from deltalake import DeltaTable
from e2e.litecdc_node import Node
from pipeline_proc import execute
from sink_contract import SPEC, SourceSim, canonical_rows, sample_row, table_rows

from litecdc.errors import SinkError
from litecdc.localservers.process import LocalServer
from litecdc.pipeline import control
from litecdc.pipeline import server as server_module
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.server import PipelineServer
from litecdc.pipeline.sinks.base import ChangeBatch, probe_sink
from litecdc.pipeline.sinks.registry import open_sink
from litecdc.pipeline.verify import verify

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def wait_for(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def says_unreachable(error: str | None) -> bool:
    return bool(error) and any(
        words in str(error) for words in ("does not answer", "connection timeout expired")
    )


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_write_waiting_on_a_frozen_server_is_found_by_a_probe_and_broken_by_abort(
    kind: str, request: pytest.FixtureRequest
) -> None:
    server: LocalServer = request.getfixturevalue(f"{kind}_server")
    base = request.getfixturevalue(f"{kind}_url")
    table = f"t_{uuid.uuid4().hex[:12]}"
    sink = open_sink(f"{base}?table={table}&connect_timeout=1", SPEC, "hung")
    try:
        src = SourceSim(SPEC)
        src.commit(*[("upsert", sample_row(i)) for i in range(1, 11)])
        assert sink.write_changes(src.events(0, src.cid), ChangeBatch("hung", 0, src.cid))
        assert probe_sink(sink) is None  # a server that answers
        applied = src.cid
        src.commit(("upsert", {**sample_row(3), "name": "changed"}), ("delete", (4,)))
        events, batch = src.events(applied, src.cid), ChangeBatch("hung", applied, src.cid)

        outcome: list[BaseException | bool] = []

        def write() -> None:
            try:
                outcome.append(sink.write_changes(events, batch))
            except BaseException as exc:
                outcome.append(exc)

        with server.frozen():
            writer = threading.Thread(target=write, daemon=True)
            writer.start()
            writer.join(1.0)
            assert writer.is_alive(), outcome  # waiting on the server, while it stays frozen
            found = probe_sink(sink)
            assert found is not None
            assert found.startswith(f"{kind} sink:")
            assert "does not answer" in found or "did not answer" in found
            sink.abort()
            writer.join(10.0)
            assert not writer.is_alive()  # the write returned once its connection broke
            assert len(outcome) == 1 and isinstance(outcome[0], SinkError)
            # retried while the server stays frozen: connecting gives up after the URL's
            # connect_timeout, handshake included (MariaDB's waited for ever)
            retry = threading.Thread(target=write, daemon=True)
            retry.start()
            retry.join(10.0)
            assert not retry.is_alive()
            assert isinstance(outcome[1], SinkError) and "cannot connect" in str(outcome[1])
            if kind == "mariadb":  # (was PyMySQL's "Lost connection … during query")
                assert "did not answer within connect_timeout (1 s)" in str(outcome[1])
        # the server answers again: the same sink reconnects and the batch goes in whole
        assert sink.write_changes(events, batch) is True
        assert sink.applied_cid() == src.cid
        # (MariaDB's DOUBLE keeps -0.0 as 0.0: a documented limitation of that sink)
        want = (
            [
                {k: v + 0.0 if isinstance(v, float) else v for k, v in row.items()}
                for row in src.expected_rows()
            ]
            if kind == "mariadb"
            else src.expected_rows()
        )
        assert canonical_rows(table_rows(sink.read_rows())) == canonical_rows(want)
    finally:
        sink.close()


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_server_that_answers_with_a_refusal_is_alive_to_the_probe(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """QA: a role allowed one connection — held by the sink's write, waiting on a lock —
    got "too many connections" for the probe's, taken as "does not answer": the waiting
    write was broken, and every retry refused until the lock went."""
    base = request.getfixturevalue(f"{kind}_url")
    role = f"lim_{uuid.uuid4().hex[:8]}"
    host, db = base.split("@", 1)[1].rsplit("/", 1)
    scheme = base.split("://", 1)[0]
    if kind == "postgresql":
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")
            admin.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
        url = f"{scheme}://{role}:pw@{host}/{db}?schema={role}&table=t"
    else:
        admin = pymysql.connect(host="127.0.0.1", port=int(host.rsplit(":", 1)[1]), user="root")
        with admin.cursor() as cur:
            cur.execute(f"CREATE USER '{role}'@'%' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 1")
            cur.execute(f"GRANT ALL ON `{db}`.* TO '{role}'@'%'")
        admin.close()
        url = f"{scheme}://{role}:pw@{host}/{db}?table={role}"
    sink = open_sink(url, SPEC, "lim")  # holds the role's one connection
    try:
        assert probe_sink(sink) is None
    finally:
        sink.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "node").start()
    yield started
    started.stop()


SUBS = ("pg", "lake")


def head(node: Node) -> int:
    with node.client() as c:
        return int(c.get("/status").json()["store"]["last_cid"])


class Running:
    """``server.run()`` in a thread, stopped (and waited for) on exit."""

    def __init__(self, server: PipelineServer) -> None:
        self.server = server
        self.result: list[Any] = []
        self.thread = threading.Thread(target=lambda: self.result.append(server.run()))

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()

    def applied(self, name: str) -> int:
        state = self.server.states.get(name)
        return state.applied_cid if state is not None and state.stage == "incremental" else -1


@pytest.mark.spark
def test_a_frozen_sink_server_holds_up_no_other_subscription_and_fails_its_own(
    node: Node,
    tmp_path: Path,
    spark: SparkSession,
    postgresql_server: LocalServer,
    postgresql_db_url: str,
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, f"v{i}"] for i in range(50)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        pg = f"{postgresql_db_url}?connect_timeout=1"
        control.subscribe(store, name="pg", sources=node.url, table="t", sink=pg)
        lake = tmp_path / "lake"
        control.subscribe(store, name="lake", sources=node.url, table="t", sink=f"delta:{lake}")
        server = PipelineServer(
            store, spark, poll_interval=0.1, retry_delay=0.2, stall_probe_after=1.0
        )
        with Running(server) as running:
            wait_for("both caught up", lambda: min(running.applied(n) for n in SUBS) >= head(node))
            with postgresql_server.frozen():
                with node.client() as c:
                    execute(c, [["INSERT INTO t VALUES(?, ?)", 101, "while frozen"]])
                wait_for(
                    "the lake applied the insert", lambda: running.applied("lake") >= head(node)
                )
                time.sleep(1.0)  # the pg subscription is waiting on its frozen server by now
                with node.client() as c:
                    execute(c, ["UPDATE t SET v = 'updated' WHERE id < 10"])
                last = head(node)
                wait_for(
                    "the lake applied past the frozen sink", lambda: running.applied("lake") >= last
                )
                # (the first failure says the server does not answer; the retries, which
                # wait for their connection, that they cannot connect: a loaded machine
                # reached this wait when the first had been replaced — CI)
                wait_for(
                    "the frozen sink's subscription failing, saying why",
                    lambda: says_unreachable(server.states["pg"].last_error),
                )
                failure = store.failure("pg")
                assert failure is not None and says_unreachable(failure[0])
                assert running.applied("pg") < last
            wait_for("the thawed sink caught up", lambda: running.applied("pg") >= last)
            wait_for("its failure cleared", lambda: store.failure("pg") is None)
        assert DeltaTable(str(lake)).to_pyarrow_table().num_rows == 51
        report = verify(store.get_subscription("pg"))
        assert report.ok, report
    finally:
        store.close()


@pytest.mark.spark
def test_retries_against_a_frozen_server_hold_one_thread_not_all(
    node: Node,
    tmp_path: Path,
    spark: SparkSession,
    postgresql_server: LocalServer,
    postgresql_db_url: str,
) -> None:
    """QA: with as many subscriptions on a frozen server as threads, their retries — each
    waiting its connect_timeout — held every thread, and the other sinks stalled. Failing
    subscriptions now retry one at a time per sink server."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, f"v{i}"] for i in range(10)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    pg_names = ["pg1", "pg2", "pg3"]
    try:
        for name in pg_names:
            sink = f"{postgresql_db_url}?table={name}&connect_timeout=2"
            control.subscribe(store, name=name, sources=node.url, table="t", sink=sink)
        lake = f"delta:{tmp_path / 'lake'}"
        control.subscribe(store, name="lake", sources=node.url, table="t", sink=lake)
        server = PipelineServer(
            store, spark, poll_interval=0.1, retry_delay=0.1, stall_probe_after=1.0, parallel=2
        )
        pg_server = f"127.0.0.1:{postgresql_server.port}"  # type: ignore[attr-defined]
        with Running(server) as running:
            names = [*pg_names, "lake"]
            wait_for("all caught up", lambda: min(running.applied(n) for n in names) >= head(node))
            with postgresql_server.frozen():
                with node.client() as c:
                    execute(c, [["INSERT INTO t VALUES(?, ?)", 100, "while frozen"]])
                wait_for(
                    "every pg subscription failing",
                    lambda: all(server.states[n].last_error for n in pg_names),
                )
                most = 0
                for k in range(40):  # 4 s: each retry waits connect_timeout (2 s)
                    retrying = [
                        n
                        for n, s in list(server._scheduled.items())
                        if s.in_flight and s.server == pg_server and server.states[n].last_error
                    ]
                    most = max(most, len(retrying))
                    if k == 0:
                        with node.client() as c:
                            execute(c, [["INSERT INTO t VALUES(?, ?)", 101, "still frozen"]])
                    time.sleep(0.1)
                assert most == 1  # one retry at a time on the frozen server
                wait_for("the lake kept up", lambda: running.applied("lake") >= head(node))
            wait_for(
                "all caught up again", lambda: min(running.applied(n) for n in names) >= head(node)
            )
        for name in pg_names:
            assert verify(store.get_subscription(name)).ok
    finally:
        store.close()


@pytest.mark.spark
def test_stopping_run_while_a_step_waits_on_a_frozen_server_ends_it(
    node: Node,
    tmp_path: Path,
    spark: SparkSession,
    postgresql_server: LocalServer,
    postgresql_db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM (`stop()`) waits STOP_WAIT for a step in progress, then breaks its sink's
    connection: `run` returns, and the cut step is not recorded as a failure."""
    monkeypatch.setattr(server_module, "STOP_WAIT", 2.0)
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        execute(c, [["INSERT INTO t VALUES(?, ?)", i, f"v{i}"] for i in range(10)])
    store = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    try:
        control.subscribe(store, name="pg", sources=node.url, table="t", sink=postgresql_db_url)
        # no probe before the stop: the step is only ever cut by it
        server = PipelineServer(store, spark, poll_interval=0.1, stall_probe_after=3600)
        running = Running(server).__enter__()
        wait_for("caught up", lambda: running.applied("pg") >= head(node))
        with postgresql_server.frozen():
            with node.client() as c:
                execute(c, [["INSERT INTO t VALUES(?, ?)", 100, "while frozen"]])
            wait_for(
                "a step waiting on the frozen server",
                lambda: any(
                    s.step_started is not None and time.monotonic() - s.step_started > 1
                    for s in server._scheduled.values()
                ),
            )
            server.stop()
            running.thread.join(30)
            assert not running.thread.is_alive()  # (before: waited as long as the freeze)
            assert running.result == [0]  # the cut step is no failure
            assert store.failure("pg") is None
        # the next run applies what the cut step had not committed
        again = PipelineServer(store, spark, poll_interval=0.1)
        assert again.run(until_caught_up=True) == 0
        assert verify(store.get_subscription("pg")).ok
    finally:
        store.close()
