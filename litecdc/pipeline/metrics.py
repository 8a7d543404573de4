"""Prometheus figures of a pipeline server: lag, applied position, throughput."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

if TYPE_CHECKING:
    from litecdc.pipeline.server import SubscriptionState


class PipelineMetrics:
    """One registry per server (several servers can live in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        label = ["subscription"]
        self._lag_cids = Gauge(
            "litecdc_pipeline_lag_cids",
            "Source head cid minus the cid the sink has applied through",
            label,
            registry=self.registry,
        )
        self._lag_seconds = Gauge(
            "litecdc_pipeline_lag_seconds",
            "Seconds the subscription has been behind its source (0 when caught up)",
            label,
            registry=self.registry,
        )
        self._applied = Gauge(
            "litecdc_pipeline_applied_cid",
            "The cid the sink has applied the change log through",
            label,
            registry=self.registry,
        )
        self._failing = Gauge(
            "litecdc_pipeline_failing",
            "1 while the subscription's last attempt failed",
            label,
            registry=self.registry,
        )
        self._snapshot_rows = Counter(
            "litecdc_pipeline_snapshot_rows",
            "Snapshot rows written to the sink",
            label,
            registry=self.registry,
        )
        self._events = Counter(
            "litecdc_pipeline_events_applied",
            "Change events written to the sink",
            label,
            registry=self.registry,
        )

    def observe(self, state: SubscriptionState) -> None:
        self._lag_cids.labels(state.name).set(state.lag_cids)
        # read when scraped (ops QA: set at each step, it climbed in steps of the retry
        # back-off while a failing subscription fell behind)
        self._lag_seconds.labels(state.name).set_function(
            lambda: state.lag_seconds(time.monotonic())
        )
        self._applied.labels(state.name).set(state.applied_cid)
        self._failing.labels(state.name).set(1 if state.last_error else 0)
        # the counters too, from 0 (docs QA: snapshot rows were missing from /metrics
        # until a snapshot ran in this process; rate() needs the series from the start)
        self._snapshot_rows.labels(state.name)
        self._events.labels(state.name)

    def forget(self, name: str) -> None:
        """Subscription ``name`` is gone: its series go too (ops QA: an unsubscribed one's
        gauges stayed, frozen)."""
        for metric in (
            self._lag_cids, self._lag_seconds, self._applied, self._failing,
            self._snapshot_rows, self._events,
        ):  # fmt: skip
            with contextlib.suppress(KeyError):
                metric.remove(name)

    def snapshot_rows(self, name: str, rows: int) -> None:
        self._snapshot_rows.labels(name).inc(rows)

    def events_applied(self, name: str, events: int) -> None:
        self._events.labels(name).inc(events)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose /metrics over HTTP (``litecdc pipeline run --metrics-addr``)."""
        start_http_server(port, addr=addr, registry=self.registry)
