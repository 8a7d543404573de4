"""Subscriptions as a user manages them: add (checked first), status, remove."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from litecdc.errors import MetadataError, NotFoundError, SourceError
from litecdc.pipeline.metadata import MetadataStore, Progress, Subscription
from litecdc.pipeline.parquet_log import is_parquet_url, parse_parquet_url
from litecdc.pipeline.sinks.registry import mask_url, parse_sink_url
from litecdc.pipeline.source_client import SourceClient, parse_urls

log = logging.getLogger("litecdc.pipeline")


def _client(sub_sources: Any, options: dict[str, Any]) -> SourceClient:
    return SourceClient(
        parse_urls(sub_sources),
        user=options.get("user") or None,
        password=options.get("password") or None,
        ca_cert=options.get("ca_cert") or None,
    )


def subscribe(
    store: MetadataStore,
    *,
    name: str,
    sources: str | list[str],
    table: str,
    sink: str,
    owner: str = "default",
    options: dict[str, Any] | None = None,
) -> Subscription:
    """Add a subscription after checking that the sink URL is valid and the source table
    exists (an unreachable source or unknown table is refused here, not at run time)."""
    if is_parquet_url(sink):
        parse_parquet_url(sink)
    else:
        parse_sink_url(sink)
    if sink.startswith(("delta:", "parquet:")):  # a path is one whole table or log
        taken = [
            s.name
            for s in store.list_subscriptions(include_cancelled=True)
            if s.sink == sink and s.name != name
        ]
        if taken:
            raise MetadataError(
                f"sink {sink} is already used by subscription {taken[0]}: give each "
                "subscription its own path"
            )
    opts = {k: v for k, v in (options or {}).items() if v is not None}
    urls = parse_urls(sources)
    with _client(urls, opts) as client:
        info = client.table_info(table)
    return store.add_subscription(
        name,
        table_name=info.spec.name,
        sources=urls,
        sink=sink,
        owner=owner,
        options=opts,
    )


def unsubscribe(store: MetadataStore, name: str, *, force: bool = False) -> str | None:
    """Release ``name``'s hold on the source and remove it. Returns None when the hold
    was released; otherwise why it could not be (the source unreachable, or refusing),
    and the subscription is only marked cancelled (its server releases the hold later) —
    or, with ``force``, removed all the same (the node drops the hold once it falls
    behind its retention cap)."""
    sub = store.get_subscription(name)
    store.request_cancel(name)
    try:
        # NotFoundError: never registered, or released already
        with _client(list(sub.sources), sub.options) as client, contextlib.suppress(NotFoundError):
            client.unsubscribe(name)
    except SourceError as exc:
        log.warning("subscription %s: could not release its hold now: %s", name, exc)
        if force:
            store.remove_subscription(name)
        return str(exc)
    store.remove_subscription(name)
    return None


@dataclass
class StatusReport:
    subscription: Subscription
    progress: Progress
    source_cid: int | None
    source_error: str | None
    #: age in seconds of the oldest change of the table the sink has not applied
    lag_seconds: float | None = None
    #: (error, since) while `pipeline run` fails on it, as it recorded
    failure: tuple[str, str] | None = None

    @property
    def lag_cids(self) -> int | None:
        applied = self.progress.last_log_index
        if self.source_cid is None or applied is None:
            return None
        return max(self.source_cid - applied, 0)

    def describe(self) -> str:
        sub, progress = self.subscription, self.progress
        stage = progress.stage or "not started"
        sink = mask_url(sub.sink)  # never print a password
        lines = [f"{sub.name}: table {sub.table_name} -> {sink} (owner {sub.owner})"]
        if sub.cancel:
            lines.append("  unsubscribing: the owning server releases the hold")
        lines.append(f"  stage: {stage}")
        if self.failure is not None:
            error, since = self.failure
            lines.append(f"  FAILING since {since}: {error}")
        if progress.init_snapshot_version is not None:
            lines.append(f"  initial snapshot version: cid {progress.init_snapshot_version}")
        if progress.ranges:
            done = sum(1 for r in progress.ranges if r.done)
            lines.append(
                f"  snapshot: {done}/{len(progress.ranges)} range(s) done, "
                f"{progress.rows_copied} row(s) copied"
            )
        if progress.last_log_index is not None:
            lines.append(f"  applied through cid {progress.last_log_index}")
        if self.source_error is not None:
            lines.append(f"  source: unreachable ({self.source_error})")
        elif self.source_cid is not None:
            lag = self.lag_cids
            seconds = f", {self.lag_seconds:.1f} s" if self.lag_seconds is not None else ""
            lines.append(
                f"  source head: cid {self.source_cid}"
                + (f", lag {lag} cid(s){seconds}" if lag is not None else "")
            )
        return "\n".join(lines)


def _lag_seconds(client: SourceClient, table: str, applied: int) -> float:
    """How old the oldest change of ``table`` the sink has not applied is (0 when none:
    commits of other tables, or the node's own entries, are no lag)."""
    pending = client.position(table, after=applied, max_events=1)
    if pending.events == 0:
        return 0.0
    committed = client.commit_time_ms(pending.end_cid - 1)  # that transaction's commit
    return 0.0 if committed is None else max(time.time() - committed / 1000, 0.0)


def status(store: MetadataStore, name: str | None = None) -> list[StatusReport]:
    """Where each subscription (or just ``name``) stands, with its source's head now."""
    subs = (
        [store.get_subscription(name)] if name else store.list_subscriptions(include_cancelled=True)
    )
    reports = []
    for sub in subs:
        progress = store.progress(sub.name)
        head: int | None = None
        error: str | None = None
        seconds: float | None = None
        try:
            with _client(list(sub.sources), sub.options) as client:
                head = client.table_info(sub.table_name).last_cid
                applied = progress.last_log_index
                if applied is not None:
                    seconds = _lag_seconds(client, sub.table_name, applied)
        except (SourceError, NotFoundError) as exc:
            error = str(exc)
        reports.append(StatusReport(sub, progress, head, error, seconds, store.failure(sub.name)))
    return reports
