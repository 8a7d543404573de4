"""The Spark pipeline end to end, as a user runs it: a real ``litecdc serve`` node, the
``litecdc pipeline`` CLI as subprocesses (subscribe, run, verify, status, unsubscribe)
and real sinks (Delta Lake, PostgreSQL, MariaDB).

- snapshot while a writer keeps writing, then a scripted burst of incremental changes
  (PK changes, NULLs, blobs, floats, a big transaction, an added column): every mirror
  is exact (``verify`` exits 0), for an INTEGER-key, a composite-key WITHOUT ROWID and a
  rowid table; unsubscribe releases the node's hold;
- ``kill -9`` of ``pipeline run`` mid-snapshot and mid-stream, restart: still exact;
- a subscriber that fell past the node's retention cap re-snapshots and converges;
- two owners share a PostgreSQL metadata store without running each other's work;
- bad input to ``subscribe`` fails with one ``error:`` line and adds nothing.

Each ``pipeline run`` costs ~8 s of Spark start-up here, so the tests keep them few.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e.litecdc_node import Node, free_port
from pipeline_proc import MASTER, PipelineCLI, Writer, execute, scalar

from litecdc.pipeline.metadata import MetadataStore, sqlite_url

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# -- the every-type table ------------------------------------------------------------------
ORDERS_DDL = (
    "CREATE TABLE {t} (id INTEGER PRIMARY KEY, name TEXT, price REAL, qty INTEGER, "
    "payload BLOB, note TEXT)"
)
FLOATS = [-0.0, 0.0, 1e308, -1e308, 0.1, 5e-324, 2.2250738585072014e-308, 1 / 3, None, 2.5]
INTS = [0, 1, -1, 2**62, -(2**62), 2**31, -(2**31) - 1, None, 42]
TEXTS = ["", "héllo wörld", "日本語テキスト", "emoji 🎉🚀 𝄞", "quote ' \" \\", "tab\tline\n", None]
BLOBS = [b"", bytes(range(256)), b"\x00\xff" * 10, None, b"'; DROP TABLE x; --"]


def order_row(i: int) -> list[Any]:
    text = TEXTS[i % len(TEXTS)]
    return [
        i,
        None if text is None else f"{text} #{i}",
        FLOATS[i % len(FLOATS)],
        INTS[i % len(INTS)],
        BLOBS[i % len(BLOBS)],
        None if i % 3 else TEXTS[(i // 3) % len(TEXTS)],
    ]


def load(client: httpx.Client, table: str, rows: Iterator[list[Any]] | list[list[Any]]) -> None:
    """Insert rows in transactions of 2,000."""
    batch: list[list[Any]] = []
    for row in rows:
        batch.append([f"INSERT INTO {table} VALUES({', '.join('?' for _ in row)})", *row])
        if len(batch) == 2000:
            execute(client, batch)
            batch = []
    if batch:
        execute(client, batch)


def create_orders(client: httpx.Client, table: str, n: int) -> None:
    execute(client, [ORDERS_DDL.format(t=table)])
    load(client, table, (order_row(i) for i in range(1, n + 1)))


def changes_burst(client: httpx.Client, table: str, *, base: int) -> None:
    """Inserts, updates, deletes, key changes, NULLs, blobs, floats and one big
    transaction on an orders table whose ids are 1..~base."""
    rng = random.Random(base)
    t = table
    # one big transaction: many inserts, a wide update and deletes in one commit
    execute(
        client,
        [
            *[
                [f"INSERT INTO {t} VALUES(?, ?, ?, ?, ?, ?)", *order_row(i)]
                for i in range(base * 10, base * 10 + 3000)
            ],
            f"UPDATE {t} SET qty = coalesce(qty, 0) + 1, note = 'bulk ✓' WHERE id % 7 = 0",
            f"DELETE FROM {t} WHERE id % 11 = 0 AND id < {base // 2}",
        ],
    )
    # primary-key changes (a delete of the old key and an insert of the new one)
    execute(client, [f"UPDATE {t} SET id = id + 1000000 WHERE id % 13 = 0 AND id < {base}"])
    # NULLs in every nullable column
    execute(client, [f"UPDATE {t} SET name = NULL, price = NULL, qty = NULL, payload = NULL, "
                     f"note = NULL WHERE id % 17 = 0"])  # fmt: skip
    # blobs and floats, one row per commit
    for k, value in enumerate([*BLOBS, bytes(rng.randrange(256) for _ in range(4096))]):
        execute(client, [[f"UPDATE {t} SET payload = ? WHERE id = ?", value, 100 + k]])
    for k, value in enumerate(FLOATS):
        execute(client, [[f"UPDATE {t} SET price = ? WHERE id = ?", value, 200 + k]])
    execute(client, [[f"UPDATE {t} SET qty = ? WHERE id = ?", 2**62, 301],
                     [f"UPDATE {t} SET qty = ? WHERE id = ?", -(2**62), 302]])  # fmt: skip
    # a row deleted and inserted again, a row updated twice, in one transaction
    execute(
        client,
        [
            f"DELETE FROM {t} WHERE id = 5",
            [f"INSERT INTO {t} VALUES(?, ?, ?, ?, ?, ?)", 5, "back again", -0.0, 5, b"\x05", None],
            f"UPDATE {t} SET name = 'first' WHERE id = 6",
            f"UPDATE {t} SET name = 'second ✓' WHERE id = 6",
        ],
    )
    # small single-row commits of every kind
    for i in range(40):
        execute(client, [[f"INSERT INTO {t} VALUES(?, ?, ?, ?, ?, ?)", *order_row(base * 20 + i)]])
        execute(client, [[f"UPDATE {t} SET note = ? WHERE id = ?", f"n{i} ünï", 1000 + i]])
        execute(client, [[f"DELETE FROM {t} WHERE id = ?", 2000 + i]])


# -- 1 and 3: snapshot under writes, incremental, every sink; unsubscribe ------------------
MAIN_ROWS = 30_000


@dataclass
class Mirrored:
    cli: PipelineCLI
    node: Node
    runs: list[str]  # stderr of each `run`
    writer_commits: int


@pytest.fixture(scope="module")
def mirrored(
    node: Node,
    tmp_path_factory: pytest.TempPathFactory,
    postgresql_server: Any,
    mariadb_server: Any,
) -> Iterator[Mirrored]:
    """A node's ``orders`` (every type), ``lines`` (composite key, WITHOUT ROWID) and
    ``events`` (rowid, no key) mirrored through two ``pipeline run --until-caught-up``: the
    first snapshots while a writer writes, the second applies a burst of changes."""
    work = tmp_path_factory.mktemp("mirror")
    pg_url = postgresql_server.create_database()
    my_url = mariadb_server.create_database()
    cli = PipelineCLI(sqlite_url(work / "meta.db"), work)
    with node.client() as c:
        create_orders(c, "orders", MAIN_ROWS)
        execute(c, ["CREATE TABLE lines (order_id INTEGER, sku TEXT, qty INTEGER, price REAL, "
                    "PRIMARY KEY (order_id, sku)) WITHOUT ROWID"])  # fmt: skip
        load(c, "lines", ([i // 3, f"sku-{i % 3}-ü", i, i / 7] for i in range(3000)))
        execute(c, ["CREATE TABLE events (kind TEXT, body BLOB, n INTEGER)"])
        load(c, "events", ([f"kind {i % 5}", bytes([i % 256]) * (i % 9), i] for i in range(3000)))
    src = node.url
    small = ("--page-rows", "8000")  # several snapshot rounds for the writer to overlap
    cli.subscribe("orders-delta", src, "orders", f"delta:{work / 'lake' / 'orders'}", *small)
    cli.subscribe("orders-pg", src, "orders", f"{pg_url}?table=orders_mirror", *small)
    cli.subscribe("orders-maria", src, "orders", f"{my_url}?table=orders_mirror", *small)
    cli.subscribe("lines-delta", src, "lines", f"delta:{work / 'lake' / 'lines'}")
    cli.subscribe("events-delta", src, "events", f"delta:{work / 'lake' / 'events'}")

    writer = Writer(node, "orders", order_row, range(1, MAIN_ROWS + 1), range(500_000, 600_000))
    writer.start()
    try:
        first = cli.run_until_caught_up()
    finally:
        commits = writer.stop()
    assert commits > 0

    with node.client() as c:
        changes_burst(c, "orders", base=MAIN_ROWS)
        execute(c, ["UPDATE lines SET sku = sku || '-moved' WHERE order_id % 10 = 0",
                    "DELETE FROM lines WHERE order_id % 7 = 0",
                    "UPDATE lines SET price = NULL, qty = -0 WHERE order_id % 5 = 1",
                    "INSERT INTO lines VALUES(5000, '', NULL, -0.0)"])  # fmt: skip
        execute(c, ["DELETE FROM events WHERE n % 4 = 0",
                    "UPDATE events SET body = NULL, kind = 'ü' WHERE n % 6 = 1",
                    "INSERT INTO events VALUES('new', x'00ff', 99999)"])  # fmt: skip
        # a column added at the source: every mirror follows it
        execute(c, ["ALTER TABLE orders ADD COLUMN extra TEXT",
                    "UPDATE orders SET extra = 'added ✓' WHERE id % 9 = 0"])  # fmt: skip
        execute(c, [["INSERT INTO orders VALUES(?, ?, ?, ?, ?, ?, ?)", 3_000_000, "after alter",
                     0.1, 1, b"\x01", None, "x"]])  # fmt: skip
    second = cli.run_until_caught_up()
    yield Mirrored(cli, node, [first.stderr, second.stderr], commits)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", ["orders-delta", "orders-pg", "orders-maria"])
def test_snapshot_under_writes_then_changes_mirror_exactly(mirrored: Mirrored, name: str) -> None:
    out = mirrored.cli.assert_verified(name)
    with mirrored.node.client() as c:
        rows = scalar(c, "SELECT count(*) FROM orders")
    assert f"source {rows} rows" in out and f"sink {rows} rows" in out, out
    # the first run did snapshot while the writer wrote; the second did not re-snapshot
    assert "snapshot done" in mirrored.runs[0]
    assert "registered at" not in mirrored.runs[1], mirrored.runs[1][-3000:]


@pytest.mark.parametrize("name", ["lines-delta", "events-delta"])
def test_composite_key_and_rowid_tables_mirror_exactly(mirrored: Mirrored, name: str) -> None:
    mirrored.cli.assert_verified(name)


def _holds(node: Node) -> dict[str, dict[str, Any]]:
    with node.client() as c:
        r = c.get("/cdc/subscriptions")
    assert r.status_code == 200, r.text
    return {h["name"]: h for h in r.json()["subscriptions"]}


def test_unsubscribe_releases_the_hold(mirrored: Mirrored) -> None:
    cli, node = mirrored.cli, mirrored.node
    before = _holds(node)
    for name in ("orders-delta", "orders-pg", "orders-maria", "lines-delta", "events-delta"):
        assert name in before, before
    out = cli.ok("unsubscribe", "events-delta")
    assert "hold on the source is released" in out, out
    after = _holds(node)
    assert "events-delta" not in after, after
    assert "orders-delta" in after, after
    assert "events-delta" not in cli.ok("list")


# -- 2: kill -9 mid-snapshot and mid-stream -------------------------------------------------
KILL_ROWS = 100_000


def _head(node: Node) -> int:
    with node.client() as c:
        r = c.get("/cdc/subscriptions")
    assert r.status_code == 200, r.text
    return int(r.json()["last_cid"])


@pytest.mark.timeout(600)
def test_kill_9_mid_snapshot_and_mid_stream_then_restart_converges(
    node: Node, tmp_path: Path, postgresql_db_url: str
) -> None:
    cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path)
    with node.client() as c:
        create_orders(c, "big", KILL_ROWS)
    names = ["big-delta", "big-pg"]
    small = ("--page-rows", "20000", "--partitions", "2", "--max-events", "800")
    cli.subscribe("big-delta", node.url, "big", f"delta:{tmp_path / 'lake' / 'big'}", *small)
    cli.subscribe("big-pg", node.url, "big", f"{postgresql_db_url}?table=big", *small)

    # mid-snapshot: some ranges have copied rows, not all are done
    def mid_snapshot() -> bool:
        progress = [cli.progress(n) for n in names]
        return all(p.stage == "snapshot" and p.rows_copied > 0 for p in progress) and not all(
            p.snapshot_done for p in progress
        )

    run = cli.start()
    try:
        run.wait_for(mid_snapshot, "the snapshot to be part done")
    finally:
        run.kill9()
    killed = {n: cli.progress(n) for n in names}
    assert any(0 < p.rows_copied < KILL_ROWS for p in killed.values()), killed
    status = cli.ok("status", "big-delta")
    assert "stage: snapshot" in status and "range(s) done" in status, status

    # restart (until killed again): it resumes the snapshot, catches up, and is exact
    run = cli.start()
    try:
        head = _head(node)

        def caught_up(after: int) -> bool:
            progress = [cli.progress(n) for n in names]
            return all(p.stage == "incremental" and (p.last_log_index or 0) >= after
                       for p in progress)  # fmt: skip

        run.wait_for(lambda: caught_up(head), "the restarted snapshot to catch up")
        assert "registered at" not in run.log(), "the restart registered again instead of resuming"
        for name in names:
            cli.assert_verified(name)
        # (the run just killed -9 let go of its owner; this one holds it) one run per owner:
        # two raced, each re-copying tables the other had moved past (pipeline QA)
        second = cli.call("run", "--master", MASTER, "--until-caught-up", "--quiet")
        refusal = second.stdout + second.stderr
        assert second.returncode == 1, refusal
        assert "another `litecdc pipeline run` of owner 'default' is running" in refusal, refusal

        # mid-stream: a backlog of 12 commits (~3,000 events each), micro-batches of at most
        # 800 events: one commit each (transactions are not split)
        first_commit = 0  # a cid at or after the backlog's first commit
        with node.client() as c:
            for k in range(12):
                execute(
                    c,
                    [
                        f"UPDATE big SET qty = coalesce(qty, 0) + {k}, note = 'pass {k} ✓' "
                        f"WHERE id % 40 = {k}",
                        f"DELETE FROM big WHERE id % 400 = {k} + 1",
                        f"UPDATE big SET id = id + 2000000 WHERE id % 1000 = {k} + 2",
                    ],
                )
                first_commit = first_commit or _head(node)
        target = _head(node)

        def mid_stream() -> bool:
            applied = [cli.progress(n).last_log_index or 0 for n in names]
            return all(a >= first_commit for a in applied) and any(a < target for a in applied)

        run.wait_for(mid_stream, "the backlog to be part applied")
    finally:
        run.kill9()
    applied = [cli.progress(n).last_log_index or 0 for n in names]
    assert any(a < target for a in applied), (applied, target)

    cli.run_until_caught_up()
    for name in names:
        cli.assert_verified(name)

    # SIGTERM ends a run cleanly: its stepping threads stop and it exits 0, nothing
    # recorded as failing — sent to the driver alone, and to the whole process group (as
    # `timeout`, `kill -TERM -PGID` and systemd's default stop send it: pipeline QA, the
    # JVM died at once, steps got none of their 10 s and py4j printed tracebacks); a
    # writer keeps steps running Spark jobs when the signal comes
    writer = Writer(node, "big", order_row, range(1, KILL_ROWS + 1), range(700_000, 800_000))
    writer.start()
    for whole_group in (False, True):
        run = cli.start()
        try:
            run.wait_for(lambda r=run: "incremental stage" in r.log(), "the run to be going")
            if whole_group:
                os.killpg(run.proc.pid, signal.SIGTERM)
            else:
                run.proc.send_signal(signal.SIGTERM)
            assert run.proc.wait(timeout=60) == 0, run.log()[-4000:]
            log = run.log()
            for noise in ("Traceback", "Py4J", "stopped mid-step", "Exception"):
                assert noise not in log, log[-4000:]
            _wait_for_group_gone(run.proc.pid)  # the JVM ends with its driver
        finally:
            run.kill9()  # (the JVM, were it left)
        assert "FAILING" not in cli.ok("status"), cli.ok("status")
    assert writer.stop() > 0


def _wait_for_group_gone(pgid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, f"process group {pgid} still running"
        time.sleep(0.2)


# -- 4: past the retention cap ------------------------------------------------------------
@pytest.mark.timeout(600)
def test_subscriber_past_the_retention_cap_resnapshots_and_converges(tmp_path: Path) -> None:
    capped = Node(tmp_path / "node", "--retention-cids", "20").start()
    try:
        cli = PipelineCLI(sqlite_url(tmp_path / "meta.db"), tmp_path / "work")
        with capped.client() as c:
            create_orders(c, "capped", 3000)
        cli.subscribe("capped", capped.url, "capped", f"delta:{tmp_path / 'lake'}")
        cli.run_until_caught_up()
        cli.assert_verified("capped")

        # more than 20 commits behind, deletes among them (only the sweep can remove those)
        with capped.client() as c:
            for k in range(30):
                execute(c, [["DELETE FROM capped WHERE id % 30 = ?", k],
                            ["UPDATE capped SET name = ? WHERE id % 31 = ?", f"gap {k}", k],
                            ["INSERT INTO capped VALUES(?, ?, ?, ?, ?, ?)",
                             *order_row(10_000 + k)]])  # fmt: skip
            # the node's retention keeper (every 5 s) expires the hold
            deadline = time.monotonic() + 30
            while not _holds(capped)["capped"]["expired"]:
                assert time.monotonic() < deadline, _holds(capped)
                time.sleep(0.2)

        done = cli.run_until_caught_up()
        assert "re-snapshotting" in done.stderr, done.stderr[-4000:]
        cli.assert_verified("capped")
    finally:
        capped.stop()


# -- 5: two owners, one PostgreSQL metadata store -----------------------------------------
@pytest.mark.timeout(600)
def test_two_owners_share_a_postgresql_metadata_store(
    node: Node, tmp_path: Path, postgresql_db_url: str
) -> None:
    cli = PipelineCLI(postgresql_db_url, tmp_path)
    with node.client() as c:
        for table in ("owned_a", "owned_b"):
            create_orders(c, table, 1000)
    lake_a, lake_b = tmp_path / "lake-a", tmp_path / "lake-b"
    cli.subscribe("sub-a", node.url, "owned_a", f"delta:{lake_a}", "--owner", "a")
    cli.subscribe("sub-b", node.url, "owned_b", f"delta:{lake_b}", "--owner", "b")

    done = cli.run_until_caught_up("--owner", "a")
    assert "sub-b" not in done.stderr, done.stderr[-4000:]
    cli.assert_verified("sub-a")
    assert not lake_b.exists(), "owner a's server touched owner b's sink"
    untouched = cli.progress("sub-b")
    assert untouched.stage is None and not untouched.ranges, untouched
    assert "sub-b" not in _holds(node)
    applied_a = cli.progress("sub-a").last_log_index

    done = cli.run_until_caught_up("--owner", "b")
    assert "sub-a" not in done.stderr, done.stderr[-4000:]
    cli.assert_verified("sub-b")
    assert cli.progress("sub-a").last_log_index == applied_a
    listing = cli.ok("list")
    assert "sub-a" in listing and "owner a" in listing and "owner b" in listing, listing


# -- 6: bad input -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case",
    [
        "unreachable source",
        "unknown table",
        "unknown sink scheme",
        "delta sink without a path",
        "unknown metadata URL",
        "unreachable metadata store",
    ],
)
def test_bad_subscribe_fails_with_one_error_line_and_adds_nothing(
    node: Node, tmp_path: Path, case: str
) -> None:
    meta = sqlite_url(tmp_path / "meta.db")
    MetadataStore.open(meta).close()  # the store `list` reads below (a subscribe's own)
    cli = PipelineCLI(meta, tmp_path)
    closed_port = str(free_port())
    lake = f"delta:{tmp_path / 'lake'}"
    with node.client() as c:
        execute(c, ["CREATE TABLE IF NOT EXISTS badin (id INTEGER PRIMARY KEY, v TEXT)"])
    # metadata URL, source, table, sink, what the error must name
    store, source, table, sink, named = {
        "unreachable source": (meta, f"http://127.0.0.1:{closed_port}", "badin", lake, closed_port),
        "unknown table": (meta, node.url, "no_such_table", lake, "no_such_table"),
        "unknown sink scheme": (meta, node.url, "badin", "nosuch://x", "nosuch"),
        "delta sink without a path": (meta, node.url, "badin", "delta:", "delta"),
        "unknown metadata URL": ("mongodb://x/y", node.url, "badin", lake, "mongodb"),
        "unreachable metadata store": (
            f"postgresql://postgres@127.0.0.1:{closed_port}/x", node.url, "badin", lake,
            closed_port,
        ),
    }[case]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "litecdc", "pipeline", "subscribe", "--meta", store,
         "--source", source, "--table", table, "--name", "bad", "--sink", sink],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "bad" not in _holds(node)
    assert cli.ok("list").strip() == "no subscriptions"
    assert not (tmp_path / "litecdc-pipeline.db").exists()
    assert done.returncode in (1, 2), done
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert named in lines[0], done.stderr
