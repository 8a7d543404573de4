"""`pipeline run --metrics-port`: lag, applied cid and failures per subscription, served
for Prometheus."""

from __future__ import annotations

import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from litecdc.localservers import free_port
from litecdc.pipeline.metrics import PipelineMetrics
from litecdc.pipeline.server import SubscriptionState


def _samples(text: str) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("subscription", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_report_lag_and_failures_per_subscription() -> None:
    metrics = PipelineMetrics()
    behind = SubscriptionState(
        "orders-lake", stage="incremental", applied_cid=40, source_cid=55,
        behind_since=time.monotonic() - 3.0,
    )  # fmt: skip
    failing = SubscriptionState("orders-pg", applied_cid=7, source_cid=7, last_error="down")
    metrics.observe(behind)
    metrics.observe(failing)
    metrics.snapshot_rows("orders-lake", 1000)
    metrics.events_applied("orders-lake", 250)
    port = free_port()
    metrics.serve(port)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    got = _samples(text)
    assert got[("litecdc_pipeline_lag_cids", "orders-lake")] == 15
    assert got[("litecdc_pipeline_lag_seconds", "orders-lake")] >= 3.0
    assert got[("litecdc_pipeline_applied_cid", "orders-lake")] == 40
    assert got[("litecdc_pipeline_failing", "orders-lake")] == 0
    assert got[("litecdc_pipeline_failing", "orders-pg")] == 1
    assert got[("litecdc_pipeline_lag_cids", "orders-pg")] == 0
    assert got[("litecdc_pipeline_lag_seconds", "orders-pg")] == 0
    assert got[("litecdc_pipeline_snapshot_rows_total", "orders-lake")] == 1000
    assert got[("litecdc_pipeline_events_applied_total", "orders-lake")] == 250
    # counters from 0 for one that wrote nothing in this process (docs QA: missing)
    assert got[("litecdc_pipeline_snapshot_rows_total", "orders-pg")] == 0
    assert got[("litecdc_pipeline_events_applied_total", "orders-pg")] == 0


def test_lag_seconds_is_read_when_scraped_and_a_gone_subscription_leaves() -> None:
    """Ops QA: lag_seconds was set at each step, so a failing subscription's climbed in
    steps of its retry back-off; an unsubscribed one's series stayed, frozen."""
    from prometheus_client import generate_latest

    metrics = PipelineMetrics()
    behind = SubscriptionState(
        "slow", applied_cid=1, source_cid=9, behind_since=time.monotonic() - 1.0
    )
    metrics.observe(behind)
    first = _samples(generate_latest(metrics.registry).decode())
    time.sleep(0.3)
    later = _samples(generate_latest(metrics.registry).decode())
    key = ("litecdc_pipeline_lag_seconds", "slow")
    assert later[key] >= first[key] + 0.25  # (no observe in between)
    metrics.events_applied("slow", 3)
    metrics.forget("slow")
    left = _samples(generate_latest(metrics.registry).decode())
    assert not [k for k in left if k[1] == "slow"], left
    metrics.forget("never-seen")  # (nothing to remove: no error)
