"""Subscriptions as a user manages them (litecdc.pipeline.control), against a real node:
``status`` reports the lag in cids and in seconds, ``subscribe`` checks before it adds,
``unsubscribe`` releases the node's hold (or leaves that to the server when the node is
down)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from e2e.litecdc_node import Node, free_port
from pipeline_proc import execute, wait_until_pruned_past

from litecdc.errors import (
    MetadataError,
    NotFoundError,
    PipelineError,
    SchemaMismatchError,
    SinkError,
    SourceError,
)
from litecdc.pipeline import control
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.source_client import SourceClient


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    started = Node(tmp_path / "node").start()
    yield started
    started.stop()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    opened = MetadataStore.open(sqlite_url(tmp_path / "meta.db"))
    yield opened
    opened.close()


def _holds(node: Node) -> list[str]:
    with node.client() as c:
        return [h["name"] for h in c.get("/cdc/subscriptions").json()["subscriptions"]]


def test_status_reports_lag_in_cids_and_seconds(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)", "CREATE TABLE other(x)"])
    control.subscribe(
        store, name="t-lake", sources=node.url, table="t", sink=f"delta:{tmp_path / 'lake'}"
    )
    with node.client() as c:  # (as `pipeline run` registers it)
        registered = c.post("/cdc/subscriptions", json={"name": "t-lake"}).json()["cid"]
    store.start_register("t-lake", registered)
    store.set_ranges("t-lake", [(None, None)])
    store.record_chunk("t-lake", 0, last_key=None, read_cid=registered, rows=0, done=True)
    store.finish_snapshot("t-lake")

    with node.client() as c:
        execute(c, ["INSERT INTO other VALUES (1)"])  # another table's commit is no lag
    (report,) = control.status(store, "t-lake")
    assert report.lag_cids is not None and report.lag_cids >= 1
    assert report.lag_seconds == 0.0

    with node.client() as c:
        execute(c, [["INSERT INTO t VALUES (?, ?)", 1, "one"]])
    time.sleep(1.2)
    with node.client() as c:  # later commits of another table: the age is still t's change's
        execute(c, ["INSERT INTO other VALUES (2)"])  # (it measured this one: 0.0 s)
    (report,) = control.status(store, "t-lake")
    assert report.lag_seconds is not None and report.lag_seconds >= 1.0
    text = report.describe()
    assert "stage: incremental" in text and "lag" in text and " s" in text

    store.record_log_position("t-lake", report.source_cid or 0)  # the sink caught up
    (report,) = control.status(store, "t-lake")
    assert report.lag_cids == 0 and report.lag_seconds == 0.0


def test_status_says_when_the_source_is_unreachable(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    control.subscribe(store, name="s", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    node.stop()
    (report,) = control.status(store, "s")
    assert report.source_error is not None
    assert "source: unreachable" in report.describe()


def test_status_of_all_skips_one_unsubscribed_while_it_reads(
    node: Node, store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Metadata QA: `status` read the list, then each one's progress: one removed in
    between (a `run` finishing its unsubscribe) failed the whole command."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    for name in ("going", "staying"):
        control.subscribe(
            store, name=name, sources=node.url, table="t", sink=f"delta:{tmp_path}/{name}"
        )
    listed = store.list_subscriptions

    def listed_then_one_removed(**kwargs: Any) -> Any:
        subs = listed(**kwargs)
        store.remove_subscription("going")
        return subs

    monkeypatch.setattr(store, "list_subscriptions", listed_then_one_removed)
    assert [r.subscription.name for r in control.status(store)] == ["staying"]


def test_status_does_not_wait_long_for_a_frozen_source(
    node: Node, store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops QA: with a source node frozen (SIGSTOP) status waited 60 s per subscription on
    it. It waits 10 s (1 s here), once per status for all the subscriptions on that
    source: counted as connections the frozen source takes. A socket that takes
    connections and never answers stands in for the frozen node (freezing this test's own
    node would stop the fixture's)."""
    from dataclasses import replace

    monkeypatch.setattr(control, "STATUS_TIMEOUT", 1.0)
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    for name in ("f1", "f2", "f3"):
        control.subscribe(
            store, name=name, sources=node.url, table="t", sink=f"delta:{tmp_path}/{name}"
        )
    taken: list[socket.socket] = []
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent.settimeout(0.2)

        def take() -> None:
            while True:
                try:
                    taken.append(silent.accept()[0])
                except TimeoutError:
                    continue
                except OSError:
                    return

        threading.Thread(target=take, daemon=True).start()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        subs = store.list_subscriptions()
        # each with credentials of its own (review: each set waited its 15 s)
        users = [{"user": f"u{i}", "password": "p"} if i else {} for i in range(3)]
        monkeypatch.setattr(
            store,
            "list_subscriptions",
            lambda **_: [
                replace(s, sources=(url,), options={**s.options, **user})
                for s, user in zip(subs, users, strict=True)
            ],
        )
        reports = control.status(store)
        assert len(taken) == 1  # asked once, for all three
    for conn in taken:
        conn.close()
    assert [r.subscription.name for r in reports] == ["f1", "f2", "f3"]
    for report in reports:
        assert "source: unreachable" in report.describe(), report.describe()
        assert "read timeout=1.0" in report.describe()


def test_status_asks_a_source_for_its_holds_once_and_about_tables_in_parallel(
    node: Node, store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale QA: 40 subscriptions took `pipeline status` 33 s on a loaded node — five
    requests each, one subscription after the other, each on a client of its own. The
    subscriptions of one source share its list of holds (asked once) and its tables are
    asked about in parallel; each report is still its own (one table dropped here)."""
    with node.client() as c:
        execute(c, [f"CREATE TABLE t{i}(id INTEGER PRIMARY KEY)" for i in range(6)])
    for i in range(6):
        control.subscribe(
            store, name=f"s{i}", sources=node.url, table=f"t{i}", sink=f"delta:{tmp_path}/{i}"
        )
    with node.client() as c:
        execute(c, ["DROP TABLE t4"])
    holds_asked: list[str] = []
    tables_asked: list[str] = []
    real_subscriptions, real_table_info = SourceClient.subscriptions, SourceClient.table_info

    def subscriptions(self: SourceClient) -> Any:
        holds_asked.append(threading.current_thread().name)
        return real_subscriptions(self)

    def table_info(self: SourceClient, *args: Any, **kwargs: Any) -> Any:
        tables_asked.append(threading.current_thread().name)
        return real_table_info(self, *args, **kwargs)

    monkeypatch.setattr(SourceClient, "subscriptions", subscriptions)
    monkeypatch.setattr(SourceClient, "table_info", table_info)
    reports = control.status(store)
    assert len(holds_asked) == 1
    assert len(tables_asked) == 6
    assert all(name.startswith("litecdc-status") for name in tables_asked)
    assert [r.subscription.name for r in reports] == [f"s{i}" for i in range(6)]
    for i, report in enumerate(reports):
        assert report.source_error is None, report.describe()
        assert (report.table_missing is not None) == (i == 4), report.describe()
        assert report.source_cid is not None and report.source_cid > 0


def test_status_stops_asking_a_source_whose_tables_do_not_answer(
    store: MetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a source that answered its list of holds but not about tables cost status
    its wait per 8 subscriptions (24: 45 s). Once one request went unanswered, the other
    subscriptions on it are told so without asking: here at most one batch of 8 asks,
    counted as the table requests the half-hung source took. (A real node cannot be made
    to hang on tables alone: a small HTTP server stands in for it.)"""
    import http.server
    import json

    monkeypatch.setattr(control, "STATUS_TIMEOUT", 1.0)
    asked: list[str] = []
    release = threading.Event()

    class HalfHung(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/cdc/subscriptions"):
                body = json.dumps(
                    {"subscriptions": [], "pruned_cid": 0, "last_cid": 5, "retention_cids": 0}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            asked.append(self.path)
            release.wait(10)  # never answers within the status's wait

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HalfHung)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for i in range(24):
            store.add_subscription(
                f"h{i}", table_name="t", sources=[url], sink=f"delta:{tmp_path}/h{i}"
            )
        reports = control.status(store)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert len(reports) == 24
    assert all("source: unreachable" in r.describe() for r in reports), reports[0].describe()
    assert 1 <= len(asked) <= control.STATUS_PARALLEL


def test_status_outwaits_a_nodes_wait_for_min_cid() -> None:
    """Status reads the source's head with min_cid = the cid the sink applied; a cluster
    follower behind it waits 10 s, then answers 503 saying so. Status gave up at 10 s
    too, called the follower 'unreachable' and said so, unasked, for every other
    subscription on it (review). Its wait outlasts the node's."""
    from litecdc.http import app

    assert control.STATUS_TIMEOUT > app.MIN_CID_WAIT + 2


def test_subscribe_checks_the_sink_and_the_table_first(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    with pytest.raises(SinkError, match="nosuch"):
        control.subscribe(store, name="a", sources=node.url, table="t", sink="nosuch://x")
    with pytest.raises(NotFoundError, match="no table 'missing'"):
        control.subscribe(
            store, name="b", sources=node.url, table="missing", sink=f"delta:{tmp_path}/d"
        )
    with pytest.raises(SinkError, match="absolute"):
        control.subscribe(store, name="c", sources=node.url, table="t", sink="parquet:rel")
    assert store.list_subscriptions(include_cancelled=True) == []
    # one path is one table (or log): a second subscription on it would fight the first
    control.subscribe(store, name="d", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    with pytest.raises(MetadataError, match="already used by subscription d"):
        control.subscribe(store, name="e", sources=node.url, table="t", sink=f"delta:{tmp_path}/d")
    assert [s.name for s in store.list_subscriptions()] == ["d"]


def test_subscribe_refuses_a_table_with_a_column_named_as_the_pipelines_own(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: a column named as one of the pipeline's own was taken here, then every sink
    failed with 'duplicate column'."""
    with node.client() as c:
        execute(
            c,
            [
                "CREATE TABLE ours(id INTEGER PRIMARY KEY, _litecdc_cid INTEGER)",
                "CREATE TABLE nokey(v, _LITECDC_ROWID)",
                "CREATE TABLE keyed(id INTEGER PRIMARY KEY, _litecdc_rowid)",  # no rowid column
                # (types QA) SQL cannot read the rowid such tables are keyed by
                "CREATE TABLE hidden(rowid INTEGER, oid TEXT, _rowid_ TEXT)",
                "CREATE TABLE nullable(k TEXT PRIMARY KEY, rowid, Oid, _ROWID_)",
                "CREATE TABLE reachable(rowid INTEGER, oid TEXT, v)",  # _rowid_ still reads it
                "CREATE TABLE strict_key(k TEXT NOT NULL PRIMARY KEY, rowid, oid, _rowid_)",
                # (idents QA) SQLite tells İ from I, MariaDB takes it as i
                'CREATE TABLE dotted(id INTEGER PRIMARY KEY, "_LITECDC_C\u0130D")',
            ],
        )
    ours = "has a column named '{}', a name the pull source gives"
    hidden = "has columns named rowid, _rowid_ and oid, so SQL cannot"
    for table, says in [
        ("ours", ours.format("_litecdc_cid")),
        ("nokey", ours.format("_LITECDC_ROWID")),
        ("dotted", ours.format("_LITECDC_C\u0130D")),
        ("hidden", hidden),
        ("nullable", hidden),
    ]:
        with pytest.raises(SourceError, match=rf"table {table} {says}"):
            control.subscribe(
                store, name="ours", sources=node.url, table=table, sink=f"delta:{tmp_path}/d"
            )
    for table in ("reachable", "strict_key"):
        control.subscribe(
            store, name=table, sources=node.url, table=table, sink=f"delta:{tmp_path}/{table}"
        )
    control.subscribe(
        store, name="keyed", sources=node.url, table="keyed", sink=f"delta:{tmp_path}/k"
    )
    assert sorted(s.name for s in store.list_subscriptions()) == [
        "keyed", "reachable", "strict_key"
    ]  # fmt: skip


def test_subscribe_refuses_names_a_sql_sink_cannot_hold_without_contacting_it(
    node: Node, store: MetadataStore
) -> None:
    """Types QA: a MariaDB mirror of a table named with a character beyond U+FFFF was
    accepted here and failed every run with MariaDB's 'Illegal mix of collations'. The
    names are judged without a connection (nothing listens at these ports)."""
    with node.client() as c:
        execute(c, ['CREATE TABLE "tablé 🚀"(id INTEGER PRIMARY KEY, v)'])
    amqp = "amqp://u:p@127.0.0.1:9/"
    refused: list[tuple[type[Exception], str, str, str]] = [
        (
            SchemaMismatchError,
            r"table name 'tablé 🚀' holds '🚀'",
            "my",
            "mysql://u@127.0.0.1:9/db",
        ),
        (
            SchemaMismatchError,
            r"table name 't{64}' is 64 bytes",
            "pg",
            f"postgresql://u@127.0.0.1:9/db?table={'t' * 64}",
        ),
        # pipeline QA: a queue name over AMQP's 255 bytes was stored, then every run
        # refused it
        (SinkError, r"is longer than AMQP's 255 bytes", "mq", f"{amqp}?queue={'q' * 256}"),
    ]
    for error, message, name, sink in refused:
        with pytest.raises(error, match=message):
            control.subscribe(store, name=name, sources=node.url, table="tablé 🚀", sink=sink)
    assert store.list_subscriptions(include_cancelled=True) == []
    control.subscribe(  # PostgreSQL takes it
        store, name="pg", sources=node.url, table="tablé 🚀", sink="postgresql://u@127.0.0.1:9/db"
    )
    control.subscribe(  # and RabbitMQ a queue of 255 bytes
        store,
        name="mq",
        sources=node.url,
        table="tablé 🚀",
        sink=f"{amqp}?queue={'q' * 255}",
    )


def test_subscribe_refuses_columns_a_case_blind_sink_takes_as_one_and_its_own_tables(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """Idents QA: SQLite folds ASCII letters only, so é and É (or k and the Kelvin sign)
    are two columns; MariaDB, Delta and Spark take them as one. Subscribed, every run
    failed with "Duplicate column name 'É'" or delta-rs's or Spark's words. And a MariaDB
    mirror named as the sink's staging table was hidden by it: every change was lost.
    Judged without a connection (nothing listens at these ports)."""
    with node.client() as c:
        execute(
            c,
            [
                'CREATE TABLE uni(id INTEGER PRIMARY KEY, "é" TEXT, "É" TEXT)',
                'CREATE TABLE kelvin(id INTEGER PRIMARY KEY, k TEXT, "\u212a" TEXT)',
                "CREATE TABLE litecdc_stage_deletes(id INTEGER PRIMARY KEY)",
                # (review) each server's own folding: MariaDB's letter by letter keeps a
                # final capital sigma apart from the final small one, Unicode's does not;
                # Unicode's keeps İ apart from i, MariaDB's does not
                'CREATE TABLE sigma(id INTEGER PRIMARY KEY, "\u0391\u03a3", "\u03b1\u03c2")',
                'CREATE TABLE dot_i(id INTEGER PRIMARY KEY, "\u0130l", "il")',
                'CREATE TABLE fine(id INTEGER PRIMARY KEY, e, "é", "\u0131", i)',
            ],
        )
    maria = "mysql://u@127.0.0.1:9/db"
    one_name = "columns {!r} and {!r} are one name to {}, which takes names regardless"
    refused = [
        ("uni", f"delta:{tmp_path}/uni", one_name.format("é", "É", "Delta")),
        ("uni", f"parquet:{tmp_path}/uni-log", one_name.format("é", "É", "Spark")),
        ("kelvin", maria, one_name.format("k", "\u212a", "MariaDB")),
        (
            "sigma",
            f"delta:{tmp_path}/sigma",
            one_name.format("\u0391\u03a3", "\u03b1\u03c2", "Delta"),
        ),
        ("dot_i", f"{maria}?table=dot_i", one_name.format("\u0130l", "il", "MariaDB")),
        ("fine", f"{maria}?table=litecdc_stage_deletes", "table name 'litecdc_stage_deletes' is"),
        ("fine", f"{maria}?table=LITECDC_SINK_STATE", "is the sink's own"),
        ("litecdc_stage_deletes", maria, "is the sink's own .*: choose another"),
        (
            "fine",
            "postgresql://u@127.0.0.1:9/db?table=litecdc_sink_state",
            "table name 'litecdc_sink_state' is the sink's own",
        ),
    ]
    for table, sink, says in refused:
        with pytest.raises(SchemaMismatchError, match=says):
            control.subscribe(store, name="x", sources=node.url, table=table, sink=sink)
    assert store.list_subscriptions(include_cancelled=True) == []
    assert not (tmp_path / "uni").exists() and not (tmp_path / "uni-log").exists()
    taken = [
        ("uni", "postgresql://u@127.0.0.1:9/db?table=uni"),  # PostgreSQL tells them apart
        ("fine", maria),  # é is not e to MariaDB, nor dotless i (U+0131) i
        ("fine", f"delta:{tmp_path}/fine"),
        ("litecdc_stage_deletes", "postgresql://u@127.0.0.1:9/db?table=stage"),
        ("sigma", f"{maria}?table=sigma"),
        ("dot_i", f"delta:{tmp_path}/dot_i"),
        ("dot_i", f"parquet:{tmp_path}/dot_i-log"),
    ]
    for n, (table, sink) in enumerate(taken):
        control.subscribe(store, name=f"ok{n}", sources=node.url, table=table, sink=sink)

    # a column added later, one name with another to the sink: said as such, not delta-rs's
    from litecdc.pipeline.sinks.registry import open_sink
    from litecdc.pipeline.tables import Column

    spec = SourceClient([node.url]).table_spec("fine")
    sink = open_sink(f"delta:{tmp_path}/fine", spec, "ok2")
    try:
        wider = replace(spec, columns=(*spec.columns, Column("E", "TEXT", "string")))
        with pytest.raises(SchemaMismatchError, match=one_name.format("e", "E", "Delta")):
            sink.evolve(wider)
    finally:
        sink.close()


def test_unsubscribe_releases_the_hold_or_leaves_it_to_the_server(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    for name in ("gone", "later"):
        control.subscribe(
            store, name=name, sources=node.url, table="t", sink=f"delta:{tmp_path}/{name}"
        )
        with node.client() as c:  # (as `pipeline run` registers it)
            c.post("/cdc/subscriptions", json={"name": name})
    assert control.unsubscribe(store, "gone") is None  # released
    assert "gone" not in _holds(node)
    assert [s.name for s in store.list_subscriptions(include_cancelled=True)] == ["later"]

    node.stop()
    with pytest.raises(SourceError):
        _raise_unreachable(node)
    problem = control.unsubscribe(store, "later")  # the node is down
    assert problem is not None and "unreachable" in problem
    (left,) = store.list_subscriptions(include_cancelled=True)
    assert left.name == "later" and left.cancel
    # --force: removed all the same (the node drops the hold past its retention cap)
    assert control.unsubscribe(store, "later", force=True) is not None
    assert store.list_subscriptions(include_cancelled=True) == []


def _raise_unreachable(node: Node) -> None:
    from litecdc.pipeline.source_client import SourceClient

    with SourceClient([node.url]) as client:
        client.subscriptions()


def test_passwords_in_sink_urls_are_never_printed(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from litecdc.cli import cli

    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    sink = "postgresql://mirror:s3cret-pw@127.0.0.1:1/db"
    control.subscribe(store, name="pg", sources=node.url, table="t", sink=sink)
    (report,) = control.status(store, "pg")
    assert "s3cret-pw" not in report.describe() and "mirror:***@" in report.describe()
    meta = sqlite_url(tmp_path / "meta.db")
    for args in (["list"], ["status", "pg"]):
        result = CliRunner().invoke(cli, ["pipeline", *args, "--meta", meta])
        assert result.exit_code == 0, result.output
        assert "s3cret-pw" not in result.output and "pg" in result.output


def _to_incremental(store: MetadataStore, name: str, registered: int) -> None:
    """``name`` as `pipeline run` leaves it once its (empty) snapshot is done."""
    store.start_register(name, registered)
    store.set_ranges(name, [(None, None)])
    store.record_chunk(name, 0, last_key=None, read_cid=registered, rows=0, done=True)
    store.finish_snapshot(name)


def test_subscribe_refuses_a_name_the_node_holds_for_another_store(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: two metadata stores subscribed one name against one node, sharing its hold
    (holds are named, nothing more): one store's unsubscribe released it, and the other's
    subscription failed for good, its changes pruned. Refused now, naming the way out."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    other = MetadataStore.open(sqlite_url(tmp_path / "other.db"))
    try:
        control.subscribe(other, name="ev", sources=node.url, table="t", sink=f"delta:{tmp_path}/a")
        with SourceClient([node.url]) as client:
            client.register("ev")  # (as the other store's `pipeline run` does)
            held = client.subscriptions().get("ev")
        assert held is not None
        with node.client() as c:
            execute(c, ["INSERT INTO t VALUES (1)"])
        with pytest.raises(MetadataError) as info:
            control.subscribe(
                store, name="ev", sources=node.url, table="t", sink=f"delta:{tmp_path}/b"
            )
        message = str(info.value)
        assert (
            f"the source already holds changes (after cid {held.cid}) for a subscription of "
            in message
        )
        assert f"curl -X DELETE {node.url.rstrip('/')}/cdc/subscriptions/ev" in message
        assert "add --take-over-hold" in message
        assert store.list_subscriptions(include_cancelled=True) == []  # nothing added
        with SourceClient([node.url]) as client:
            hold = client.subscriptions().get("ev")
        assert hold == held  # nor moved
        # the store that has it may subscribe other names, and so may this one
        control.subscribe(
            store, name="ev2", sources=node.url, table="t", sink=f"delta:{tmp_path}/c"
        )
    finally:
        other.close()


def test_a_hold_left_by_a_forced_unsubscribe_is_taken_over_only_when_asked(
    tmp_path: Path, store: MetadataStore
) -> None:
    """Review: `unsubscribe --force` while the node was down leaves the hold (expired once
    past the retention cap, never deleted): subscribing the name again names it so, and
    --take-over-hold takes it, the first run registering it afresh."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    capped = Node(tmp_path / "capped", "--retention-cids", "3").start()
    try:
        with capped.client() as c:
            execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
        control.subscribe(
            store, name="f", sources=capped.url, table="t", sink=f"delta:{tmp_path}/f"
        )
        with SourceClient([capped.url]) as client:
            registered = client.register("f").cid
        store.remove_subscription("f")  # what --force does when the node cannot be asked
        with capped.client() as c:
            for i in range(8):  # past the cap: the keeper expires the hold
                execute(c, [["INSERT INTO t VALUES (?)", i]])
        wait_until_pruned_past(capped, "f", registered)
        meta = sqlite_url(tmp_path / "meta.db")
        args = ["pipeline", "subscribe", "--meta", meta, "--source", capped.url, "--table", "t",
                "--name", "f", "--sink", f"delta:{tmp_path}/f"]  # fmt: skip
        refused = CliRunner().invoke(cli, args)
        assert refused.exit_code == 1, refused.output
        assert "the source keeps an expired hold (at cid" in refused.output
        assert store.list_subscriptions(include_cancelled=True) == []
        taken = CliRunner().invoke(cli, [*args, "--take-over-hold"])
        assert taken.exit_code == 0, taken.output
        assert [s.name for s in store.list_subscriptions()] == ["f"]
    finally:
        capped.stop()


def test_status_says_a_missing_hold_needs_a_rebuild_not_a_new_snapshot(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: with its hold deleted on the node, `status` said both FAILING (as `pipeline run`
    reported: rebuild the mirror) and "position expired … takes a new snapshot", which
    never came."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    control.subscribe(store, name="h", sources=node.url, table="t", sink=f"delta:{tmp_path}/h")
    with SourceClient([node.url]) as client:
        _to_incremental(store, "h", client.register("h").cid)
        (report,) = control.status(store, "h")
        assert not report.hold_missing and "hold missing" not in report.describe()
        client.unsubscribe("h")  # deleted on the node, behind the store's back
    with node.client() as c:
        execute(c, ["INSERT INTO t VALUES (1)"])
    (report,) = control.status(store, "h")
    text = report.describe()
    assert report.hold_missing and report.position_expired is None, text
    assert "hold missing: the node keeps no changes for this subscription" in text
    assert "pipeline unsubscribe h`, empty or drop the mirror, and subscribe again" in text
    assert "new snapshot" not in text


def test_status_shows_every_subscription_when_one_position_expired_or_table_is_gone(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: once one subscription's position had expired (the node's retention cap),
    `pipeline status` failed with exit 1 and printed nothing for any subscription; and a
    dropped table was reported as 'source: unreachable' although the node answered."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    capped = Node(tmp_path / "capped", "--retention-cids", "3").start()
    try:
        execute_on = {"late": (capped, "t"), "dropped": (node, "dd"), "fine": (node, "ok")}
        with capped.client() as c:
            execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)"])
        with node.client() as c:
            execute(c, ["CREATE TABLE dd(id INTEGER PRIMARY KEY)", "CREATE TABLE ok(id)"])
        for name, (source, table) in execute_on.items():
            control.subscribe(
                store, name=name, sources=source.url, table=table, sink=f"delta:{tmp_path}/{name}"
            )
            with SourceClient([source.url]) as client:
                _to_incremental(store, name, client.register(name).cid)
        registered = store.progress("late").last_log_index or 0
        with capped.client() as c:
            for i in range(8):  # more than 3 commits: the keeper expires the hold, prunes
                execute(c, [["INSERT INTO t VALUES (?, ?)", i, "x"]])
        wait_until_pruned_past(capped, "late", registered)
        with node.client() as c:
            execute(c, ["DROP TABLE dd"])

        reports = {r.subscription.name: r for r in control.status(store)}
        assert sorted(reports) == ["dropped", "fine", "late"]
        late_text = reports["late"].describe()
        assert reports["late"].position_expired is not None, late_text
        assert "position expired" in late_text and "new snapshot" in late_text
        assert "unreachable" not in late_text
        dropped_text = reports["dropped"].describe()
        assert "table dd is gone" in dropped_text and "no table 'dd'" in dropped_text
        assert "unreachable" not in dropped_text and "source head: cid" in dropped_text
        fine = reports["fine"]
        assert (fine.source_error, fine.table_missing, fine.position_expired) == (None,) * 3
        assert fine.lag_seconds == 0.0  # no change of its table since it registered

        result = CliRunner().invoke(
            cli, ["pipeline", "status", "--meta", sqlite_url(tmp_path / "meta.db")]
        )
        assert result.exit_code == 0, result.output
        for name in ("dropped", "fine", "late"):
            assert f"{name}: table" in result.output
        assert "position expired" in result.output and "table dd is gone" in result.output
    finally:
        capped.stop()


def test_subscribe_refuses_a_sink_another_subscription_writes(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: while a2 owned delta:/tmp/lake/x, subscribe took delta:/tmp/lake/x/,
    delta:/tmp/lake/./x and parquet:/tmp/lake/x (the rule compared the URLs as text), and
    two subscriptions then wrote into one Delta table."""
    with node.client() as c:
        execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY)"])
    lake = tmp_path / "lake"
    (tmp_path / "link").symlink_to(lake, target_is_directory=True)
    pg = "postgresql://app:pw@127.0.0.1:5432/shop"
    taken = {
        "a2": f"delta:{lake}/x",
        "pg": f"{pg}?table=t",  # t: the source table's name, the default
        "my": "mysql://root@127.0.0.1:3306/Shop?table=Orders",
    }
    for name, sink in taken.items():
        control.subscribe(store, name=name, sources=node.url, table="t", sink=sink)
    same = {
        f"delta:{lake}/x/": "a2",
        f"delta:{lake}/./x": "a2",
        f"delta:{lake}/y/../x": "a2",
        f"delta://{lake}/x": "a2",
        f"DELTA:{lake}/x": "a2",
        f"parquet:{lake}/x": "a2",
        f"delta:{tmp_path}/link/x": "a2",  # through a symbolic link
        f"delta:{lake}/x/inner": "a2",  # inside its table
        f"parquet:{lake}": "a2",  # holding its table
        pg: "pg",  # the default table
        "postgres://other@localhost:5432/shop?schema=public&table=t": "pg",
        "mariadb://u@localhost/shop?table=orders": "my",  # MariaDB: names without case
    }
    for sink, owner in same.items():
        with pytest.raises(MetadataError, match=f"already used by subscription {owner} ") as info:
            control.subscribe(store, name="b", sources=node.url, table="t", sink=sink)
        assert ":pw@" not in str(info.value)
    assert sorted(s.name for s in store.list_subscriptions()) == ["a2", "my", "pg"]
    elsewhere = [
        f"delta:{lake}/x2",
        f"parquet:{lake}/xy",
        f"{pg}?table=t&schema=other",
        f"{pg}?table=T",  # PostgreSQL: quoted names, case counts
        "postgresql://app@db.example:5432/shop?table=t",
        "postgresql://app@127.0.0.1:5433/shop?table=t",
        "postgresql://app@127.0.0.1:5432/other?table=t",
        "mysql://root@127.0.0.1:3306/other?table=orders",
        # message sinks may be shared: subscriptions publish into one stream or exchange
        "nats://127.0.0.1:4222?stream=S",
        "nats://127.0.0.1:4222?stream=S",
        "amqp://guest:guest@127.0.0.1:5672/?exchange=e",
        "amqp://guest:guest@127.0.0.1:5672/?exchange=e",
    ]
    for i, sink in enumerate(elsewhere):
        control.subscribe(store, name=f"ok{i}", sources=node.url, table="t", sink=sink)


def test_a_table_name_with_a_slash_is_read_and_subscribed(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """QA: GET /cdc/tables/we%20ird%2Ft… answered 404 'litecdc has no endpoint /cdc/tables/
    we ird/t…': the node routed on the decoded path, where %2F is a '/'. Here a table
    named like another table's endpoint, too."""
    odd, plain = "we ird/rows", "we ird"
    with node.client() as c:
        execute(
            c,
            [
                f'CREATE TABLE "{odd}"(id INTEGER PRIMARY KEY, "v/%2F" TEXT)',
                f'CREATE TABLE "{plain}"(k TEXT PRIMARY KEY)',
                # (idents QA: the client sent these as dot segments: /cdc/tables/, /cdc/)
                'CREATE TABLE "."(dot INTEGER PRIMARY KEY)',
                'CREATE TABLE ".."(dots INTEGER PRIMARY KEY)',
                *[[f'INSERT INTO "{odd}" VALUES (?, ?)', i, f"v{i}"] for i in range(1, 6)],
                [f'INSERT INTO "{plain}" VALUES (?)', "other table"],
            ],
        )
    with SourceClient([node.url]) as client:
        start = client.register("slash-reader").cid
        info = client.table_info(odd, count_rows=True)
        assert (info.spec.name, info.spec.column_names, info.rows) == (odd, ["id", "v/%2F"], 5)
        assert client.table_info(plain).spec.column_names == ["k"]
        assert client.table_info(".").spec.column_names == ["dot"]
        assert client.table_info("..").spec.column_names == ["dots"]
        assert client.rows("..", limit=10).table.num_rows == 0
        assert client.splits(odd, 2).ranges()
        page = client.rows(odd, limit=10)
        assert page.table.column("v/%2F").to_pylist() == [f"v{i}" for i in range(1, 6)]
        assert client.rows(plain, limit=10).table.column("k").to_pylist() == ["other table"]
        with node.client() as c:
            execute(c, [[f'UPDATE "{odd}" SET "v/%2F" = ? WHERE id = 1', "changed"]])
        assert client.position(odd, after=start, max_events=10).events == 1
        changes = client.changes(odd, after=start, limit=10)
        assert changes.table.column("v/%2F").to_pylist() == ["changed"]
    control.subscribe(store, name="slash", sources=node.url, table=odd, sink=f"delta:{tmp_path}/s")
    (report,) = control.status(store, "slash")
    assert report.source_error is None and report.table_missing is None, report.describe()
    # still exact: a path that names no endpoint is a 404
    with node.client() as c:
        for path in ("/cdc/tables/", "/cdc/tables//rows", "/cdc/tables/we%20ird/rows/x"):
            assert c.get(path).status_code == 404, path
        assert c.get("/cdc/tables/we%20ird/bogus").status_code == 404


def test_run_refuses_a_metrics_port_it_cannot_listen_on_before_starting_spark(
    tmp_path: Path,
) -> None:
    """QA: a port out of range or in use ended `pipeline run` in a traceback, after Spark
    had started; it is a one-line error (exit status 2) before anything starts."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    meta = sqlite_url(tmp_path / "meta.db")
    result = CliRunner().invoke(cli, ["pipeline", "run", "--meta", meta, "--metrics-port", "99999"])
    assert result.exit_code == 2 and "99999 is not in the range 0<=x<=65535" in result.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli, ["pipeline", "run", "--meta", meta, "--metrics-port", str(port)]
        )
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    )
    assert not (tmp_path / "meta.db").exists()  # refused before anything was opened


@pytest.mark.parametrize("given", ["0", "-1", "65", "two"])
def test_run_refuses_a_parallel_count_out_of_range(tmp_path: Path, given: str) -> None:
    from click.testing import CliRunner

    from litecdc.cli import cli

    meta = sqlite_url(tmp_path / "meta.db")
    result = CliRunner().invoke(cli, ["pipeline", "run", "--meta", meta, "--parallel", given])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--parallel'" in result.output
    assert not (tmp_path / "meta.db").exists()


@pytest.mark.parametrize(
    "master",
    [
        "bogus", "local[0]", "spark://host-without-port", "spark://h_1:7077", "mesos://h:5050",
        "local[99999999999]", "local[2,99999999999]", "spark://h:70000", "spark://h:0",
        "spark://h1:7077,h2:65536", "spark://[::1]:99999",
    ],
)  # fmt: skip
def test_run_refuses_a_master_url_spark_would_not_take_before_starting_it(
    tmp_path: Path, master: str
) -> None:
    """QA: `--master bogus` printed the JVM's stack trace, then the error, after Spark had
    taken its time to start; now one line before anything starts."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    meta = sqlite_url(tmp_path / "meta.db")
    result = CliRunner().invoke(cli, ["pipeline", "run", "--meta", meta, "--master", master])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --master {master!r} is not a Spark master URL: use local[*], local[N], "
        "spark://HOST:PORT, yarn or k8s://HOST:PORT\n"
    )
    assert not (tmp_path / "meta.db").exists()


_SIZES = "give a number of MiB, or a number and a unit, k, m, g or t (512m, 2g, 8g)"


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        ("lots", f"is not a memory size: {_SIZES}"),
        ("2x", f"is not a memory size: {_SIZES}"),
        ("-1g", f"is not a memory size: {_SIZES}"),
        ("256m", "is too little: Spark needs at least 512m"),
        ("511", "is too little: Spark needs at least 512m"),  # (MiB)
        ("1000k", "is too little: Spark needs at least 512m"),
    ],
)
def test_run_refuses_a_driver_memory_spark_would_not_start_with_before_starting_it(
    tmp_path: Path, memory: str, message: str
) -> None:
    from click.testing import CliRunner

    from litecdc.cli import cli

    meta = sqlite_url(tmp_path / "meta.db")
    args = ["pipeline", "run", "--meta", meta, "--driver-memory", memory]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == f"error: --driver-memory {memory!r} {message}\n"
    assert not (tmp_path / "meta.db").exists()


def test_driver_memory_takes_spark_s_forms_and_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from litecdc.pipeline.spark import check_driver_memory, driver_memory_default

    for memory in ("512m", "2g", "2G", "2gb", "1t", "524288k", " 4g ", "2048"):
        check_driver_memory(memory)
    monkeypatch.delenv("SPARK_DRIVER_MEMORY", raising=False)
    assert driver_memory_default() == "2g"
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "3g")  # (what spark-submit would take)
    assert driver_memory_default() == "3g"


def test_a_run_ends_when_spark_s_jvm_has_died() -> None:
    """Scale QA: the JVM died of an OutOfMemoryError and every step after it failed with
    "connection refused" until each subscription was given up on. (A stand-in for the
    JVM's process: killing the suite's shared JVM would end the module's session.)"""
    from types import SimpleNamespace

    from litecdc.pipeline.server import PipelineServer

    class Exited:
        def poll(self) -> int:
            return 137

    spark = SimpleNamespace(sparkContext=SimpleNamespace(_gateway=SimpleNamespace(proc=Exited())))
    server = PipelineServer.__new__(PipelineServer)
    server.spark = spark  # type: ignore[assignment]
    with pytest.raises(PipelineError, match=r"Spark's JVM exited \(status 137\); its last"):
        server._check_spark_alive()
    Exited.poll = lambda self: -9  # type: ignore[method-assign]
    with pytest.raises(PipelineError, match=r"Spark's JVM was killed by signal 9; its last"):
        server._check_spark_alive()
    spark.sparkContext._gateway.proc = None  # a JVM this process did not start
    server._check_spark_alive()


@pytest.mark.parametrize(
    "master",
    [
        "local", "local[*]", "local[2]", "local[02]", "local[2,3]", "local[* ,2]",
        "local[2,0]", "local-cluster[2, 1, 1024]", "spark://h1:7077,h2:7077",
        "spark://[::1]:7077", "spark://h:65535,[::1]:1", "yarn",
        "k8s://https://127.0.0.1:6443",
    ],
)  # fmt: skip
def test_the_master_check_takes_every_form_spark_does(master: str) -> None:
    """QA: local[* ,2], local[02], local[2,0] (Spark 4.3 ran each) and an IPv6 master
    were refused."""
    from litecdc.pipeline.spark import check_master

    check_master(master)


def test_commands_other_than_subscribe_do_not_make_the_default_store(tmp_path: Path) -> None:
    """QA: `pipeline list` run in another directory made an empty litecdc-pipeline.db
    there and said "no subscriptions", as if they were gone. Docs QA: its exit status was
    2 (a bad option's), where a --meta file that is missing gives 1."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as where:
        for args in (["list"], ["status"], ["verify", "x"], ["unsubscribe", "x"], ["run"]):
            result = runner.invoke(cli, ["pipeline", *args], env={"LITECDC_PIPELINE_META": ""})
            assert result.exit_code == 1, (args, result.output)  # as a missing --meta file
            assert result.output.startswith(
                "error: no metadata store here: the default is litecdc-pipeline.db in the "
                f"working directory ({where}), made by `litecdc pipeline subscribe`"
            ), result.output
        assert not (Path(where) / "litecdc-pipeline.db").exists()


def test_a_subscribe_that_fails_leaves_no_store_it_made(node: Node, tmp_path: Path) -> None:
    """Pipeline QA: a subscribe refused (here: its source unreachable) left the empty
    store it had made, and `list` then said "no subscriptions" instead of "no metadata
    store here". A store that was there already, or holds subscriptions, stays."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    unreachable = f"http://127.0.0.1:{free_port()}"
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path) as where:
        explicit = Path(where) / "named.db"
        for meta in ([], ["--meta", sqlite_url(explicit)]):
            result = runner.invoke(
                cli,
                ["pipeline", "subscribe", *meta, "--source", unreachable, "--table", "t",
                 "--name", "n", "--sink", f"delta:{Path(where) / 'lake'}"],
                env={"LITECDC_PIPELINE_META": ""},
            )  # fmt: skip
            assert result.exit_code == 1, result.output
            assert "unreachable" in result.output, result.output
            assert sorted(p.name for p in Path(where).iterdir()) == [], result.output
        result = runner.invoke(cli, ["pipeline", "list"], env={"LITECDC_PIPELINE_META": ""})
        assert result.output.startswith("error: no metadata store here"), result.output
        MetadataStore.open(sqlite_url(explicit)).close()  # there before: it stays
        result = runner.invoke(
            cli,
            ["pipeline", "subscribe", "--meta", sqlite_url(explicit), "--source", unreachable,
             "--table", "t", "--name", "n", "--sink", f"delta:{Path(where) / 'lake'}"],
        )  # fmt: skip
        assert result.exit_code == 1 and explicit.exists(), result.output
        with node.client() as c:
            execute(c, ["CREATE TABLE t (id INTEGER PRIMARY KEY)"])
        result = runner.invoke(  # one that succeeds makes the default store
            cli,
            ["pipeline", "subscribe", "--source", node.url, "--table", "t", "--name", "n",
             "--sink", f"delta:{Path(where) / 'lake'}"],
            env={"LITECDC_PIPELINE_META": ""},
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        with MetadataStore.open(sqlite_url(Path(where) / "litecdc-pipeline.db")) as made:
            assert [s.name for s in made.list_subscriptions()] == ["n"]


def test_a_subscribe_that_fails_makes_no_postgresql_store(postgresql_db_url: str) -> None:
    """Metadata QA: a subscribe refused (its table missing) on an empty PostgreSQL
    database left the store's five tables there: `status` then said "no subscriptions"
    instead of "no metadata store in PostgreSQL …"."""
    import psycopg
    from click.testing import CliRunner

    from litecdc.cli import cli

    unreachable = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(
        cli,
        ["pipeline", "subscribe", "--meta", postgresql_db_url, "--source", unreachable,
         "--table", "t", "--name", "n", "--sink", "delta:/tmp/never-made"],
    )  # fmt: skip
    assert result.exit_code == 1 and "unreachable" in result.output, result.output
    with psycopg.connect(postgresql_db_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    assert tables == []


def test_a_foreign_or_missing_sqlite_file_is_never_made_a_metadata_store(tmp_path: Path) -> None:
    """QA: `pipeline list --meta sqlite:///NODE/db.sqlite` put the store's tables into a
    litecdc node's own database (no journal entry, no change event: its replicas differ),
    and a mistyped path made a new empty store and said "no subscriptions"."""
    import sqlite3

    from click.testing import CliRunner

    from litecdc import NodeConfig, Statement, Store
    from litecdc.cli import cli

    node_store = Store(NodeConfig(data_dir=tmp_path / "node"))
    node_store.execute([Statement("CREATE TABLE orders(id INTEGER PRIMARY KEY)")])
    node_db = Path(node_store.engine.path)
    node_store.close()
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE accounts(id)")
    conn.close()
    runner = CliRunner()
    for path in (node_db, other):
        before = path.read_bytes()
        subscribe = ["subscribe", "--source", "http://127.0.0.1:1", "--table", "t"]
        subscribe += ["--name", "n", "--sink", "delta:/x"]
        for args in (["list"], ["status"], subscribe):
            result = runner.invoke(cli, ["pipeline", *args, "--meta", sqlite_url(path)])
            assert result.exit_code == 1, result.output
            assert f"{path} is not a pipeline metadata store: it is another SQLite database" in (
                result.output
            ), result.output
            assert "give --meta a file of its own" in result.output
        assert path.read_bytes() == before
        assert not Path(f"{path}-wal").exists()
    missing = tmp_path / "typo.db"
    for args in (["list"], ["status"], ["unsubscribe", "x"], ["verify", "x"]):
        result = runner.invoke(cli, ["pipeline", *args, "--meta", sqlite_url(missing)])
        assert result.exit_code == 1, result.output
        assert f"no metadata store at {missing}: `litecdc pipeline subscribe` makes it" in (
            result.output
        )
        assert not missing.exists()
    empty = tmp_path / "empty.db"  # a 0-byte file: list wrote the schema into it (review)
    empty.touch()
    result = runner.invoke(cli, ["pipeline", "list", "--meta", sqlite_url(empty)])
    assert result.exit_code == 1 and f"no metadata store at {empty}" in result.output
    assert empty.stat().st_size == 0
    result = runner.invoke(cli, ["pipeline", "list", "--meta", ""])
    assert result.exit_code == 2 and result.output.startswith("error: --meta is empty"), (
        result.output
    )
    # a store made by subscribe opens as before
    made = MetadataStore.open(sqlite_url(tmp_path / "made.db"))
    made.close()
    result = runner.invoke(cli, ["pipeline", "list", "--meta", sqlite_url(tmp_path / "made.db")])
    assert result.exit_code == 0 and "no subscriptions" in result.output, result.output


def test_a_postgresql_database_is_made_a_store_by_subscribe_only(postgresql_db_url: str) -> None:
    """Docs QA: `pipeline status --meta postgresql://…/appdb` made the store's five tables
    in another application's database (or a mistyped one) and said "no subscriptions"."""
    import psycopg
    from click.testing import CliRunner

    from litecdc.cli import cli

    with psycopg.connect(postgresql_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers(id integer PRIMARY KEY)")

    def tables() -> list[str]:
        with psycopg.connect(postgresql_db_url) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
            ).fetchall()
        return [name for (name,) in rows]

    runner = CliRunner()
    for args in (["list"], ["status"], ["unsubscribe", "x"], ["verify", "x"], ["run"]):
        result = runner.invoke(cli, ["pipeline", *args, "--meta", postgresql_db_url])
        assert result.exit_code == 1, result.output
        assert "error: no metadata store in PostgreSQL postgresql://" in result.output
        assert "`litecdc pipeline subscribe` makes it" in result.output
        assert tables() == ["customers"]  # nothing made
    MetadataStore.open(postgresql_db_url).close()  # (as subscribe makes it)
    result = runner.invoke(cli, ["pipeline", "list", "--meta", postgresql_db_url])
    assert result.exit_code == 0 and "no subscriptions" in result.output, result.output


def test_subscribe_and_run_refuse_values_that_would_break_later(tmp_path: Path) -> None:
    """CLI QA: each of these was stored (or let run start) without a word, and failed
    later or never ran: --user without --password, a webhook URL holding a space, an
    empty --owner (stored as 'default'), "a,,b" sources (the empty one dropped), sizes of
    10**23, an empty --table ("litecdc has no endpoint /cdc/tables/"), a poll interval
    of nan or inf (the server never polled again)."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    meta = sqlite_url(tmp_path / "meta.db")
    MetadataStore.open(meta).close()
    runner = CliRunner()
    base = {
        "--source": "http://127.0.0.1:1",
        "--table": "t",
        "--name": "n",
        "--sink": f"delta:{tmp_path / 'lake'}",
    }
    cases = [
        ({"--user": "u"}, 2, "error: --user and --password must be given together"),
        ({"--owner": " "}, 2, "error: --owner is empty"),
        ({"--table": ""}, 2, "error: --table is empty"),
        ({"--partitions": str(10**23)}, 2, "error: --partitions must be between 1 and 1024"),
        ({"--max-events": "0"}, 2, "error: --max-events must be between 1 and 10000000, got 0"),
        ({"--page-rows": str(10**8)}, 2, "error: --page-rows must be between 1 and 10000000"),
        ({"--source": "http://127.0.0.1:1,,http://127.0.0.1:2"}, 1, "an empty address between"),
        ({"--source": " , "}, 1, "error: source: no address given"),
        (
            {"--sink": "http://127.0.0.1:1/ho ok"},
            1,
            "white space is not allowed in a URL (encode it: %20)",
        ),
        (  # pipeline QA: the message did not say which file
            {"--source": "https://127.0.0.1:1", "--ca-cert": str(tmp_path / "no-ca.pem")},
            1,
            f"error: source: cannot load the CA certificate {tmp_path / 'no-ca.pem'} (",
        ),
    ]
    for change, code, message in cases:
        args = [a for k, v in {**base, **change}.items() for a in (k, v)]
        result = runner.invoke(cli, ["pipeline", "subscribe", "--meta", meta, *args])
        assert result.exit_code == code, (change, result.output)
        assert message in result.output, (change, result.output)
    for interval in ("nan", "inf", "-1", "0", "86401"):
        result = runner.invoke(
            cli, ["pipeline", "run", "--meta", meta, "--poll-interval", interval]
        )
        assert result.exit_code == 2, (interval, result.output)
        assert result.output.startswith("error: --poll-interval must be a number of seconds")
    store = MetadataStore.open(meta)
    assert store.list_subscriptions(include_cancelled=True) == []
    store.close()


def test_the_partitions_bound_is_the_most_key_ranges_a_snapshot_has() -> None:
    from litecdc.pipeline.cli import MAX_PARTITIONS
    from litecdc.pipeline.server import MAX_CHUNKS

    assert MAX_PARTITIONS == MAX_CHUNKS


def test_a_second_run_of_an_owner_is_refused_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipeline QA: a second `pipeline run` of one owner (a restart script that did not
    wait for the first) raced the first, each re-copying tables the other had moved past."""
    from click.testing import CliRunner

    from litecdc.cli import cli
    from litecdc.pipeline.metadata import MetadataStore, sqlite_url

    def no_spark(master: str) -> None:
        raise AssertionError("Spark started: the run was not refused")

    monkeypatch.setattr("litecdc.pipeline.spark.spark_session", no_spark)
    url = sqlite_url(tmp_path / "meta.db")
    with MetadataStore.open(url, owner="default") as running:
        running.claim_owner()  # (as the first run's process holds it)
        result = CliRunner().invoke(cli, ["pipeline", "run", "--meta", url])
        assert result.exit_code == 1, result.output
        assert result.output.startswith(
            "error: another `litecdc pipeline run` of owner 'default' is running on the "
            f"metadata store SQLite {tmp_path / 'meta.db'} (pid "
        ), result.output
    # (another owner's run goes ahead: test_metadata.py's test_one_run_per_owner)


def test_a_run_that_loses_its_owner_claim_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run asks every CLAIM_CHECK_INTERVAL whether it still holds its owner (PostgreSQL
    drops the lock with its connection); lost to another run, it stops with the reason.
    (No subscriptions: the run never touches Spark, so none is started.)"""
    from litecdc.errors import MetadataError
    from litecdc.pipeline import server as server_module
    from litecdc.pipeline.metadata import MetadataStore, sqlite_url
    from litecdc.pipeline.server import PipelineServer

    monkeypatch.setattr(server_module, "CLAIM_CHECK_INTERVAL", 0.0)
    with MetadataStore.open(sqlite_url(tmp_path / "meta.db"), owner="a") as meta:
        meta.claim_owner()
        checks: list[bool] = []

        def lost() -> None:
            checks.append(True)
            if len(checks) == 3:
                raise MetadataError("another `litecdc pipeline run` of owner 'a' (injected)")

        monkeypatch.setattr(meta, "check_owner_claim", lost)
        server = PipelineServer(meta, None, owner="a", poll_interval=0.05)  # type: ignore[arg-type]
        with pytest.raises(MetadataError, match="injected"):
            server.run()
        assert len(checks) == 3


def test_verify_reads_the_source_at_least_as_far_as_the_mirror_applied(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """Pipeline QA: verify read a follower restarted behind the mirror and reported
    50,517 false differences. The source is read with min_cid = the cid the mirror
    applied through: here the mirror says it applied past the node's head, so the node
    refuses instead of answering rows older than the mirror's (this standalone node at
    once, 409: no wait brings a cid it never wrote; a cluster follower behind waits its
    10 s, then 503 — tests/system/test_cluster_source.py)."""
    from litecdc.errors import SourceError
    from litecdc.pipeline.verify import verify

    with node.client() as c:
        execute(c, ["CREATE TABLE vt(id INTEGER PRIMARY KEY, v TEXT)"])
    url = f"delta:{tmp_path}/vt"
    control.subscribe(store, name="vt", sources=node.url, table="vt", sink=url)
    head = SourceClient([node.url]).table_info("vt").last_cid
    _mirror_applied_through(node, url, "vt", head + 5)
    with pytest.raises(
        SourceError, match=rf"min_cid {head + 5} is beyond this node's history.*HTTP 409"
    ):
        verify(store.get_subscription("vt"))


def _mirror_applied_through(node: Node, url: str, name: str, cid: int, **attrs: Any) -> None:
    """Record in the mirror at ``url`` that subscription ``name`` applied through ``cid``
    (an empty batch), its sink's ``attrs`` set first."""
    from litecdc.pipeline.sinks.base import ChangeBatch
    from litecdc.pipeline.sinks.registry import open_sink

    spec = SourceClient([node.url]).table_spec(name)
    sink = open_sink(url, spec, name)
    for key, value in attrs.items():
        setattr(sink, key, value)
    try:
        sink.write_changes(spec.change_schema().empty_table(), ChangeBatch(name, 0, cid))
    finally:
        sink.close()


def test_verify_refuses_a_log_sink_as_such_whatever_its_source_table_became(
    node: Node, store: MetadataStore
) -> None:
    """Review: the check that the mirror can be compared came first, so a message sink's
    subscription whose table gained a column got exit 1 ("not taken yet"), not the exit 2
    of a sink that keeps no rows."""
    from litecdc.errors import ConfigError
    from litecdc.pipeline.tables import TableSpec
    from litecdc.pipeline.verify import verify

    with node.client() as c:
        execute(c, ["CREATE TABLE vl(id INTEGER PRIMARY KEY, v TEXT, w TEXT)"])
    control.subscribe(store, name="vl", sources=node.url, table="vl", sink="nats://127.0.0.1:9")
    spec = SourceClient([node.url]).table_spec("vl")
    narrower = TableSpec(spec.name, spec.columns[:2], spec.key)
    with pytest.raises(ConfigError, match="sends change events and keeps no rows"):
        verify(store.get_subscription("vl"), mirrored=narrower)
    with node.client() as c:  # (retest QA: asked first, the source said "no table": exit 1)
        execute(c, ["DROP TABLE vl"])
    with pytest.raises(ConfigError, match="sends change events and keeps no rows"):
        verify(store.get_subscription("vl"))


def test_verify_reads_a_registered_delta_mirrors_applied_cid_and_creates_nothing(
    node: Node, store: MetadataStore, tmp_path: Path
) -> None:
    """Upgrade QA: verify opened the sink without its registration, so a Delta mirror's
    applied cid (recorded under the registration's app id) read 0 and the source was read
    without min_cid; and reading it prepared the table — verify made a Delta table where
    none was."""
    from litecdc.errors import SinkError, SourceError
    from litecdc.pipeline.sinks.base import registration_of
    from litecdc.pipeline.verify import verify_subscription

    with node.client() as c:
        execute(c, ["CREATE TABLE vr(id INTEGER PRIMARY KEY, v TEXT)"])
    lake = tmp_path / "vr"
    control.subscribe(store, name="vr", sources=node.url, table="vr", sink=f"delta:{lake}")
    with pytest.raises(SinkError, match=r"there is no Delta table at .* yet"):
        verify_subscription(store, "vr")
    assert not lake.exists()  # left as it was

    head = SourceClient([node.url]).table_info("vr").last_cid
    store.start_register("vr", head)  # as `pipeline run` records its registration
    registration = registration_of(store.get_subscription("vr"), head)
    _mirror_applied_through(node, f"delta:{lake}", "vr", head + 5, registration=registration)
    with pytest.raises(
        SourceError, match=rf"min_cid {head + 5} is beyond this node's history.*HTTP 409"
    ):
        verify_subscription(store, "vr")


def test_run_until_caught_up_stopped_first_does_not_say_it_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a `run --until-caught-up` stopped by SIGTERM or Ctrl-C before it caught up
    printed "every subscription has caught up" and exited 0, to the script waiting on it.
    (The run is stood in for: what is tested is what the command makes of its end.)"""
    from click.testing import CliRunner

    from litecdc.cli import cli
    from litecdc.pipeline import server as server_module
    from litecdc.pipeline import spark as spark_module

    meta = sqlite_url(tmp_path / "meta.db")
    MetadataStore.open(meta).close()
    monkeypatch.setattr(spark_module, "spark_session", lambda *a, **k: None)
    monkeypatch.setattr("faulthandler.enable", lambda **k: None)  # (no file descriptor here)
    monkeypatch.setattr("signal.signal", lambda *a: None)  # (pytest's own handlers stay)
    # (CI: run's logging set-up left httpx's logger at WARNING for the later tests)
    monkeypatch.setattr("litecdc.pipeline.cli._configure_logging", lambda: None)
    monkeypatch.setattr(server_module.PipelineServer, "close", lambda self: None)

    def stopped(self: Any, *, until_caught_up: bool = False) -> int:
        self.caught_up = False  # (as run() records it when stop() ended it)
        return 0

    def caught_up(self: Any, *, until_caught_up: bool = False) -> int:
        self.caught_up = True
        return 0

    args = ["pipeline", "run", "--until-caught-up", "--quiet", "--meta", meta]
    monkeypatch.setattr(server_module.PipelineServer, "run", stopped)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert "error: stopped before every subscription had caught up" in result.output
    assert "every subscription has caught up" not in result.output
    monkeypatch.setattr(server_module.PipelineServer, "run", caught_up)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "every subscription has caught up" in result.output
