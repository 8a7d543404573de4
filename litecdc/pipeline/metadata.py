"""The pipeline's metadata store: subscriptions and their progress, in tables (the jimdb design).

SQLite by default (``sqlite:///abs/path.db``, or ``sqlite:relative.db`` for a path relative to
the working directory), PostgreSQL for deployments where several pipeline servers share one
store (``postgresql://user@host:port/db``). The SQL is shared; only placeholders, row locks
and transaction start differ between the two dialects.

Tables:

- ``litecdc_subscriptions``: one row per subscription, keyed by its unique ``name``: what to
  read (cluster label, db, table, source node URLs), where to write (sink URL), options,
  which pipeline server runs it (``owner``) and whether an unsubscribe was asked (``cancel``).
- ``litecdc_progress``: keyed by (subscription, range_id). Range ``-1`` is the
  subscription-level row: its ``stage`` (register < snapshot < incremental), the initial
  snapshot version (the cid returned by register) and ``last_log_index`` (the change log is
  applied through this cid). Ranges ``0..n-1`` are the snapshot's primary-key ranges
  (``lower_key`` inclusive .. ``upper_key`` exclusive, JSON, NULL = unbounded), each with its
  own stage ('snapshot', then 'done'), paging key, read cid and row count.

Every method is one transaction and is safe to retry: calling it again with the same
arguments leaves the same state. Stages only move forward; the one way back is
:meth:`MetadataStore.restart_snapshot` (a re-snapshot after the source pruned the log).

Usage::

    store = MetadataStore.open("sqlite:////tmp/meta.db")
    store.add_subscription("orders-lake", table_name="orders",
                           sources=["http://127.0.0.1:4001"], sink="delta:/data/lake/orders")
    store.start_register("orders-lake", init_cid=42)
    store.set_ranges("orders-lake", [(None, [1000]), ([1000], None)])
    store.record_chunk("orders-lake", 0, last_key=[999], read_cid=43, rows=999, done=True)
    store.record_chunk("orders-lake", 1, last_key=[1500], read_cid=44, rows=501, done=True)
    store.finish_snapshot("orders-lake")          # stage 'incremental', log from cid 42
    store.record_log_position("orders-lake", 57)
    store.close()
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from litecdc.errors import MetadataError, UnknownSubscriptionError
from litecdc.sockets import shut_down_socket
from litecdc.wire import subscriber_name_problem

log = logging.getLogger("litecdc.pipeline")

STAGE_REGISTER = "register"
STAGE_SNAPSHOT = "snapshot"
STAGE_INCREMENTAL = "incremental"
#: Subscription-level stages, in the only order they may take.
STAGES = (STAGE_REGISTER, STAGE_SNAPSHOT, STAGE_INCREMENTAL)
#: The stage of a snapshot range whose last chunk was copied.
RANGE_DONE = "done"
#: range_id of the subscription-level progress row.
SUBSCRIPTION_RANGE = -1

DEFAULT_CLUSTER = "default"
DEFAULT_DB = "main"
DEFAULT_OWNER = "default"
#: Seconds to wait for a PostgreSQL connection before reporting it unreachable.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds a SQLite writer waits for another writer's lock before failing.
DEFAULT_BUSY_TIMEOUT = 30.0
#: seconds a PostgreSQL store's transaction may take before its connection is broken (the
#: store's transactions are a few small statements: this long, the server answers no one)
TRANSACTION_DEADLINE = 30.0
#: seconds a statement of the store waits for a lock another client of the PostgreSQL
#: database holds on its tables (less than TRANSACTION_DEADLINE: said as such, not as a
#: server that stopped answering)
LOCK_WAIT = 20.0
#: seconds a connection found broken is tried again for (a server restarting)
RECONNECT_WAIT_S = 5.0

SCHEMA_VERSION = 1

#: A range bound or paging key: a JSON value, normally the list of the key columns' values.
Key = Any

# One DDL for both dialects: SQLite takes BIGINT/BOOLEAN as INTEGER/NUMERIC affinity.
# Timestamps are ISO-8601 UTC text, so both sort and read the same.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS litecdc_metadata_schema (
        version INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS litecdc_subscriptions (
        name TEXT PRIMARY KEY,
        cluster TEXT NOT NULL DEFAULT 'default',
        db TEXT NOT NULL DEFAULT 'main',
        table_name TEXT NOT NULL,
        subscriber TEXT NOT NULL,
        sources TEXT NOT NULL,
        sink TEXT NOT NULL,
        options TEXT NOT NULL DEFAULT '{}',
        owner TEXT NOT NULL DEFAULT 'default',
        cancel BOOLEAN NOT NULL DEFAULT FALSE,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS litecdc_subscriptions_owner ON litecdc_subscriptions (owner)",
    """CREATE TABLE IF NOT EXISTS litecdc_progress (
        subscription TEXT NOT NULL,
        range_id INTEGER NOT NULL,
        stage TEXT NOT NULL
            CHECK (stage IN ('register', 'snapshot', 'incremental', 'done')),
        init_snapshot_version BIGINT,
        current_snapshot_version BIGINT,
        lower_key TEXT,
        upper_key TEXT,
        last_snapshot_key TEXT,
        last_log_index BIGINT,
        rows_copied BIGINT NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (subscription, range_id)
    )""",
    # what `pipeline run` knows of a subscription beyond its progress: the table
    # description its sink mirrors (a later source change is checked against it, also
    # after a restart), and the error it fails with (for `pipeline status`)
    """CREATE TABLE IF NOT EXISTS litecdc_subscription_state (
        subscription TEXT PRIMARY KEY,
        mirrored_spec TEXT,
        last_error TEXT,
        error_at TEXT,
        updated_at TEXT NOT NULL
    )""",
    # the source commit the change log was applied through, as the source marks it: a
    # source restored from an older backup numbers new commits with those cids again
    # (backup QA: the mirror then silently followed the other history). A table of its
    # own, so that a store made by an earlier version gains it as it opens.
    """CREATE TABLE IF NOT EXISTS litecdc_source_marks (
        subscription TEXT PRIMARY KEY,
        cid BIGINT NOT NULL,
        mark TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
)

#: every table and index _SCHEMA makes
_SCHEMA_OBJECTS = (
    "litecdc_metadata_schema",
    "litecdc_subscriptions",
    "litecdc_subscriptions_owner",
    "litecdc_progress",
    "litecdc_subscription_state",
    "litecdc_source_marks",
)

_SUBSCRIPTION_COLUMNS = (
    "name, cluster, db, table_name, subscriber, sources, sink, options, owner, cancel, "
    "created_at, updated_at"
)
_PROGRESS_COLUMNS = (
    "range_id, stage, init_snapshot_version, current_snapshot_version, lower_key, upper_key, "
    "last_snapshot_key, last_log_index, rows_copied, updated_at"
)


@dataclass(frozen=True)
class Subscription:
    """One subscription: a source table mirrored into one sink."""

    name: str
    table_name: str
    sources: tuple[str, ...]
    sink: str
    cluster: str = DEFAULT_CLUSTER
    db: str = DEFAULT_DB
    subscriber: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    owner: str = DEFAULT_OWNER
    cancel: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def table(self) -> str:
        """The source table (``table_name``, the column's name)."""
        return self.table_name

    def same_definition(self, other: Subscription) -> bool:
        """Whether both describe the same subscription (state and timestamps aside)."""
        return _definition(self) == _definition(other)


def _definition(s: Subscription) -> tuple[object, ...]:
    return (s.name, s.table_name, s.sources, s.sink, s.cluster, s.db, s.subscriber,
            json.dumps(s.options, sort_keys=True), s.owner)  # fmt: skip


@dataclass(frozen=True)
class RangeProgress:
    """A primary-key range of the snapshot and how far its copy got."""

    range_id: int
    stage: str  # 'snapshot' or 'done'
    lower_key: Key  # inclusive; None = unbounded
    upper_key: Key  # exclusive; None = unbounded
    last_snapshot_key: Key  # last key copied; None = not started
    init_snapshot_version: int | None
    current_snapshot_version: int | None  # cid the last chunk was read at
    rows_copied: int
    updated_at: datetime

    @property
    def done(self) -> bool:
        return self.stage == RANGE_DONE


@dataclass(frozen=True)
class Progress:
    """Where a subscription stands; ``stage`` is None until it is registered."""

    subscription: str
    stage: str | None
    init_snapshot_version: int | None
    last_log_index: int | None
    ranges: tuple[RangeProgress, ...] = ()
    updated_at: datetime | None = None

    @property
    def rows_copied(self) -> int:
        return sum(r.rows_copied for r in self.ranges)

    @property
    def snapshot_done(self) -> bool:
        return bool(self.ranges) and all(r.done for r in self.ranges)


def sqlite_path(url: str) -> Path | None:
    """The file a ``sqlite:`` metadata URL names; None for another URL, or one naming none."""
    if not url.lower().startswith("sqlite:"):
        return None
    rest = url[len("sqlite:") :]
    path = rest[2:] if rest.startswith("//") else rest
    return Path(path) if path and path != "/" else None


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The metadata URL of a SQLite file (made absolute)."""
    return "sqlite://" + str(Path(path).absolute())


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class _Tx(Protocol):
    """One open transaction; SQL uses ``?`` placeholders in both dialects."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]: ...


class _Backend(Protocol):
    description: str
    errors: tuple[type[Exception], ...]  # the driver's errors, converted at the boundary

    def transaction(self, *, write: bool) -> AbstractContextManager[_Tx]: ...

    def claim(self, owner: str) -> None: ...

    def check_claim(self) -> None: ...

    def close(self) -> None: ...


class _SQLiteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()


def _owner_only(path: Path) -> None:
    """A store about to be made in a file that was there (empty) becomes owner-only too,
    as one litecdc creates (config QA: a pre-made file stayed 0644, holding passwords);
    before WAL mode, so SQLite gives its -wal and -shm files the same mode."""
    try:
        mode = path.stat().st_mode
        if mode & 0o077:
            path.chmod(mode & 0o700)
    except OSError as exc:
        raise MetadataError(
            f"cannot make the metadata database {path} readable by its owner only (it will "
            f"hold passwords): {exc.strerror or exc}"
        ) from None


class _SQLiteBackend:
    def __init__(self, path: Path, busy_timeout: float, *, create: bool = True) -> None:
        self.description = f"SQLite {path}"
        self.errors: tuple[type[Exception], ...] = (sqlite3.Error,)
        self._path = path
        #: the run's claim: the locked run file's descriptor, its path and the owner
        self._claim: tuple[int, Path, str] | None = None
        if not path.parent.is_dir():
            raise MetadataError(
                f"cannot open the metadata database {path}: directory {path.parent} does not exist"
            )
        missing = MetadataError(
            f"no metadata store at {path}: `litecdc pipeline subscribe` makes it; "
            "check --meta (or LITECDC_PIPELINE_META)"
        )
        if not create and not path.exists():
            raise missing  # (a mistyped --meta made an empty store: QA)
        if not path.exists():
            # owner-only: the store keeps sources' and sinks' passwords in clear; SQLite
            # gives its -wal and -shm files the same mode (it was 0644: security QA)
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        try:
            # Autocommit mode: transactions are opened explicitly (BEGIN IMMEDIATE for writes,
            # so two writers never deadlock upgrading a read lock). One connection serves all
            # threads, serialised by the store's lock.
            self._conn = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise MetadataError(f"cannot open the metadata database {path}: {exc}") from exc
        try:
            tables = self._check_not_foreign(path)
            if not create and not tables:
                raise missing  # (an empty file: list wrote the schema into it, review QA)
            if not tables:
                _owner_only(path)
            # WAL: readers (status, list) never block the running server's writes.
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
            opened = os.stat(path)
            self._identity = (opened.st_dev, opened.st_ino)
        except OSError as exc:
            self._conn.close()
            raise MetadataError(f"cannot open the metadata database {path}: {exc}") from exc
        except sqlite3.Error as exc:
            self._conn.close()
            raise MetadataError(f"cannot open the metadata database {path}: {exc}") from exc
        except MetadataError:
            self._conn.close()
            raise

    def _check_not_foreign(self, path: Path) -> list[str]:
        """Refuse a SQLite file that holds another application's tables — a litecdc node's
        own database, say: the store's tables would land in it unseen by its journal and
        change log (QA: ``pipeline list --meta sqlite:///node/db.sqlite`` did so)."""
        tables = [
            name
            for (name,) in self._conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        if tables and "litecdc_metadata_schema" not in tables:
            shown = ", ".join(sorted(tables)[:5]) + (", …" if len(tables) > 5 else "")
            raise MetadataError(
                f"{path} is not a pipeline metadata store: it is another SQLite database "
                f"(tables {shown}); give --meta a file of its own"
            )
        return tables

    def claim(self, owner: str) -> None:
        """An exclusive lock on a file of the owner's next to the store (an flock: the
        kernel drops it when the process ends, kill -9 included). The store's real path
        names it: a symbolic link to the store is the same store."""
        real = self._path.resolve()
        run_file = real.with_name(f"{real.name}.run-{_owner_tag(owner)}.lock")
        try:
            # (no symbolic link followed: a planted one would have its target truncated)
            fd = os.open(run_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise MetadataError(f"cannot create the run lock {run_file}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
            os.close(fd)
            raise MetadataError(_claimed(owner, self.description, holder or None)) from None
        except OSError as exc:
            os.close(fd)
            raise MetadataError(f"cannot lock the run lock {run_file}: {exc}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder().encode(), 0)
        if self._claim is not None:
            os.close(self._claim[0])
        self._claim = (fd, run_file, owner)

    def check_claim(self) -> None:
        """An flock lasts as long as the process, but only on the file it was taken on:
        a run file deleted meanwhile (it looks stale) let a second run lock a new one
        (review). The run then claims the file that is there now, or stops."""
        if self._claim is None:
            return
        try:
            store = os.stat(self._path)
        except FileNotFoundError:
            store = None
        if store is None or (store.st_dev, store.st_ino) != self._identity:
            # (QA: a run went on writing its progress into the deleted file, unseen by
            # `status`, while a `subscribe` made a new store no run ever read)
            raise MetadataError(
                f"the metadata store {self._path} was removed or replaced while this run "
                "used it: its subscriptions and progress are not there any more — stop; "
                "restore the file (or subscribe again) and start `pipeline run` again"
            )
        fd, run_file, owner = self._claim
        held = os.fstat(fd)
        try:
            there = os.stat(run_file, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino):
            return
        log.warning("the run lock %s was removed or replaced; taking it again", run_file)
        self.claim(owner)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[_Tx]:
        self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield _SQLiteTx(self._conn)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()
        if self._claim is not None:
            os.close(self._claim[0])  # (releases the lock)
            self._claim = None


class _PostgresTx:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        # The shared SQL has no literal '?' or '%', so the placeholder swap is safe.
        self._cur.execute(sql.replace("?", "%s"), tuple(params))
        if self._cur.description is None:
            return []
        rows: list[tuple[Any, ...]] = self._cur.fetchall()
        return rows


def _connect_hint(said: str) -> str:
    """What to do about a PostgreSQL server's refusal to connect, by what it said (QA: "too
    many clients already" came with "is the server running and the URL right?")."""
    if "too many clients" in said or "connection slots are reserved" in said:
        return "the server has no connection left: end idle clients or raise max_connections"
    if "too many connections for role" in said:
        return "the user's connection limit is reached: end its idle clients or raise the limit"
    if "password authentication failed" in said or "no password supplied" in said:
        return "check the user and password in the URL"
    if "database" in said and "does not exist" in said:
        return "create that database, or fix its name in the URL"
    return "is the server running and the URL right?"


class _PostgresBackend:
    def __init__(self, url: str, connect_timeout: float) -> None:
        import psycopg  # only PostgreSQL deployments load the driver

        self.description = f"PostgreSQL {redact_url(url)}"
        self.errors: tuple[type[Exception], ...] = (psycopg.Error,)
        self._url = url
        self._connect_timeout = connect_timeout
        self._conn: Any = None
        #: the run's claim: the owner and the connection holding its advisory lock
        self._claim_owner: str | None = None
        self._claim_conn: Any = None
        self._claim_backend: int | None = None  # its server process, while it lives
        self._claim_lock = threading.Lock()  # claim, check and close on different threads
        #: the transaction in progress began (monotonic); the watchdog breaks one that
        #: outlasts TRANSACTION_DEADLINE (a frozen server answers no one: QA, a frozen
        #: store hung `pipeline run` and `status` for good, SIGTERM included)
        self._tx_started: float | None = None
        self._timed_out = False
        self._closed = threading.Event()
        self._connect()
        threading.Thread(
            target=self._watchdog, name="litecdc-metadata-watchdog", daemon=True
        ).start()

    def _watchdog(self) -> None:
        while not self._closed.wait(1.0):
            started, conn = self._tx_started, self._conn
            if started is None or conn is None or conn.closed:
                continue
            if time.monotonic() - started > TRANSACTION_DEADLINE:
                self._timed_out = True
                try:
                    shut_down_socket(conn.pgconn.socket)
                except Exception as exc:  # a connection gone meanwhile: nothing to break
                    log.debug("metadata watchdog: %s", exc)

    def _connect(self, *, wait: float = 0.0) -> None:
        # autocommit: each transaction is an explicit BEGIN/COMMIT block (conn.transaction)
        self._conn = self._new_connection("litecdc-pipeline", wait=wait)
        self._conn.execute(f"SET lock_timeout = {round(LOCK_WAIT * 1000)}")

    def _new_connection(self, application: str, *, wait: float = 0.0, **options: Any) -> Any:
        """An autocommit connection; a server that refuses is asked again for ``wait``
        seconds (one just restarted: QA, `pg_ctl restart` ended `pipeline run`)."""
        import psycopg

        deadline = time.monotonic() + wait
        while True:
            try:
                return psycopg.connect(
                    self._url,
                    autocommit=True,
                    connect_timeout=max(1, round(self._connect_timeout)),
                    application_name=application,
                    **options,
                )
            except psycopg.Error as exc:
                if isinstance(exc, psycopg.OperationalError) and time.monotonic() < deadline:
                    time.sleep(0.5)
                    continue
                said = str(exc).strip()
                raise MetadataError(
                    f"cannot connect to the metadata database {self.description}: {said} "
                    f"({_connect_hint(said)})"
                ) from exc

    def claim(self, owner: str) -> None:
        """A session advisory lock for the owner, on a connection of its own: the server
        drops it when that connection ends (the process killed, the server restarted)."""
        with self._claim_lock:
            if self._closed.is_set():
                raise MetadataError("the metadata store is closed")
            self._claim_unlocked(owner)

    def _claim_unlocked(self, owner: str, *, wait: float = 0.0) -> None:
        """Take the owner's lock; a server that refuses is asked again for ``wait``
        seconds (taken again after a restart: QA, the retake met it still starting)."""
        import psycopg

        key = _owner_lock_key(owner)
        conn = self._new_connection(
            f"{RUN_LOCK_APPLICATION}{_holder()}",
            wait=wait,
            # the server ends the session (and the lock) within ~25 s of this host going
            # silent (a crash, a partition): its default waits 2 hours (review)
            options="-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 "
            "-c tcp_keepalives_count=3",
        )
        try:
            taken = _try_advisory_lock(conn, key)
            holder_pid, holder = (None, None) if taken else _advisory_holder(conn, key)
            if holder_pid is not None and holder_pid == self._claim_backend:
                # the server still keeps this run's own earlier session, whose connection
                # broke on this side only (a partition): end it, and take the lock again
                # once it is gone (it refused itself, naming its own pid: review)
                conn.execute("SELECT pg_terminate_backend(%s)", [holder_pid])
                for _ in range(50):
                    if taken := _try_advisory_lock(conn, key):
                        break
                    time.sleep(0.1)
        except psycopg.Error as exc:
            conn.close()
            raise MetadataError(
                f"metadata database {self.description}: {str(exc).strip()}"
            ) from exc
        if not taken:
            conn.close()
            raise MetadataError(_claimed(owner, self.description, holder))
        self._claim_owner, self._claim_conn = owner, conn
        self._claim_backend = conn.info.backend_pid

    def check_claim(self) -> None:
        """Raise MetadataError when the claim is lost and another run took it: the lock's
        connection broke (a restarted server), and taking it again failed."""
        import psycopg

        with self._claim_lock:
            conn, owner = self._claim_conn, self._claim_owner
            if conn is None or owner is None or self._closed.is_set():
                return
            try:
                with _answer_within(conn, TRANSACTION_DEADLINE):  # (a frozen server)
                    conn.execute("SELECT 1")
                return
            except psycopg.Error as exc:
                log.warning("the run lock's connection to %s broke (%s); taking the lock again",
                            self.description, str(exc).strip())  # fmt: skip
            with contextlib.suppress(psycopg.Error):
                conn.close()
            self._claim_conn = None
            self._claim_unlocked(owner, wait=RECONNECT_WAIT_S)

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[_Tx]:
        import psycopg

        self._timed_out = False
        self._tx_started = time.monotonic()
        try:
            with contextlib.ExitStack() as stack:
                for attempt in range(2):
                    if self._conn is None or self._conn.closed or self._conn.broken:
                        # a restarted server or dropped connection: one reconnect per call
                        log.info("reconnecting to the metadata database %s", self.description)
                        self._connect(wait=RECONNECT_WAIT_S)
                    try:
                        stack.enter_context(self._conn.transaction())
                        break
                    except psycopg.OperationalError:
                        # a connection the server ended since its last use (a restart,
                        # pg_terminate_backend), found at BEGIN, before anything ran: QA,
                        # that one error ended `pipeline run` with the server up
                        if attempt or not self._conn.broken or self._timed_out:
                            raise  # (timed out: a frozen server, not a dropped connection)
                cur = stack.enter_context(self._conn.cursor())
                yield _PostgresTx(cur)
        except psycopg.Error as exc:
            if self._timed_out:
                raise psycopg.OperationalError(
                    f"no answer within {TRANSACTION_DEADLINE:g} s (its connection was broken; "
                    "the next call connects again)"
                ) from exc
            if isinstance(exc, psycopg.errors.LockNotAvailable):
                # (QA: reported as "no answer within 30 s", as if the server had frozen;
                # then with the server's "LINE 1: …" fragment of the statement: docs QA)
                said = exc.diag.message_primary or str(exc).strip().splitlines()[0]
                raise psycopg.OperationalError(
                    f"another client of the database has held a lock on the store's tables "
                    f"for over {LOCK_WAIT:g} s ({said}): end its transaction "
                    "(pg_stat_activity and pg_locks show it)"
                ) from exc
            raise
        finally:
            self._tx_started = None

    def close(self) -> None:
        self._closed.set()
        if self._conn is not None:
            self._conn.close()
        with self._claim_lock:
            conn, self._claim_conn = self._claim_conn, None
        if conn is not None:
            # let go before closing: the server ends a closed session a moment later, and
            # a run started right after this one's end found the lock still held (review)
            with contextlib.suppress(Exception), _answer_within(conn, 5.0):
                conn.execute("SELECT pg_advisory_unlock_all()")
            conn.close()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _dump_key(key: Key, what: str) -> str | None:
    if key is None:
        return None
    try:
        return json.dumps(key, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"{what} {key!r} is not a JSON value: {exc}") from exc


def _load_key(text: str | None) -> Key:
    return None if text is None else json.loads(text)


class MetadataStore:
    """Subscriptions and their progress; open with :meth:`open`, then :meth:`close`.

    ``owner``: when set, the store changes only that owner's subscriptions (a pipeline
    server opens it with its own name, so it can never move another server's progress);
    reading and adding subscriptions are not restricted.
    """

    def __init__(self, backend: _Backend, *, owner: str | None = None, create: bool = True) -> None:
        self._backend = backend
        self._lock = threading.Lock()  # one connection, shared by the server's threads
        self.owner = owner
        self._dialect = "postgresql" if isinstance(backend, _PostgresBackend) else "sqlite"
        self._closed = False
        self._create_schema(create=create)

    @classmethod
    def open(
        cls,
        url: str,
        *,
        owner: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
        create: bool = True,
    ) -> MetadataStore:
        """Open (and create, if new) the store at ``url``: ``sqlite:///abs/path.db``,
        ``sqlite:relative/path.db`` or ``postgresql://user[:password]@host:port/db``.
        Without ``create`` a store that does not exist is refused, not made: a SQLite
        file that is missing or empty, a PostgreSQL database without the store's tables."""
        if not isinstance(url, str) or not url:
            raise MetadataError("metadata URL is empty: use sqlite:///path or postgresql://…")
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        backend: _Backend
        if scheme == "sqlite":
            path = sqlite_path(url)
            if path is None:
                raise MetadataError(f"metadata URL {url!r} names no file: use sqlite:///path.db")
            backend = _SQLiteBackend(path, busy_timeout, create=create)
        elif scheme in ("postgresql", "postgres"):
            backend = _PostgresBackend(url, connect_timeout)
        else:
            raise MetadataError(
                f"unsupported metadata URL {redact_url(url)!r}: "
                "use sqlite:///path/to/file.db or postgresql://user@host:port/dbname"
            )
        log.debug("metadata store: %s", backend.description)
        try:
            return cls(backend, owner=owner, create=create)
        except BaseException:
            backend.close()
            raise

    # --- transactions ----------------------------------------------------------------------

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[_Tx]:
        """One transaction; driver errors become MetadataError here, at the boundary."""
        with self._lock:
            if self._closed:
                raise MetadataError("the metadata store is closed")
            try:
                with self._backend.transaction(write=write) as tx:
                    yield tx
            except self._backend.errors as exc:
                raise MetadataError(
                    f"metadata database {self._backend.description}: {str(exc).strip()}"
                ) from exc

    def _create_schema(self, *, create: bool) -> None:
        if self._schema_is_current():
            return
        with self._tx() as tx:
            if self._dialect == "postgresql":
                # Two servers starting at once would race on CREATE TABLE IF NOT EXISTS.
                tx.execute("SELECT pg_advisory_xact_lock(7262011)")
                # (the SQLite backend checked its file already) docs QA: `pipeline status`
                # made the store's tables in another application's database, or a
                # mistyped one, and said "no subscriptions"
                found = tx.execute("SELECT to_regclass('litecdc_metadata_schema')")
                if not create and found[0][0] is None:
                    raise MetadataError(
                        f"no metadata store in {self._backend.description} (it has no "
                        "litecdc_metadata_schema table): `litecdc pipeline subscribe` makes "
                        "it; check --meta (or LITECDC_PIPELINE_META)"
                    )
            for statement in _SCHEMA:
                tx.execute(statement)
            rows = tx.execute("SELECT version FROM litecdc_metadata_schema")
            if not rows:
                tx.execute("INSERT INTO litecdc_metadata_schema (version) VALUES (?)",
                           [SCHEMA_VERSION])  # fmt: skip
            else:
                self._check_not_newer(rows[0][0])

    def _schema_is_current(self) -> bool:
        """Whether every table and index of the store is there, at this version: opening it
        then writes nothing (QA: `status`, `list` and `verify` failed for a role that may
        only read, and waited 30 s beside a writer holding a SQLite store's lock)."""
        with self._tx(write=False) as tx:
            if self._dialect == "postgresql":
                found = tx.execute(
                    "SELECT " + ", ".join(f"to_regclass('{name}')" for name in _SCHEMA_OBJECTS)
                )[0]
                if any(each is None for each in found):
                    return False
            else:
                marks = ", ".join("?" for _ in _SCHEMA_OBJECTS)
                count = tx.execute(
                    f"SELECT count(*) FROM sqlite_master WHERE name IN ({marks})", _SCHEMA_OBJECTS
                )[0][0]
                if count != len(_SCHEMA_OBJECTS):
                    return False
            rows = tx.execute("SELECT version FROM litecdc_metadata_schema")
        if len(rows) != 1:
            return False
        self._check_not_newer(rows[0][0])
        return bool(rows[0][0] == SCHEMA_VERSION)

    def _check_not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise MetadataError(
                f"the metadata database {self._backend.description} has schema version "
                f"{version}, newer than this litecdc ({SCHEMA_VERSION}): upgrade litecdc"
            )

    def _lock_suffix(self) -> str:
        # SQLite's BEGIN IMMEDIATE already serialises writers; PostgreSQL locks the row.
        return " FOR UPDATE" if self._dialect == "postgresql" else ""

    def _find(self, tx: _Tx, name: str, *, for_update: bool) -> Subscription | None:
        """The subscription, locking its row when it is about to change (the lock every
        change takes first, so concurrent changes of one subscription run one at a time)."""
        suffix = self._lock_suffix() if for_update else ""
        rows = tx.execute(
            f"SELECT {_SUBSCRIPTION_COLUMNS} FROM litecdc_subscriptions WHERE name = ?{suffix}",
            [name],
        )
        if not rows:
            return None
        sub = _subscription_from_row(rows[0])
        if for_update and self.owner is not None and sub.owner != self.owner:
            raise MetadataError(
                f"subscription {name!r} belongs to owner {sub.owner!r}, "
                f"not to this server ({self.owner!r})"
            )
        return sub

    def _subscription(self, tx: _Tx, name: str, *, for_update: bool) -> Subscription:
        sub = self._find(tx, name, for_update=for_update)
        if sub is None:
            raise UnknownSubscriptionError(name)
        return sub

    def _head(self, tx: _Tx, name: str) -> tuple[str, int | None, int | None] | None:
        """(stage, init cid, last log index) of the subscription-level row, if registered."""
        rows = tx.execute(
            "SELECT stage, init_snapshot_version, last_log_index FROM litecdc_progress "
            "WHERE subscription = ? AND range_id = ?",
            [name, SUBSCRIPTION_RANGE],
        )
        if not rows:
            return None
        return str(rows[0][0]), rows[0][1], rows[0][2]

    # --- subscriptions ---------------------------------------------------------------------

    def add_subscription(
        self,
        name: str,
        *,
        table_name: str,
        sources: Sequence[str],
        sink: str,
        cluster: str = DEFAULT_CLUSTER,
        db: str = DEFAULT_DB,
        subscriber: str | None = None,
        options: dict[str, Any] | None = None,
        owner: str | None = None,
    ) -> Subscription:
        """Add a subscription. Adding the same definition again returns the existing one;
        a different subscription under a taken name is an error."""
        if not isinstance(name, str) or not name.strip():
            raise MetadataError("a subscription needs a non-empty name")
        if not table_name:
            raise MetadataError(f"subscription {name!r}: table_name is empty")
        if (
            isinstance(sources, str)
            or not sources
            or not all(isinstance(s, str) and s for s in sources)
        ):
            raise MetadataError(
                f"subscription {name!r}: sources must be a non-empty list of node URLs"
            )
        if not sink:
            raise MetadataError(f"subscription {name!r}: sink is empty")
        if (problem := subscriber_name_problem(subscriber or name)) is not None:
            # the name is the hold's name on the node unless a subscriber is given
            raise MetadataError(f"subscription {name!r}: {problem}")
        try:
            options_json = json.dumps(options or {}, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise MetadataError(f"subscription {name!r}: options are not JSON: {exc}") from exc
        wanted = Subscription(
            name=name,
            table_name=table_name,
            sources=tuple(sources),
            sink=sink,
            cluster=cluster,
            db=db,
            subscriber=subscriber or name,
            options=dict(options or {}),
            owner=owner or self.owner or DEFAULT_OWNER,
        )
        now = _now()
        with self._tx() as tx:
            inserted = tx.execute(
                f"INSERT INTO litecdc_subscriptions ({_SUBSCRIPTION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING "
                "RETURNING name",
                [
                    wanted.name,
                    wanted.cluster,
                    wanted.db,
                    wanted.table_name,
                    wanted.subscriber,
                    json.dumps(list(wanted.sources)),
                    wanted.sink,
                    options_json,
                    wanted.owner,
                    False,
                    now,
                    now,
                ],
            )
            if inserted:
                # (one an earlier version's remove_subscription left: another history's)
                tx.execute("DELETE FROM litecdc_source_marks WHERE subscription = ?", [name])
            existing = self._subscription(tx, name, for_update=False)
        if not existing.same_definition(wanted) or existing.cancel:
            raise MetadataError(
                f"a subscription named {name!r} already exists (table {existing.table_name!r}, "
                f"sink {redact_url(existing.sink)!r}, owner {existing.owner!r}"
                + (", being cancelled" if existing.cancel else "")
                + "): choose another name or remove it first"
            )
        if inserted:
            log.info("subscription %s added (table %s, owner %s)", name, table_name, wanted.owner)
        return existing

    def get_subscription(self, name: str) -> Subscription:
        with self._tx(write=False) as tx:
            return self._subscription(tx, name, for_update=False)

    def list_subscriptions(
        self, owner: str | None = None, *, include_cancelled: bool = False
    ) -> list[Subscription]:
        """Subscriptions by name; only ``owner``'s when given; cancelled ones on request."""
        sql = f"SELECT {_SUBSCRIPTION_COLUMNS} FROM litecdc_subscriptions WHERE 1 = 1"
        params: list[object] = []
        if owner is not None:
            sql += " AND owner = ?"
            params.append(owner)
        if not include_cancelled:
            sql += " AND cancel = ?"
            params.append(False)
        with self._tx(write=False) as tx:
            rows = tx.execute(sql + " ORDER BY name", params)
        return [_subscription_from_row(r) for r in rows]

    def request_cancel(self, name: str) -> Subscription:
        """Mark the subscription for unsubscribing; its server releases the hold and removes it."""
        with self._tx() as tx:
            sub = self._subscription(tx, name, for_update=True)
            if not sub.cancel:
                tx.execute(
                    "UPDATE litecdc_subscriptions SET cancel = ?, updated_at = ? WHERE name = ?",
                    [True, _now(), name],
                )
                log.info("subscription %s: unsubscribe requested", name)
            return self._subscription(tx, name, for_update=False)

    def remove_subscription(self, name: str) -> bool:
        """Delete the subscription and its progress; False when it was already gone."""
        with self._tx() as tx:
            if self._find(tx, name, for_update=True) is None:
                return False
            tx.execute("DELETE FROM litecdc_progress WHERE subscription = ?", [name])
            tx.execute("DELETE FROM litecdc_subscription_state WHERE subscription = ?", [name])
            tx.execute("DELETE FROM litecdc_source_marks WHERE subscription = ?", [name])
            tx.execute("DELETE FROM litecdc_subscriptions WHERE name = ?", [name])
        log.info("subscription %s removed", name)
        return True

    # --- state kept by `pipeline run` ------------------------------------------------------

    def mirrored_spec(self, name: str) -> dict[str, Any] | None:
        """The table description (TableSpec JSON) the subscription's sink mirrors, or None
        before its sink was first opened."""
        row = self._state(name, "mirrored_spec")
        return None if row is None else dict(json.loads(row[0]))

    def set_mirrored_spec(self, name: str, spec: dict[str, Any]) -> None:
        self._set_state(name, "mirrored_spec = ?", [json.dumps(spec, sort_keys=True)])

    def failure(self, name: str) -> tuple[str, str] | None:
        """(error, since when as ISO text) while the subscription is failing, else None."""
        row = self._state(name, "last_error, error_at")
        return None if row is None else (str(row[0]), str(row[1]))

    def set_failure(self, name: str, error: str | None) -> None:
        """Record the error the subscription fails with (None: it works again)."""
        if error is None:
            self._set_state(name, "last_error = NULL, error_at = NULL", [])
        else:
            self._set_state(
                name,
                "last_error = ?, error_at = COALESCE(error_at, ?)",
                [error, _now()],
            )

    def _state(self, name: str, columns: str) -> tuple[Any, ...] | None:
        with self._tx(write=False) as tx:
            rows = tx.execute(
                f"SELECT {columns} FROM litecdc_subscription_state WHERE subscription = ?",
                [name],
            )
        return rows[0] if rows and rows[0][0] is not None else None

    def _set_state(self, name: str, assignments: str, params: list[object]) -> None:
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            now = _now()
            tx.execute(
                "INSERT INTO litecdc_subscription_state (subscription, updated_at) VALUES (?, ?) "
                "ON CONFLICT (subscription) DO NOTHING",
                [name, now],
            )
            tx.execute(
                f"UPDATE litecdc_subscription_state SET {assignments}, updated_at = ? "
                "WHERE subscription = ?",
                [*params, now, name],
            )

    # --- progress --------------------------------------------------------------------------

    def progress(self, name: str) -> Progress:
        with self._tx(write=False) as tx:
            self._subscription(tx, name, for_update=False)
            rows = tx.execute(
                f"SELECT {_PROGRESS_COLUMNS} FROM litecdc_progress "
                "WHERE subscription = ? ORDER BY range_id",
                [name],
            )
        return _progress_from_rows(name, rows)

    def start_register(self, name: str, init_cid: int) -> Progress:
        """Record the cid the source returned on register (stage 'register').

        While still in 'register', a new register call's cid replaces the old one (no data
        was copied yet); once past it, the same cid is a no-op retry and another is an error.
        """
        _check_cid(init_cid, "init_cid")
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            head = self._head(tx, name)
            now = _now()
            if head is None:
                tx.execute(
                    "INSERT INTO litecdc_progress (subscription, range_id, stage, "
                    "init_snapshot_version, rows_copied, updated_at) VALUES (?, ?, ?, ?, 0, ?)",
                    [name, SUBSCRIPTION_RANGE, STAGE_REGISTER, init_cid, now],
                )
            elif head[0] == STAGE_REGISTER:
                if head[1] != init_cid:
                    tx.execute(
                        "UPDATE litecdc_progress SET init_snapshot_version = ?, updated_at = ? "
                        "WHERE subscription = ? AND range_id = ?",
                        [init_cid, now, name, SUBSCRIPTION_RANGE],
                    )
            elif head[1] != init_cid:
                raise MetadataError(
                    f"subscription {name!r} is past register (stage {head[0]!r}, registered at "
                    f"cid {head[1]}): stages only move forward; use restart_snapshot to "
                    "snapshot again"
                )
        log.info("subscription %s: registered at cid %d", name, init_cid)
        return self.progress(name)

    def restart_snapshot(self, name: str, init_cid: int) -> Progress:
        """Start over from 'register' at ``init_cid``: drops the snapshot ranges and the log
        position. The only way a stage goes back (e.g. the source pruned the log past us)."""
        _check_cid(init_cid, "init_cid")
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            tx.execute("DELETE FROM litecdc_progress WHERE subscription = ?", [name])
            tx.execute(
                "INSERT INTO litecdc_progress (subscription, range_id, stage, "
                "init_snapshot_version, rows_copied, updated_at) VALUES (?, ?, ?, ?, 0, ?)",
                [name, SUBSCRIPTION_RANGE, STAGE_REGISTER, init_cid, _now()],
            )
        log.warning("subscription %s: snapshot restarted at cid %d", name, init_cid)
        return self.progress(name)

    def set_ranges(self, name: str, ranges: Sequence[tuple[Key, Key]]) -> Progress:
        """Split the snapshot into key ranges ``[(lower, upper), …]`` (lower inclusive, upper
        exclusive, None = unbounded) and move to 'snapshot'. Setting the same ranges again
        is a no-op; different ranges once the snapshot started need restart_snapshot."""
        if not ranges:
            raise MetadataError(
                f"subscription {name!r}: a snapshot needs at least one range "
                "((None, None) for the whole table)"
            )
        dumped = [
            (_dump_key(lo, "range lower key"), _dump_key(hi, "range upper key"))
            for lo, hi in ranges
        ]
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            head = self._head(tx, name)
            if head is None:
                raise MetadataError(f"subscription {name!r} is not registered yet")
            stage, init_cid, _ = head
            if stage == STAGE_REGISTER:
                now = _now()
                for range_id, (lo, hi) in enumerate(dumped):
                    tx.execute(
                        "INSERT INTO litecdc_progress (subscription, range_id, stage, "
                        "init_snapshot_version, lower_key, upper_key, rows_copied, updated_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, 0, ?)",
                        [name, range_id, STAGE_SNAPSHOT, init_cid, lo, hi, now],
                    )
                self._set_stage(tx, name, STAGE_SNAPSHOT, now)
            else:
                current = tx.execute(
                    "SELECT lower_key, upper_key FROM litecdc_progress "
                    "WHERE subscription = ? AND range_id >= 0 ORDER BY range_id",
                    [name],
                )
                if [tuple(r) for r in current] != dumped:
                    raise MetadataError(
                        f"subscription {name!r} already has its snapshot ranges (stage "
                        f"{stage!r}): stages only move forward; use restart_snapshot to "
                        "split the table again"
                    )
        log.info("subscription %s: snapshot in %d range(s)", name, len(ranges))
        return self.progress(name)

    def record_chunk(
        self,
        name: str,
        range_id: int,
        last_key: Key,
        read_cid: int,
        rows: int,
        done: bool,
    ) -> RangeProgress:
        """A snapshot chunk of ``range_id`` was written to the sink: it ended at ``last_key``
        (None for an empty chunk), was read at ``read_cid`` and held ``rows`` rows; ``done``
        when it was the range's last. Recording the same chunk twice counts it once."""
        _check_cid(read_cid, "read_cid")
        if rows < 0:
            raise MetadataError(f"rows must be >= 0, got {rows}")
        key_json = _dump_key(last_key, "last key")
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            head = self._head(tx, name)
            stage = head[0] if head else "not registered"
            found = tx.execute(
                "SELECT stage, last_snapshot_key FROM litecdc_progress "
                "WHERE subscription = ? AND range_id = ?",
                [name, range_id],
            )
            if stage in (STAGE_SNAPSHOT, STAGE_INCREMENTAL) and (range_id < 0 or not found):
                raise MetadataError(f"subscription {name!r} has no snapshot range {range_id}")
            range_stage, last_json = found[0] if found else (None, None)
            # A retry of the chunk already recorded (paging keys only grow, so the last key
            # identifies the chunk; an empty final chunk leaves the key as it was).
            retry = key_json == last_json if key_json is not None else range_stage == RANGE_DONE
            finished_retry = retry and range_stage == RANGE_DONE
            if stage != STAGE_SNAPSHOT and not (stage == STAGE_INCREMENTAL and finished_retry):
                raise MetadataError(
                    f"subscription {name!r} is not in the snapshot stage ({stage}): "
                    "snapshot chunks cannot be recorded"
                )
            if range_stage == RANGE_DONE and not retry:
                raise MetadataError(
                    f"subscription {name!r}: snapshot range {range_id} is already done"
                )
            if not retry:
                tx.execute(
                    "UPDATE litecdc_progress SET stage = ?, current_snapshot_version = ?, "
                    "last_snapshot_key = COALESCE(?, last_snapshot_key), "
                    "rows_copied = rows_copied + ?, updated_at = ? "
                    "WHERE subscription = ? AND range_id = ?",
                    [
                        RANGE_DONE if done else STAGE_SNAPSHOT,
                        read_cid,
                        key_json,
                        rows,
                        _now(),
                        name,
                        range_id,
                    ],
                )
            elif done and range_stage != RANGE_DONE:
                # The chunk was recorded, then found to be the last one.
                tx.execute(
                    "UPDATE litecdc_progress SET stage = ?, updated_at = ? "
                    "WHERE subscription = ? AND range_id = ?",
                    [RANGE_DONE, _now(), name, range_id],
                )
            result = tx.execute(
                f"SELECT {_PROGRESS_COLUMNS} FROM litecdc_progress "
                "WHERE subscription = ? AND range_id = ?",
                [name, range_id],
            )
        return _range_from_row(result[0])

    def finish_snapshot(self, name: str) -> Progress:
        """Every range is done: move to 'incremental', the log applied through the init cid."""
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            head = self._head(tx, name)
            if head is None:
                raise MetadataError(f"subscription {name!r} is not registered yet")
            stage, init_cid, _ = head
            if stage == STAGE_REGISTER:
                raise MetadataError(f"subscription {name!r} has no snapshot ranges yet")
            if stage == STAGE_SNAPSHOT:
                pending = tx.execute(
                    "SELECT range_id FROM litecdc_progress "
                    "WHERE subscription = ? AND range_id >= 0 AND stage <> ? ORDER BY range_id",
                    [name, RANGE_DONE],
                )
                if pending:
                    ids = ", ".join(str(r[0]) for r in pending)
                    raise MetadataError(
                        f"subscription {name!r}: snapshot ranges not done yet: {ids}"
                    )
                now = _now()
                self._set_stage(tx, name, STAGE_INCREMENTAL, now)
                tx.execute(
                    "UPDATE litecdc_progress SET last_log_index = ? "
                    "WHERE subscription = ? AND range_id = ?",
                    [init_cid, name, SUBSCRIPTION_RANGE],
                )
                log.info("subscription %s: snapshot done, incremental from cid %s", name, init_cid)
        return self.progress(name)

    def source_mark(self, name: str) -> tuple[int, str] | None:
        """(cid, the source's mark of that commit) last recorded, or None."""
        with self._tx(write=False) as tx:
            rows = tx.execute(
                "SELECT cid, mark FROM litecdc_source_marks WHERE subscription = ?", [name]
            )
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def record_source_mark(self, name: str, cid: int, mark: str) -> None:
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            self._set_source_mark(tx, name, cid, mark)

    def _set_source_mark(self, tx: _Tx, name: str, cid: int, mark: str) -> None:
        now = _now()
        tx.execute(
            "INSERT INTO litecdc_source_marks (subscription, cid, mark, updated_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (subscription) DO UPDATE SET cid = excluded.cid, "
            "mark = excluded.mark, updated_at = excluded.updated_at "
            # only forward: the mark of a snapshot's newest copied row stays until the
            # change log passes it
            "WHERE litecdc_source_marks.cid <= excluded.cid",
            [name, cid, mark, now],
        )

    def record_log_position(self, name: str, cid: int, mark: str | None = None) -> int:
        """The change log is applied through ``cid`` (the source's commit ``mark``, when
        known: see source_mark). Only moves forward: a smaller cid (a late or replayed
        batch) is ignored. Returns the recorded position."""
        _check_cid(cid, "cid")
        with self._tx() as tx:
            self._subscription(tx, name, for_update=True)
            head = self._head(tx, name)
            if head is None or head[0] != STAGE_INCREMENTAL:
                stage = head[0] if head else "not registered"
                raise MetadataError(
                    f"subscription {name!r} is not in the incremental stage ({stage}): "
                    "finish the snapshot first"
                )
            tx.execute(
                "UPDATE litecdc_progress SET last_log_index = ?, updated_at = ? "
                "WHERE subscription = ? AND range_id = ? "
                "AND (last_log_index IS NULL OR last_log_index < ?)",
                [cid, _now(), name, SUBSCRIPTION_RANGE, cid],
            )
            head = self._head(tx, name)
            assert head is not None and head[2] is not None
            if mark is not None and head[2] == cid:
                self._set_source_mark(tx, name, cid, mark)
        return head[2]

    def _set_stage(self, tx: _Tx, name: str, stage: str, now: str) -> None:
        tx.execute(
            "UPDATE litecdc_progress SET stage = ?, updated_at = ? "
            "WHERE subscription = ? AND range_id = ?",
            [stage, now, name, SUBSCRIPTION_RANGE],
        )

    # --- one run per owner -------------------------------------------------------------

    def claim_owner(self) -> None:
        """Make this the only `pipeline run` of its owner until :meth:`close` (or the
        process ends): MetadataError when another holds the owner. Two runs of one owner
        raced on the same progress rows — each moved the source's hold past the other's
        position, so the other found its changes pruned and re-copied the whole table,
        over and over, and their Delta commits collided (pipeline QA)."""
        if self.owner is None:
            raise MetadataError("claim_owner needs a store opened for an owner")
        with self._lock:
            if self._closed:
                raise MetadataError("the metadata store is closed")
            self._backend.claim(self.owner)

    def check_owner_claim(self) -> None:
        """MetadataError when this run lost its owner claim to another (the claim has a
        connection of its own: the store's lock is not taken)."""
        if not self._closed:
            self._backend.check_claim()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._backend.close()

    def __enter__(self) -> MetadataStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _check_cid(cid: int, what: str) -> None:
    if isinstance(cid, bool) or not isinstance(cid, int) or cid < 0:
        raise MetadataError(f"{what} must be a cid (an integer >= 0), got {cid!r}")


def _subscription_from_row(row: Sequence[Any]) -> Subscription:
    (name, cluster, db, table_name, subscriber, sources, sink, options, owner, cancel,
     created_at, updated_at) = row  # fmt: skip
    return Subscription(
        name=name,
        table_name=table_name,
        sources=tuple(json.loads(sources)),
        sink=sink,
        cluster=cluster,
        db=db,
        subscriber=subscriber,
        options=json.loads(options),
        owner=owner,
        cancel=bool(cancel),
        created_at=_time(created_at),
        updated_at=_time(updated_at),
    )


def _range_from_row(row: Sequence[Any]) -> RangeProgress:
    (range_id, stage, init_v, current_v, lower, upper, last_key, _log, rows, updated) = row
    return RangeProgress(
        range_id=int(range_id),
        stage=stage,
        lower_key=_load_key(lower),
        upper_key=_load_key(upper),
        last_snapshot_key=_load_key(last_key),
        init_snapshot_version=init_v,
        current_snapshot_version=current_v,
        rows_copied=int(rows),
        updated_at=_time(updated),
    )


def _progress_from_rows(name: str, rows: Sequence[Sequence[Any]]) -> Progress:
    if not rows or rows[0][0] != SUBSCRIPTION_RANGE:
        return Progress(subscription=name, stage=None, init_snapshot_version=None,
                        last_log_index=None)  # fmt: skip
    head = rows[0]
    return Progress(
        subscription=name,
        stage=head[1],
        init_snapshot_version=head[2],
        last_log_index=head[7],
        ranges=tuple(_range_from_row(r) for r in rows[1:]),
        updated_at=_time(head[9]),
    )


__all__ = [
    "RANGE_DONE",
    "STAGES",
    "STAGE_INCREMENTAL",
    "STAGE_REGISTER",
    "STAGE_SNAPSHOT",
    "SUBSCRIPTION_RANGE",
    "MetadataStore",
    "Progress",
    "RangeProgress",
    "Subscription",
    "redact_url",
    "sqlite_url",
]


#: the first key of the pipeline's PostgreSQL advisory locks (the schema lock uses 7262011)
RUN_LOCK_CLASS = 7262012
#: the start of a claim connection's application_name (63 bytes at most: kept short)
RUN_LOCK_APPLICATION = "litecdc-run "


def _owner_tag(owner: str) -> str:
    """A file-name-safe, fixed-size tag for ``owner`` (any text may name an owner)."""
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


def _owner_lock_key(owner: str) -> int:
    """The owner's advisory lock key: a signed 32-bit integer, as PostgreSQL takes it."""
    return int.from_bytes(hashlib.sha256(owner.encode()).digest()[:4], "big", signed=True)


def _holder() -> str:
    """Who holds a claim, for the message another run gets."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


def _claimed(owner: str, store: str, holder: str | None) -> str:
    by = f" ({holder})" if holder else ""
    return (
        f"another `litecdc pipeline run` of owner {owner!r} is running on the metadata "
        f"store {store}{by}: one run per owner — stop that one first, or run this one "
        "with another --owner"
    )


def _try_advisory_lock(conn: Any, key: int) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", [RUN_LOCK_CLASS, key]).fetchone()
    return bool(row and row[0])


def _advisory_holder(conn: Any, key: int) -> tuple[int | None, str | None]:
    """Who holds the owner's lock in this database: its server process and who it says
    it is (a run's application name), when visible."""
    row = conn.execute(
        "SELECT l.pid, a.application_name FROM pg_locks l "
        "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "  # (two-key form)
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND l.classid::bigint = %s AND l.objid::bigint = %s",
        [RUN_LOCK_CLASS, key & 0xFFFFFFFF],
    ).fetchone()
    if row is None:
        return None, None
    pid, name = row
    prefix = RUN_LOCK_APPLICATION
    ours = isinstance(name, str) and name.startswith(prefix)
    return pid, name[len(prefix) :] if ours else None


@contextmanager
def _answer_within(conn: Any, seconds: float) -> Iterator[None]:
    """Break ``conn``'s socket if the server has not answered within ``seconds`` (a frozen
    server answers no one); the socket is looked up when the time is up."""

    def break_it() -> None:
        with contextlib.suppress(Exception):  # (a connection closed meanwhile)
            if not conn.closed:
                shut_down_socket(conn.pgconn.socket)

    timer = threading.Timer(seconds, break_it)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
