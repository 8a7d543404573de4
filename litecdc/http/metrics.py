"""``GET /metrics``: the node's figures in Prometheus' text format.

A custom collector reads the store's and the CDC service's status on every scrape, so
there is no second set of counters to keep in step. Each app has its own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from litecdc.cdc.service import CDCService
from litecdc.store import Store

#: CDC status counter key -> (metric name without _total, help)
_CDC_COUNTERS = {
    "sent_events": ("litecdc_cdc_sent_events", "Row events delivered to the endpoint"),
    "sent_batches": ("litecdc_cdc_sent_batches", "Batches delivered to the endpoint"),
    "retries": ("litecdc_cdc_retries", "Delivery attempts that were retried"),
    "failed_requests": ("litecdc_cdc_failed_requests", "Delivery attempts that failed"),
    "dropped_events": ("litecdc_cdc_dropped_events", "Row events dropped after the last retry"),
    "dropped_batches": ("litecdc_cdc_dropped_batches", "Batches dropped after the last retry"),
    "skipped_events": ("litecdc_cdc_skipped_events", "Row events left out by table_filter"),
    "reader_errors": ("litecdc_cdc_reader_errors", "CDC reader failures outside a request"),
    "pruned_unsent_cids": (
        "litecdc_cdc_pruned_unsent_cids",
        "Commits whose changes were pruned before the webhook sent them",
    ),
}


#: cluster status "log" counter key -> (metric name without _total, help)
_CLUSTER_COUNTERS = {
    "entries_applied": ("litecdc_cluster_entries_applied", "Log entries applied here"),
    "entries_skipped": (
        "litecdc_cluster_entries_skipped",
        "Log entries skipped: the journal already had them",
    ),
    "append_txns": ("litecdc_cluster_append_txns", "etcd transactions appending to the log"),
    "entries_appended": ("litecdc_cluster_entries_appended", "Log entries this node appended"),
    "appends_fenced": (
        "litecdc_cluster_appends_fenced",
        "Appends refused because this node no longer led",
    ),
    "catch_up_log_reads": (
        "litecdc_cluster_catch_up_log_reads",
        "Catch-ups by reading the log's keys (a compaction passed the watch)",
    ),
    "snapshots_installed": (
        "litecdc_cluster_snapshots_installed",
        "Snapshots of the cluster's data installed here",
    ),
    "compactions": ("litecdc_cluster_compactions", "etcd log compactions run by this node"),
    "keys_compacted": ("litecdc_cluster_keys_compacted", "Log keys deleted by compactions"),
    "etcd_defragmentations": (
        "litecdc_cluster_etcd_defragmentations",
        "etcd defragmentations run by this node",
    ),
}


class _NodeCollector(Collector):
    def __init__(
        self,
        store: Store,
        cdc: CDCService | None,
        cluster_status: Callable[[], dict[str, object]] | None,
    ) -> None:
        self._store = store
        self._cdc = cdc
        self._cluster_status = cluster_status

    def collect(self) -> Iterator[Metric]:
        status = self._store.status()
        yield GaugeMetricFamily(
            "litecdc_last_cid", "Largest cid in the journal", value=status.last_cid
        )
        yield GaugeMetricFamily(
            "litecdc_available_snapshot",
            "End of the unbroken run of journal cids",
            value=status.available_snapshot,
        )
        yield GaugeMetricFamily(
            "litecdc_changes_queued", "Captured row changes stored", value=status.changes_queued
        )
        yield GaugeMetricFamily(
            "litecdc_db_size_bytes", "SQLite file and WAL size", value=status.db_size_bytes
        )
        if self._cluster_status is not None:
            yield from _cluster_metrics(self._cluster_status())
        if self._cdc is None:
            return
        cdc = self._cdc.status()
        yield GaugeMetricFamily(
            "litecdc_cdc_is_leader",
            "1 when this node sends CDC events",
            value=1 if cdc["is_leader"] else 0,
        )
        yield GaugeMetricFamily(
            "litecdc_cdc_hwm", "Highest cid delivered (high watermark)", value=_number(cdc["hwm"])
        )
        yield GaugeMetricFamily(
            "litecdc_cdc_queue_length",
            "Row events waiting in the queue",
            value=_number(cdc["queue_length"]),
        )
        for key, (name, help_text) in _CDC_COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=_number(cdc[key]))


def _cluster_metrics(status: dict[str, object]) -> Iterator[Metric]:
    """A cluster node's health and log figures (its /status "cluster" section), read in
    memory: what to alert on — no leader, etcd silent, the apply loop stopped."""

    def flag(name: str, help_text: str, on: bool) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, help_text, value=1 if on else 0)

    yield flag(
        "litecdc_cluster_is_leader",
        "1 while this node leads the cluster and accepts writes",
        bool(status.get("is_leader")),
    )
    yield flag(
        "litecdc_cluster_leader_known",
        "1 while this node knows a leader (itself or another node)",
        status.get("leader") is not None,
    )
    yield flag(
        "litecdc_cluster_etcd_reachable",
        "0 once no listed etcd member has answered this node's latest requests",
        not status.get("etcd_error"),
    )
    yield flag(
        "litecdc_cluster_applying",
        "0 when the apply loop cannot keep this node's data the cluster's (diverged, "
        "stopped on an entry): /status cluster.apply_error says why",
        not status.get("apply_error"),
    )
    yield flag(
        "litecdc_cluster_needs_snapshot",
        "1 while this node waits for a snapshot of the cluster's data",
        bool(status.get("needs_snapshot")),
    )
    yield GaugeMetricFamily(
        "litecdc_cluster_applied_revision",
        "etcd revision of the last log entry applied here",
        value=_number(status.get("applied_revision")),
    )
    log_figures = status.get("log")
    figures = log_figures if isinstance(log_figures, dict) else {}
    yield GaugeMetricFamily(
        "litecdc_cluster_compacted_revision",
        "etcd revision this node's last log compaction reached",
        value=_number(figures.get("compacted_revision")),
    )
    for key, (name, help_text) in _CLUSTER_COUNTERS.items():
        yield CounterMetricFamily(name, help_text, value=_number(figures.get(key)))


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


class NodeMetrics:
    def __init__(
        self,
        store: Store,
        cdc: CDCService | None,
        cluster_status: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(store, cdc, cluster_status))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
