"""Subscriptions as a user manages them: add (checked first), status, remove."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litecdc.errors import (
    LitecdcError,
    MetadataError,
    NotFoundError,
    PositionUnavailableError,
    SourceError,
    UnknownSubscriptionError,
)
from litecdc.pipeline.metadata import MetadataStore, Progress, Subscription
from litecdc.pipeline.parquet_log import ParquetLog, is_parquet_url, parse_parquet_url
from litecdc.pipeline.parquet_log import check_names as parquet_check_names
from litecdc.pipeline.sinks.registry import (
    AmqpOptions,
    DeltaOptions,
    SqlOptions,
    mask_url,
    open_sink,
    parse_sink_url,
)
from litecdc.pipeline.source_client import (
    DEFAULT_TIMEOUT,
    SourceClient,
    Subscriptions,
    parse_urls,
)

log = logging.getLogger("litecdc.pipeline")


#: seconds `pipeline status` waits for a source's answer (its requests are small: a frozen
#: node held it 60 s per subscription, ops QA) — beyond a node's 10 s wait for a min_cid
#: (http/app.py MIN_CID_WAIT), so that a follower behind answers its 503 before status
#: calls it unreachable (and says so for every subscription on it)
STATUS_TIMEOUT = 15.0


def _client(
    sub_sources: Any, options: dict[str, Any], *, timeout: float = DEFAULT_TIMEOUT
) -> SourceClient:
    return SourceClient(
        parse_urls(sub_sources),
        user=options.get("user") or None,
        password=options.get("password") or None,
        ca_cert=options.get("ca_cert") or None,
        timeout=timeout,
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
    take_over_hold: bool = False,
) -> Subscription:
    """Add a subscription after checking that the sink URL is valid, that no other
    subscription writes where it would (``sink_destination``), that the source table
    exists (an unreachable source or unknown table is refused here, not at run time) and
    that the source holds no changes under the name for a subscription this store does
    not have (unless ``take_over_hold``: one left by ``unsubscribe --force``)."""
    parsed = parse_parquet_url(sink) if is_parquet_url(sink) else parse_sink_url(sink)
    opts = {k: v for k, v in (options or {}).items() if v is not None}
    urls = parse_urls(sources)
    existing = store.list_subscriptions(include_cancelled=True)
    known = {s.name for s in existing}
    with _client(urls, opts) as client:
        info = client.table_info(table)
        hold = None if name in known else client.subscriptions().get(name)
        if hold is not None and not take_over_hold:
            # the node's holds are named, nothing more: a second pipeline's subscription of
            # the name would move and release the first one's hold (QA: its unsubscribe
            # left the other failing for good, its changes pruned)
            what = (
                f"keeps an expired hold (at cid {hold.cid}, behind its retention cap)"
                if hold.expired
                else f"already holds changes (after cid {hold.cid})"
            )
            node = mask_url(urls[0]).rstrip("/")
            raise MetadataError(
                f"subscription {name!r}: the source {what} for a subscription of that name "
                "that this metadata store does not have — another pipeline's (two of one "
                "name would share the hold, and either one's unsubscribe would break the "
                "other), or one removed with `unsubscribe --force`. Choose another --name; "
                "or, if no other pipeline uses the name, add --take-over-hold, or release "
                f"the hold (curl -X DELETE {node}/cdc/subscriptions/{name}, with a user "
                "allowed to execute)"
            )
    # a SQL sink's table defaults to the source table's name, as the node spells it
    others = [s for s in existing if s.name != name]
    _check_own_destination(sink, info.spec.name, others)
    if isinstance(parsed, ParquetLog):
        parquet_check_names(parsed, info.spec)
    elif isinstance(parsed, SqlOptions | AmqpOptions | DeltaOptions):
        # names the server cannot hold (a SQL table's, a queue's or routing key's over
        # AMQP's 255 bytes, columns one name to it), refused now rather than at every run
        # (types QA, pipeline QA, idents QA)
        mirror = open_sink(sink, info.spec, name, prepare=False)  # (connects to nothing)
        try:
            mirror.check_names()
        finally:
            mirror.close()
    return store.add_subscription(
        name,
        table_name=info.spec.name,
        sources=urls,
        sink=sink,
        owner=owner,
        options=opts,
    )


@dataclass(frozen=True)
class Destination:
    """Where a sink writes, normalised so that two URLs naming one place compare equal:
    ``kind`` 'directory' (a Delta table or a Parquet log: the resolved absolute path),
    'postgresql' or 'mysql' (server, database, schema, table). Message sinks (NATS,
    RabbitMQ, webhooks) have none: several subscriptions may publish into one stream,
    exchange or queue (their messages carry their table, their ids the subscription)."""

    kind: str
    parts: tuple[str, ...]
    shown: str  # for messages

    def conflict(self, other: Destination) -> str | None:
        """Why ``other`` is (or holds, or lies inside) this destination, else None."""
        if self.kind != other.kind:
            return None
        if self.parts == other.parts:
            return f"both write {self.shown}"
        if self.kind == "directory":
            mine, theirs = Path(self.parts[0]), Path(other.parts[0])
            if mine.is_relative_to(theirs):
                return f"{self.shown} is inside {other.shown}"
            if theirs.is_relative_to(mine):
                return f"{other.shown} is inside {self.shown}"
        return None


#: names of this machine's loopback interface: one server, whichever is written
_LOOPBACK = ("localhost", "localhost.localdomain", "ip6-localhost", "::1", "0.0.0.0", "::")


def _server(host: str, port: int) -> str:
    host = host.lower().rstrip(".")
    if host in _LOOPBACK or host.startswith("127."):
        host = "localhost"
    return f"{host}:{port}"


def sink_destination(sink: str, table: str) -> Destination | None:
    """Where ``sink`` writes the source table ``table`` (None: a message sink, which
    subscriptions may share). Raises SinkError for a bad URL."""
    if is_parquet_url(sink):
        path = str(parse_parquet_url(sink).path)
    else:
        options = parse_sink_url(sink)
        if isinstance(options, DeltaOptions):
            path = options.path
        elif isinstance(options, SqlOptions):
            server = _server(options.host, options.port)
            if options.dialect == "postgresql":  # names are quoted: case counts
                schema, name = options.schema or "public", options.table or table
                return Destination(
                    "postgresql",
                    (server, options.database, schema, name),
                    f"the PostgreSQL table {schema}.{name} of database {options.database} "
                    f"at {server}",
                )
            # MySQL/MariaDB: table and database names are case-insensitive on some
            # systems (lower_case_table_names): compared without case
            name = options.table or table
            return Destination(
                "mysql",
                (server, options.database.lower(), name.lower()),
                f"the MariaDB table {name} of database {options.database} at {server}",
            )
        else:
            return None
    resolved = os.path.realpath(path)  # '.', '..', a trailing '/', symbolic links
    return Destination("directory", (resolved,), f"the directory {resolved}")


def _check_own_destination(sink: str, table: str, others: list[Subscription]) -> None:
    """MetadataError when ``sink`` writes where another subscription's sink does: one
    Delta table, Parquet log (or a directory inside one) or SQL table per subscription."""
    mine = sink_destination(sink, table)
    if mine is None:
        return
    for other in others:
        try:
            theirs = sink_destination(other.sink, other.table_name)
        except LitecdcError:  # recorded before a check that refuses it now
            continue
        why = None if theirs is None else mine.conflict(theirs)
        if why is not None:
            raise MetadataError(
                f"sink {mask_url(sink)} is already used by subscription {other.name} "
                f"(sink {mask_url(other.sink)}): {why}; give each subscription its own "
                "destination"
            )


def unsubscribe(store: MetadataStore, name: str, *, force: bool = False) -> str | None:
    """Release ``name``'s hold on the source and remove it. Returns None when the hold
    was released; otherwise why it could not be (the source unreachable, or refusing),
    and the subscription is only marked cancelled (its server releases the hold later) —
    or, with ``force``, removed all the same (the hold stays on the node, expired once it
    falls behind the retention cap, its name taken until released or taken over)."""
    sub = store.get_subscription(name)
    store.request_cancel(name)
    try:
        # NotFoundError: never registered, or released already
        with (
            # (ops QA: 60 s on a frozen node; `pipeline run` releases it later anyway)
            _client(list(sub.sources), sub.options, timeout=STATUS_TIMEOUT) as client,
            contextlib.suppress(NotFoundError),
        ):
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
    #: why the source could not be asked (unreachable, or refusing the request)
    source_error: str | None
    #: age in seconds of the oldest change of the table the sink has not applied
    lag_seconds: float | None = None
    #: (error, since) while `pipeline run` fails on it, as it recorded
    failure: tuple[str, str] | None = None
    #: the node answers, but has no such table (dropped or renamed): its message
    table_missing: str | None = None
    #: the node no longer keeps the changes the subscription needs (its hold fell behind
    #: the retention cap): what it says; `pipeline run` takes a new snapshot
    position_expired: str | None = None
    #: registered, yet the node has no hold of its name (deleted there, or the source's
    #: database replaced): `pipeline run` fails on it until the mirror is rebuilt
    hold_missing: bool = False

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
            # the client says "unreachable" when no address took the connection, "no
            # answer" when none answered in time; anything else is an answer: a refusal
            # (401, 403), an error of the node, not a litecdc node
            what = "unreachable" if _not_answering(self.source_error) else "error"
            lines.append(f"  source: {what} ({self.source_error})")
        if self.table_missing is not None:
            lines.append(
                f"  source: table {sub.table_name} is gone: the node has no such table "
                f"(dropped or renamed?) ({self.table_missing}); create it again, or "
                "unsubscribe"
            )
        if self.hold_missing:
            # (said as `pipeline run` says it, not as an expired position: a new snapshot
            # cannot fix it — QA: status promised one while every run failed)
            lines.append(
                "  hold missing: the node keeps no changes for this subscription (its hold "
                "was deleted there, or the source's database replaced; a cluster node still "
                "catching up shows this for a moment): rebuild the mirror: `litecdc pipeline "
                f"unsubscribe {sub.name}`, empty or drop the mirror, and subscribe again"
            )
        if self.position_expired is not None:
            lines.append(
                "  position expired: the node no longer keeps the changes this subscription "
                f"needs ({self.position_expired}); `pipeline run` takes a new snapshot of "
                "the table on its next run"
            )
        if self.source_error is None and self.source_cid is not None:
            lag = self.lag_cids
            seconds = f", {self.lag_seconds:.1f} s" if self.lag_seconds is not None else ""
            lines.append(
                f"  source head: cid {self.source_cid}"
                + (f", lag {lag} cid(s){seconds}" if lag is not None else "")
            )
        return "\n".join(lines)


def _not_answering(error: str) -> bool:
    """Whether a source client's error says no address answered: none took the
    connection, or none answered in time (review: a frozen source, "no answer within",
    was asked again for each of its subscriptions, 15 s each)."""
    return ": unreachable (" in error or ": no answer within " in error


def _lag_seconds(client: SourceClient, table: str, applied: int) -> float:
    """How old the oldest change of ``table`` the sink has not applied is (0 when none:
    commits of other tables, or the node's own entries, are no lag)."""
    pending = client.position(table, after=applied, max_events=1)
    if pending.events == 0 or pending.first_cid is None:
        return 0.0
    # the commit of the table's first pending change (the batch may end far later: at
    # the head, when no other change of the table follows)
    committed = client.commit_time_ms(pending.first_cid - 1)
    return 0.0 if committed is None else max(time.time() - committed / 1000, 0.0)


#: subscriptions whose source `pipeline status` asks at once (scale QA: 40 subscriptions,
#: five requests each one after the other, took 33 s on a loaded node)
STATUS_PARALLEL = 8


def status(store: MetadataStore, name: str | None = None) -> list[StatusReport]:
    """Where each subscription (or just ``name``) stands, with its source's head now.

    Every subscription gets its report: what its source cannot tell (unreachable, the
    table gone, the position expired) is said in that subscription's report only. The
    subscriptions of one source (and credentials) share a client and its list of holds,
    asked once — a source that does not answer costs one wait for all of them (ops QA: a
    frozen node cost 10 s per subscription on it) — and their tables are asked about in
    parallel.
    """
    subs = (
        [store.get_subscription(name)] if name else store.list_subscriptions(include_cancelled=True)
    )
    # (the metadata store's connection is this thread's: read before any thread starts)
    reports = []
    for sub in subs:
        try:
            progress, failure = store.progress(sub.name), store.failure(sub.name)
        except UnknownSubscriptionError:
            if name:
                raise
            continue  # unsubscribed since the list was read (QA: `status` failed)
        reports.append(StatusReport(sub, progress, None, None, failure=failure))
    groups: dict[tuple[Any, ...], list[StatusReport]] = {}
    for report in reports:
        groups.setdefault(_source_key(report.subscription), []).append(report)
    # sources that did not answer, by their addresses: not asked again, whatever the
    # credentials (review: three users of a frozen source waited 15 s each)
    silent = _Silent()
    with contextlib.ExitStack() as clients:
        asks: list[tuple[StatusReport, SourceClient, Subscriptions]] = []
        for members in groups.values():
            first = members[0].subscription
            try:
                silent.check(first.sources)
                client = clients.enter_context(
                    _client(list(first.sources), first.options, timeout=STATUS_TIMEOUT)
                )
                # a litecdc endpoint that needs no table first: a 404 below is the table's
                holds = client.subscriptions()
            except LitecdcError as exc:  # unreachable, refusing: said in these reports only
                silent.note(first.sources, exc)
                for report in members:
                    report.source_error = str(exc)
                continue
            asks += [(report, client, holds) for report in members]

        def ask(report: StatusReport, client: SourceClient, holds: Subscriptions) -> None:
            _ask_source(report, client, holds, silent)

        if len(asks) > 1:
            with ThreadPoolExecutor(STATUS_PARALLEL, thread_name_prefix="litecdc-status") as pool:
                list(pool.map(lambda each: ask(*each), asks))
        elif asks:
            ask(*asks[0])
    return reports


class _Silent:
    """The sources a status found not answering (by their addresses), shared by its
    threads: once one request to a source went unanswered, the others waiting to ask it
    are told so at once (review: a source answering its holds but not its tables cost
    15 s per 8 subscriptions)."""

    def __init__(self) -> None:
        self._errors: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()

    def check(self, sources: Sequence[str]) -> None:
        """SourceError with what ``sources`` answered, when they did not answer before."""
        with self._lock:
            error = self._errors.get(tuple(sources))
        if error is not None:
            raise SourceError(error)

    def note(self, sources: Sequence[str], exc: LitecdcError) -> None:
        if _not_answering(str(exc)):
            with self._lock:
                self._errors.setdefault(tuple(sources), str(exc))


def _source_key(sub: Subscription) -> tuple[Any, ...]:
    """What a source client is made of: its addresses and credentials."""
    options = sub.options
    return (
        tuple(sub.sources),
        options.get("user") or None,
        options.get("password") or None,
        options.get("ca_cert") or None,
    )


def _ask_source(
    report: StatusReport, client: SourceClient, holds: Subscriptions, silent: _Silent
) -> None:
    """Fill ``report`` in with what the source says of its subscription and table."""
    sub, progress = report.subscription, report.progress
    report.source_cid = holds.last_cid
    hold = holds.get(sub.name)  # `pipeline run` registers under the name
    # (the condition on which `pipeline run` fails: registered, no hold)
    report.hold_missing = (
        hold is None and progress.stage not in (None, "register") and not sub.cancel
    )
    # in 'register' the next run registers again anyway: no news there
    if hold is not None and hold.expired and progress.stage in ("snapshot", "incremental"):
        report.position_expired = (
            f"its hold at cid {hold.cid} fell more than {holds.retention_cids} "
            f"commits behind the head, and the log is pruned through cid "
            f"{holds.pruned_cid}"
        )
    try:
        silent.check(sub.sources)
        try:
            # at least as far as the sink applied (pipeline QA: a follower restarted
            # behind it showed a head below the applied cid, as "lag 0")
            report.source_cid = client.table_info(
                sub.table_name, min_cid=progress.last_log_index or None
            ).last_cid
        except NotFoundError as exc:
            report.table_missing = str(exc)
            return
        applied = progress.last_log_index
        if applied is not None and report.position_expired is None and not report.hold_missing:
            silent.check(sub.sources)
            try:
                report.lag_seconds = _lag_seconds(client, sub.table_name, applied)
            except PositionUnavailableError as exc:
                report.position_expired = str(exc)
    except LitecdcError as exc:  # unreachable, refusing: said in this report only
        silent.note(sub.sources, exc)
        report.source_error = str(exc)
