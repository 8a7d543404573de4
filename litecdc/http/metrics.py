"""``GET /metrics``: the node's figures in Prometheus' text format.

A custom collector reads the store's and the CDC service's status on every scrape, so
there is no second set of counters to keep in step. Each app has its own registry.
"""

from __future__ import annotations

from collections.abc import Iterator

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


class _NodeCollector(Collector):
    def __init__(self, store: Store, cdc: CDCService | None) -> None:
        self._store = store
        self._cdc = cdc

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


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


class NodeMetrics:
    def __init__(self, store: Store, cdc: CDCService | None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_NodeCollector(store, cdc))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
