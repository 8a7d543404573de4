"""``litecdc pipeline …``: the CDC pull server's commands. Each opens the metadata store
and makes one library call; Spark starts only for ``run``.

    litecdc pipeline subscribe --source URL[,URL…] --table T --name N --sink URL
    litecdc pipeline run [--owner NAME] [--master URL] [--until-caught-up]
    litecdc pipeline list | status [NAME] | unsubscribe NAME | verify NAME

Every command takes ``--meta URL`` (``sqlite:///path`` — default ``litecdc-pipeline.db``
in the working directory — or ``postgresql://…``; also ``LITECDC_PIPELINE_META``).
Errors print one line, ``error: …``: status 2 for bad options, 1 for everything else.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from litecdc.errors import ConfigError, LitecdcError, MetadataError
from litecdc.pipeline.spark import DEFAULT_DRIVER_MEMORY

if TYPE_CHECKING:
    from litecdc.pipeline.metadata import MetadataStore
    from litecdc.pipeline.server import SubscriptionState

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_META_FILE = "litecdc-pipeline.db"
#: bounds of subscribe's sizes: far above any useful value, far below what breaks
#: (10**23 was stored and then overflowed where Spark and SQL take 64-bit integers)
MAX_PARTITIONS = 1024  # = server.MAX_CHUNKS, the most key ranges (not imported: Spark)
MAX_PAGE_ROWS = 10_000_000
MAX_EVENTS = 10_000_000
#: the longest poll interval: a day (inf and nan passed, and the server never polled)
MAX_POLL_INTERVAL = 86_400.0


def mask_url(url: str) -> str:
    """A sink URL fit to print: passwords and secrets masked."""
    from litecdc.pipeline.sinks.registry import mask_url as mask

    return mask(url)


def default_meta_url() -> str:
    from litecdc.pipeline.metadata import sqlite_url

    # (not "sqlite:///" + an absolute path: messages named the store "//tmp/…", QA)
    return sqlite_url(Path.cwd() / DEFAULT_META_FILE)


def _meta_option(func: F) -> F:
    return click.option(
        "--meta",
        envvar="LITECDC_PIPELINE_META",
        show_envvar=True,
        default=None,
        help="Metadata store: sqlite:///abs/path.db, sqlite:relative/path.db or "
        "postgresql://user@host:port/db. "
        f"Default: sqlite file {DEFAULT_META_FILE} in the working directory.",
    )(func)


@contextlib.contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        click.echo(f"error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except LitecdcError as exc:
        click.echo(f"error: {_one_line(exc)}", err=True)
        sys.exit(1)


def _one_line(exc: BaseException) -> str:
    """Drivers' messages may span lines (libpq's hints): the CLI promises one."""
    return " ".join(str(exc).split())


def _open(meta: str | None, owner: str | None = None, *, create: bool = False) -> MetadataStore:
    """The metadata store ``--meta`` names. The default file is made by ``subscribe`` only
    (``create``): any other command run in another directory made an empty one there and
    said "no subscriptions" (QA)."""
    from litecdc.pipeline.metadata import MetadataStore

    if meta is not None and not meta.strip():
        raise ConfigError(
            "--meta is empty: give sqlite:///path or postgresql://…, or leave it out for "
            f"{DEFAULT_META_FILE} in the working directory"
        )
    if meta is None and not create and not (Path.cwd() / DEFAULT_META_FILE).exists():
        # exit 1, as for a --meta file that is missing: a store that cannot be opened
        raise MetadataError(
            f"no metadata store here: the default is {DEFAULT_META_FILE} in the working "
            f"directory ({Path.cwd()}), made by `litecdc pipeline subscribe`; run where you "
            "subscribed, or give --meta (or LITECDC_PIPELINE_META)"
        )
    return MetadataStore.open(meta or default_meta_url(), owner=owner, create=create)


@click.group()
def pipeline() -> None:
    """The CDC pull server: subscriptions mirrored into sinks by a Spark pipeline."""


@pipeline.command()
@_meta_option
@click.option("--source", required=True, help="Node URL(s), comma-separated (any cluster node).")
@click.option("--table", required=True, help="The source table.")
@click.option("--name", required=True, help="The subscription's name (unique in the store).")
@click.option(
    "--sink",
    required=True,
    help="Where to mirror it: delta:/path, postgresql://…, mysql://…, nats://…, amqp://…, "
    "http(s)://… (webhook), or parquet:/path (a change log). See docs/pipeline.md.",
)
@click.option("--owner", default="default", show_default=True, help="The server that runs it.")
@click.option(
    "--partitions",
    default=2,
    show_default=True,
    help=f"Snapshot key ranges (1-{MAX_PARTITIONS}).",
)
@click.option(
    "--page-rows",
    default=200_000,
    show_default=True,
    help=f"Snapshot rows per chunk and range (1-{MAX_PAGE_ROWS:,}).",
)
@click.option(
    "--max-events",
    default=100_000,
    show_default=True,
    help=f"Change events per micro-batch (1-{MAX_EVENTS:,}).",
)
@click.option("--user", default=None, help="Basic-auth user for the source.")
@click.option("--password", default=None, help="Basic-auth password for the source.")
@click.option("--ca-cert", default=None, help="CA certificate of the source's HTTPS.")
@click.option(
    "--take-over-hold",
    is_flag=True,
    help="Take over a hold of this name already on the source (left by `unsubscribe "
    "--force`); only when no other pipeline uses the name.",
)
def subscribe(
    meta: str | None,
    source: str,
    table: str,
    name: str,
    sink: str,
    owner: str,
    partitions: int,
    page_rows: int,
    max_events: int,
    user: str | None,
    password: str | None,
    ca_cert: str | None,
    take_over_hold: bool,
) -> None:
    """Add a subscription: TABLE at SOURCE, mirrored into SINK (checked first)."""
    from litecdc.pipeline.control import subscribe as add
    from litecdc.pipeline.metadata import MetadataStore, Subscription, sqlite_path, sqlite_url

    with _errors():
        for option, value, most in (
            ("--partitions", partitions, MAX_PARTITIONS),
            ("--page-rows", page_rows, MAX_PAGE_ROWS),
            ("--max-events", max_events, MAX_EVENTS),
        ):
            if not 1 <= value <= most:
                raise ConfigError(f"{option} must be between 1 and {most}, got {value}")
        if (user is None) != (password is None):
            raise ConfigError("--user and --password must be given together")
        if not owner.strip():
            raise ConfigError("--owner is empty: give the name of the server that runs it")
        if not table.strip():
            raise ConfigError("--table is empty: give the source table's name")

        def add_to(store: MetadataStore) -> Subscription:
            return add(
                store,
                name=name,
                sources=source,
                table=table,
                sink=sink,
                owner=owner,
                options={
                    "partitions": partitions,
                    "page_rows": page_rows,
                    "max_events": max_events,
                    "user": user,
                    "password": password,
                    "ca_cert": ca_cert,
                },
                take_over_hold=take_over_hold,
            )

        new_file = sqlite_path(meta or default_meta_url())
        if new_file is None or not new_file.exists():
            # a store this may make: everything is checked first against an empty one
            # of its own, so that a subscribe refused makes no store (pipeline QA: its
            # empty store said "no subscriptions" where there was none; metadata QA: a
            # PostgreSQL database kept the tables). Never a store removed afterwards:
            # another subscribe may have opened it meanwhile (review).
            with (
                tempfile.TemporaryDirectory(prefix="litecdc-subscribe-") as scratch_dir,
                MetadataStore.open(sqlite_url(Path(scratch_dir) / "check.db")) as scratch,
            ):
                add_to(scratch)
        store = _open(meta, create=True)
        try:
            sub = add_to(store)
        finally:
            store.close()
        click.echo(
            f"subscription {sub.name}: table {sub.table_name} at {', '.join(sub.sources)} -> "
            f"{mask_url(sub.sink)} (owner {sub.owner}); `litecdc pipeline run` starts it"
        )


@pipeline.command()
@_meta_option
@click.option(
    "--owner", default="default", show_default=True, help="Run this owner's subscriptions."
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--driver-memory",
    default=None,
    help="Heap of Spark's driver JVM (with a local master, all of Spark): 512m, 2g, 8g "
    f"[default: $SPARK_DRIVER_MEMORY, else {DEFAULT_DRIVER_MEMORY}]. A transaction of "
    "millions of rows read by several subscriptions at once needs more.",
)
@click.option(
    "--until-caught-up",
    is_flag=True,
    help="Exit once every subscription has applied all changes committed before the start: "
    "0, or 1 when one was given up on (it failed 5 times in a row) meanwhile.",
)
@click.option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    help="Seconds between polls when there is nothing to do "
    f"(above 0, at most {MAX_POLL_INTERVAL:,.0f}).",
)
@click.option(
    "--parallel",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Subscriptions stepped at once, each in a thread (a hung sink holds up only its own).",
)
@click.option(
    "--metrics-port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on 127.0.0.1:PORT (0 = off).",
)
@click.option("--quiet", is_flag=True, help="No progress bars.")
def run(
    meta: str | None,
    owner: str,
    master: str,
    driver_memory: str | None,
    until_caught_up: bool,
    poll_interval: float,
    parallel: int,
    metrics_port: int,
    quiet: bool,
) -> None:
    """Run every subscription OWNER has (Spark driver); resumes after a restart."""
    from litecdc.pipeline.server import PipelineServer
    from litecdc.pipeline.spark import (
        check_driver_memory,
        check_master,
        driver_memory_default,
        spark_session,
    )

    with _errors():
        if not (0 < poll_interval <= MAX_POLL_INTERVAL):  # (also refuses nan)
            raise ConfigError(
                f"--poll-interval must be a number of seconds above 0 and at most "
                f"{MAX_POLL_INTERVAL:g}, got {poll_interval}"
            )
        check_master(master)  # before Spark takes its time to start
        driver_memory = driver_memory or driver_memory_default()
        check_driver_memory(driver_memory)
        if metrics_port:
            _check_port_free(metrics_port)
        store = _open(meta, owner)
        try:
            store.claim_owner()  # one run per owner (before Spark takes its time to start)
        except BaseException:
            store.close()
            raise
        _configure_logging()  # (once the options passed: refused runs leave it as it was)
        # a crash in native code (a SIGSEGV: CI saw one as a stopped run exited, once,
        # without a word) prints every thread's Python stack on stderr
        faulthandler.enable(all_threads=True)
        display = _ProgressDisplay(enabled=not quiet)
        try:
            spark = spark_session(master, driver_memory=driver_memory)
            server = PipelineServer(
                store,
                spark,
                owner=owner,
                poll_interval=poll_interval,
                parallel=parallel,
                on_progress=display.update,
            )
            if metrics_port:
                try:
                    server.metrics.serve(metrics_port)
                except OSError as exc:
                    raise ConfigError(_port_taken(metrics_port, exc)) from None
            # from a thread: the handler runs in the main thread, which may hold the lock
            # of the very Event stop() sets (a non-reentrant Lock: it would deadlock)
            signal.signal(
                signal.SIGTERM,
                lambda *_: threading.Thread(target=server.stop, daemon=True).start(),
            )
            with display:
                failing = server.run(until_caught_up=until_caught_up)
        except KeyboardInterrupt:
            failing = 0
        finally:
            store.close()
        if until_caught_up:
            if failing:
                names = sorted(n for n, st in server.states.items() if st.last_error)
                raise LitecdcError(
                    f"{failing} subscription(s) failed ({', '.join(names)}); see the log "
                    "above or `litecdc pipeline status`"
                )
            if not server.caught_up:
                # (review: a SIGTERM or Ctrl-C before then said "every subscription has
                # caught up", exit 0, to the script waiting on it)
                raise LitecdcError(
                    "stopped before every subscription had caught up; run it again to go on"
                )
            click.echo("every subscription has caught up")


def _configure_logging() -> None:
    # (with the level: ops QA could not tell warnings from the rest, docs say which is which)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("httpx", "urllib3", "py4j"):  # lines per request / connection otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # pika logs its connections at INFO, and a failed one at ERROR in seven lines with a
    # traceback, on every retry; the RabbitMQ sink reports it as one error saying what to check
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def _port_taken(port: int, exc: OSError) -> str:
    return f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}"


def _check_port_free(port: int) -> None:
    """ConfigError when nothing can listen on 127.0.0.1:``port`` (QA: a port in use ended
    the run in a traceback, after Spark had started)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(_port_taken(port, exc)) from None


@pipeline.command(name="list")
@_meta_option
def list_command(meta: str | None) -> None:
    """List the subscriptions."""
    with _errors():
        store = _open(meta)
        try:
            subs = store.list_subscriptions(include_cancelled=True)
        finally:
            store.close()
        if not subs:
            click.echo("no subscriptions")
        for sub in subs:
            flag = " (unsubscribing)" if sub.cancel else ""
            click.echo(
                f"{sub.name}\ttable {sub.table_name}\tsink {mask_url(sub.sink)}\towner "
                f"{sub.owner}{flag}"
            )


@pipeline.command()
@_meta_option
@click.argument("name", required=False)
def status(meta: str | None, name: str | None) -> None:
    """Stage, snapshot progress, applied cid and lag of one or every subscription."""
    from litecdc.pipeline.control import status as read_status

    with _errors():
        store = _open(meta)
        try:
            reports = read_status(store, name)
        finally:
            store.close()
        if not reports:
            click.echo("no subscriptions")
        for report in reports:
            click.echo(report.describe())


@pipeline.command()
@_meta_option
@click.argument("name")
@click.option(
    "--force",
    is_flag=True,
    help="Remove NAME even when its hold cannot be released now (the node drops the hold "
    "once it falls behind --retention-cids).",
)
def unsubscribe(meta: str | None, name: str, force: bool) -> None:
    """Remove subscription NAME and release its hold on the source."""
    from litecdc.pipeline.control import unsubscribe as remove

    with _errors():
        store = _open(meta)
        try:
            problem = remove(store, name, force=force)
        finally:
            store.close()
        if problem is None:
            click.echo(f"subscription {name} removed; its hold on the source is released")
        elif force:
            click.echo(
                f"subscription {name} removed; a hold it has on the source is NOT released "
                f"({problem}): the node stops keeping changes for it once it falls behind "
                "its retention cap, but the name stays taken there until it is released "
                f"(curl -X DELETE NODE/cdc/subscriptions/{name}) or a new subscription of "
                "the name takes it over (subscribe --take-over-hold)"
            )
        else:
            click.echo(
                f"subscription {name} marked for removal; the source could not be asked to "
                f"release its hold ({problem}) — it has one once a `pipeline run` registered "
                "it: the owning `pipeline run` releases it when it can, or use --force to "
                "remove it anyway"
            )


@pipeline.command()
@_meta_option
@click.argument("name")
@click.option(
    "--limit",
    default=20,
    show_default=True,
    type=click.IntRange(0, MAX_EVENTS),
    help="Differences to print at most.",
)
def verify(meta: str | None, name: str, limit: int) -> None:
    """Compare NAME's source table with its sink row by row; exit 1 on any difference."""
    from litecdc.pipeline.verify import verify_subscription

    with _errors():
        store = _open(meta)
        # a SIGTERM (timeout, systemd) ends it as Ctrl-C does, its files removed (scale
        # QA: a killed verify left its spill behind, as big as the tables)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main else None
        try:
            report = verify_subscription(store, name, limit=limit)
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            store.close()
        for difference in report.differences:
            click.echo(difference.describe())
        if report.total_differences > len(report.differences):
            click.echo(f"… and {report.total_differences - len(report.differences)} more")
        click.echo(
            f"{name}: source {report.source_rows} rows (cid {report.source_cid}), sink "
            f"{report.sink_rows} rows, {report.total_differences} difference(s)"
        )
        if not report.ok:
            sys.exit(1)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signal.SIGTERM)


class _ProgressDisplay:
    """Progress bars of running snapshots (rows, rows/s, ETA) with rich."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> _ProgressDisplay:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("rows"),
                TextColumn("{task.fields[rate]}"),
                TimeRemainingColumn(),
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, state: SubscriptionState) -> None:
        if self._progress is None:
            return
        task = self._tasks.get(state.name)
        if state.stage == "snapshot":
            total = max(state.snapshot_total, state.snapshot_rows)
            if task is None:
                task = self._progress.add_task(
                    f"{state.name} snapshot", total=total, rate="", started_at=time.monotonic()
                )
                self._tasks[state.name] = task
            started = self._progress.tasks[task].fields["started_at"]
            elapsed = max(time.monotonic() - started, 1e-6)
            rate = f"{state.snapshot_rows / elapsed:,.0f} rows/s"
            self._progress.update(task, completed=state.snapshot_rows, total=total, rate=rate)
        elif task is not None:
            self._progress.update(task, completed=state.snapshot_rows, rate="done")
