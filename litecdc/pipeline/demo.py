"""The pipeline half of ``make run``: a running node's table mirrored by Spark into a
Delta Lake table and a PostgreSQL table, both checked exact with ``verify``.

It starts a throwaway PostgreSQL server (Debian's binaries, ``litecdc.localservers``),
adds two subscriptions, runs the pipeline server until it has caught up (the initial
snapshot), applies a burst of changes at the source (updates, deletes, key changes, a
new column), runs it again (the incremental change log) and verifies both copies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from litecdc.localservers import PostgreSQLServer
from litecdc.pipeline.control import subscribe
from litecdc.pipeline.metadata import MetadataStore, sqlite_url
from litecdc.pipeline.server import PipelineServer, SubscriptionState
from litecdc.pipeline.spark import spark_session
from litecdc.pipeline.verify import verify_subscription

Echo = Callable[[str], None]

BULK_ROWS = 20_000
BULK_BATCH = 2_000

CHANGES: list[tuple[str, list[Any]]] = [
    (
        "a price change for every 3rd order",
        ["UPDATE orders SET amount = amount + 1 WHERE id % 3 = 0"],
    ),
    ("cancel every 5th order", ["DELETE FROM orders WHERE id % 5 = 0"]),
    (
        "renumber every 7th order (a key change)",
        ["UPDATE orders SET id = id + 1000000 WHERE id % 7 = 0"],
    ),
    (
        "new orders with NULLs, unicode and extreme floats",
        [
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "zoë 😀", None],
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "max", 1e308],
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "tiny", 5e-324],
        ],
    ),
    ("a new column (the sinks add it)", ["ALTER TABLE orders ADD COLUMN status TEXT"]),
    ("ship some orders", ["UPDATE orders SET status = 'shipped' WHERE id % 11 = 0"]),
]


def run_pipeline_demo(echo: Echo, base: str, work_dir: Path) -> tuple[int, int]:
    """Mirror ``orders`` at ``base``; returns (differences found, row events written)."""
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=base, timeout=60))
        events = _bulk_load(echo, client)

        echo("\nstarting a throwaway PostgreSQL server (Debian's binaries)")
        pg = stack.enter_context(PostgreSQLServer())
        pg_url = pg.create_database("mirror")
        lake = work_dir / "lake" / "orders"
        meta_url = sqlite_url(work_dir / "litecdc-pipeline.db")
        store = MetadataStore.open(meta_url)
        stack.callback(store.close)
        echo(f"\n$ litecdc pipeline subscribe --meta {meta_url} --source {base} --table orders \\")
        echo(f"      --name orders-lake --sink delta:{lake}")
        subscribe(store, name="orders-lake", sources=base, table="orders", sink=f"delta:{lake}")
        echo("$ litecdc pipeline subscribe … --name orders-pg --sink postgresql://…/mirror")
        subscribe(store, name="orders-pg", sources=base, table="orders", sink=pg_url)

        echo("\nstarting Spark (local[2]) for the pipeline server")
        spark = spark_session("local[2]")
        stack.callback(spark.stop)
        echo("$ litecdc pipeline run --until-caught-up    # the initial snapshot")
        _run(echo, store, spark)

        echo("\nchanges at the source while nobody watches:")
        for title, statements in CHANGES:
            response = client.post("/db/execute", params={"transaction": ""}, json=statements)
            response.raise_for_status()
            results = response.json()["results"]
            failed = [r["error"] for r in results if "error" in r]
            if failed:
                raise RuntimeError(f"demo change {title!r} failed: {failed[0]}")
            events += sum(int(r.get("rows_affected", 0)) for r in results)
            echo(f"  {title}: {sum(int(r.get('rows_affected', 0)) for r in results)} row(s)")

        echo("\n$ litecdc pipeline run --until-caught-up    # the incremental change log")
        _run(echo, store, spark)

        differences = 0
        for name in ("orders-lake", "orders-pg"):
            report = verify_subscription(store, name)
            echo(
                f"$ litecdc pipeline verify {name}: source {report.source_rows} rows, sink "
                f"{report.sink_rows} rows, {report.total_differences} difference(s)"
            )
            for difference in report.differences:
                echo(f"    {difference.describe()}")
            differences += report.total_differences
        return differences, events


def _bulk_load(echo: Echo, client: httpx.Client) -> int:
    echo(f"\nloading {BULK_ROWS:,} more orders ({BULK_ROWS // BULK_BATCH} transactions)")
    for start in range(0, BULK_ROWS, BULK_BATCH):
        statements = [
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", f"customer{i}", i * 0.25]
            for i in range(start, start + BULK_BATCH)
        ]
        client.post("/db/execute", params={"transaction": ""}, json=statements).raise_for_status()
    return BULK_ROWS


def _run(echo: Echo, store: MetadataStore, spark: Any) -> None:
    seen: dict[str, str] = {}

    def progress(state: SubscriptionState) -> None:
        line = f"  {state.name}: {state.stage}"
        if state.stage == "snapshot":
            line += f", {state.snapshot_rows:,}/{state.snapshot_total:,} rows"
        elif state.stage == "incremental":
            line += f", applied through cid {state.applied_cid} (source at {state.source_cid})"
        if state.last_error:
            line += f" — error: {state.last_error}"
        if seen.get(state.name) != line:
            seen[state.name] = line
            echo(line)

    server = PipelineServer(store, spark, poll_interval=0.2, on_progress=progress)
    failing = server.run(until_caught_up=True)
    if failing:
        raise RuntimeError(f"{failing} subscription(s) failed; see the lines above")
