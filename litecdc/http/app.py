"""The HTTP API: rqlite's endpoints plus litecdc's journal and change log.

Each handler does four things, in rqlite's order: check the permission (HTTP 401), check
the method (HTTP 405), parse the request, make ONE store call in a worker thread (the
store is synchronous and thread-safe) and format its answer. Nothing here touches SQLite.

Routing and headers follow rqlite's ``Service.ServeHTTP`` (http/service.go): every answer
carries ``X-RQLITE-VERSION`` and the CORS headers, ``OPTIONS`` on any path is 200, and
rqlite's endpoints are matched by prefix in rqlite's order (``/db/execute/`` is
``/db/execute``), with no redirects but ``/`` to ``/status``. litecdc's own endpoints are
exact paths, none of which starts with an rqlite prefix.

Errors: a malformed request gets HTTP 400 before the store is called, so it changes
nothing. rqlite endpoints answer errors as ``text/plain`` (as Go's ``http.Error`` does);
litecdc's own endpoints answer ``{"error": "..."}``. A failing SQL statement is not an
HTTP error: it is an ``error`` entry in ``results`` with HTTP 200, as in rqlite.
See docs/http-api.md for every endpoint's parameters and bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import gzip
import json
import logging
import os
import platform
import resource
import shutil
import socket
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Protocol

import anyio
import apsw
import msgspec
from anyio import CapacityLimiter, to_thread
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from litecdc.cdc.config import shown_cdc_config
from litecdc.cdc.service import CDCService
from litecdc.config import NodeConfig
from litecdc.db.datafile import SQLITE_HEADER
from litecdc.db.read_limit import ReadLimit
from litecdc.durations import format_go_duration
from litecdc.errors import (
    BodyTimeoutError,
    BodyTooLargeError,
    LitecdcError,
    LoadError,
    NotLeaderError,
    NotReadyError,
    OtherHistoryError,
    RequestError,
    StatementError,
    StorageFullError,
    UnsupportedEncodingError,
    http_status_for,
)
from litecdc.http import rqlite
from litecdc.http.auth import CredentialStore, parse_basic_auth
from litecdc.http.forward import LeaderForwarder
from litecdc.http.metrics import NodeMetrics
from litecdc.http.protocol import READ_SIDE_CLOSED
from litecdc.results import MAX_CID, MAX_SEQ, Statement, WriteOutcome
from litecdc.store import Store
from litecdc.wire import (
    ARROW_STREAM,
    decode_key,
    encode_key,
    ipc_chunks,
    release_unused_memory,
    table_to_json,
)

__all__ = ["JOURNAL_PAGE_DEFAULT", "OWN_ROUTE_PATHS", "RQLITE_ENDPOINTS", "create_app"]

log = logging.getLogger("litecdc.http")

JOURNAL_PAGE_DEFAULT = 1000
#: events of a change page past which the memory it took is handed back once it is sent:
#: Arrow's allocator kept it (a 1.5M-event page left the node ~115 MB bigger, each time)
RELEASE_MEMORY_AFTER_EVENTS = 100_000
#: how long ``/readyz?sync`` waits for the node to apply the log's head by default (s)
READYZ_SYNC_TIMEOUT = 5.0
#: the longest wait ``/readyz?sync`` takes (s): a larger timeout is cut to it
READYZ_SYNC_MAX_TIMEOUT = 60.0
#: longest a read with min_cid waits for this node to apply that cid, in seconds
MIN_CID_WAIT = 10.0
#: ... on a standalone node, which writes its history alone: a cid beyond its head is
#: another history's, unless its commit is being published right now
STANDALONE_CID_WAIT = 1.0

_encoder = msgspec.json.Encoder()
_JSON = "application/json; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"

Handler = Callable[[Request], Awaitable[Response]]


def _package_version() -> str:
    try:
        return version("litecdc")
    except PackageNotFoundError:
        return "unknown"


VERSION = _package_version()
#: ``X-RQLITE-VERSION`` on every response. rqlite sends its build version ("v8.36.5");
#: its clients only show or return the header (the rqlite shell's "running version ...",
#: rqlite-go-http's Client.Version()), so litecdc names itself rather than pose as an
#: rqlite release a client could compare against.
VERSION_HEADER = f"litecdc/{VERSION}"


class _HttpStats:
    """Counters of the HTTP API under rqlite's expvar names (``stats`` in http/service.go),
    served by /debug/vars; ``queued_statements_failed`` is litecdc's."""

    NAMES = (
        "executions",
        "execute_stmts_rx",
        "queued_executions",
        "queued_executions_ok",
        "queued_executions_num_stmts_rx",
        "queued_executions_num_stmts_tx",
        "queued_executions_wait",
        "queued_statements_failed",
        "queries",
        "query_stmts_rx",
        "requests",
        "request_stmts_rx",
        "backups",
        "loads",
        "boot",
        "num_status",
        "num_readyz",
        "authOK",
        "authFail",
    )

    def __init__(self) -> None:
        self._counts = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, n: int = 1) -> None:
        self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self._counts)


class _WriteQueue:
    """The sequence numbers of queued writes (``?queue``), as rqlite's queue.Queue hands
    them out (queue/queue.go): the first is the start time in nanoseconds plus one and each
    request takes the next, so they keep growing across restarts. ``processed`` is the
    number of the last request answered: /status ``http.queue._default.sequence_number``.

    litecdc has no batching queue: a queued request is run before it is answered (see
    _Api.queued_execute), so there is nothing else to report. Handlers run on the event
    loop, so taking a number needs no lock."""

    def __init__(self) -> None:
        self._last = time.time_ns()
        self.processed = 0

    def take(self) -> int:
        self._last += 1
        return self._last

    def done(self, number: int) -> None:
        self.processed = max(self.processed, number)


#: threads the writes run on, apart from anyio's default 40 that every other call shares
WRITE_THREADS = 40
#: threads bcrypt password checks run on (each takes a core for tens of milliseconds)
AUTH_THREADS = 2
#: /db/backup copies the database into the data directory under this prefix, then sends
#: the copy: on the data's own disk (not /tmp, maybe a small tmpfs), and a copy left by a
#: node killed meanwhile is removed at its next start (it leaked in /tmp: backup QA)
BACKUP_FILE_PREFIX = ".backup-"
#: seconds a request body may go without a byte arriving (a request's head has its own
#: limit: litecdc/http/protocol.py)
BODY_IDLE_TIMEOUT_S = 30.0


def _json(doc: Any, *, status: int = 200, pretty: bool = False) -> Response:
    body = _encoder.encode(doc)
    if pretty:
        body = msgspec.json.format(body, indent=4)
    return Response(body, status_code=status, media_type=_JSON)


def _text_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(f"{message}\n", status_code=status, media_type=_TEXT, headers=headers)


def _go_time(moment: datetime) -> str:
    """A time as Go's encoding/json writes it (RFC 3339 with nanoseconds)."""
    text = moment.isoformat()
    return text.replace("+00:00", "Z")


class ClusterMember(Protocol):
    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def applied_cid(self) -> int: ...
    @property
    def applied_revision(self) -> int: ...


class KnownClusterMember(Protocol):
    """A node that joined the cluster, running or not (litecdc.cluster.KnownMember)."""

    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def live(self) -> ClusterMember | None: ...
    @property
    def error(self) -> str | None: ...


class ClusterView(Protocol):
    """What the API shows of a cluster node (litecdc.cluster.ClusterNode)."""

    def is_leader(self) -> bool: ...
    def leader(self) -> tuple[str, str] | None: ...
    def status(self) -> dict[str, object]: ...
    def log_head_cid(self, timeout: float | None = None) -> int: ...
    def known_members(self) -> Sequence[KnownClusterMember]: ...
    def remove_member(self, node_id: str) -> None: ...


class _Api:
    """The handlers, bound to one store and configuration."""

    def __init__(
        self, store: Store, config: NodeConfig, cdc: CDCService | None, cluster: ClusterView | None
    ) -> None:
        self.store = store
        self.config = config
        self.cdc = cdc
        self.cluster = cluster
        self.node_metrics = NodeMetrics(store, cdc, cluster.status if cluster else None)
        self.credentials = (
            CredentialStore.from_file(config.auth_file) if config.auth_file is not None else None
        )
        self.tls = config.http_cert is not None
        self.scheme = "https" if self.tls else "http"
        self.started = datetime.now(UTC)
        self.last_backup: datetime | None = None
        remove_backup_copies(config.data_dir, left_by_a_crash=True)
        self.stats = _HttpStats()
        self.queue = _WriteQueue()
        #: writes run on threads of their own: reads that take long or wait (min_cid), from
        #: clients that may have left, held all of anyio's 40 and stalled every write (QA)
        self.write_threads = CapacityLimiter(WRITE_THREADS)
        #: bcrypt password checks run on threads of their own, a few: guessers queue there
        self.auth_threads = CapacityLimiter(AUTH_THREADS)
        #: forwards writes to the leader; readyz checks the leader through it (set by create_app)
        self.forwarder: LeaderForwarder | None = None

    # -- plumbing ----------------------------------------------------------------------
    async def _denied(self, request: Request, perms: tuple[str, ...]) -> Response | None:
        credentials = self.credentials
        if credentials is None:
            return None
        username, password = parse_basic_auth(request.headers.get("authorization"))
        if credentials.needs_hashing(username, password):
            # a bcrypt check takes tens of milliseconds of CPU: on the event loop, four
            # clients guessing passwords slowed every other request 200-fold (security QA)
            allowed = await to_thread.run_sync(
                lambda: credentials.allows_all(username, password, perms),
                limiter=self.auth_threads,
            )
        else:
            allowed = credentials.allows_all(username, password, perms)
        if allowed:
            self.stats.add("authOK")
            return None
        self.stats.add("authFail")
        need = " and ".join(repr(p) for p in perms)
        return _text_error(
            401,
            f"unauthorized: this request needs the {need} permission"
            + ("s" if len(perms) > 1 else ""),
            headers={"WWW-Authenticate": 'Basic realm="litecdc"'},
        )

    async def _gate(
        self, request: Request, perms: tuple[str, ...], methods: tuple[str, ...]
    ) -> Response | None:
        """rqlite's order: permission first (401), then method (405)."""
        return await self._denied(request, perms) or self._wrong_method(request, methods)

    @staticmethod
    def _wrong_method(request: Request, allowed: tuple[str, ...]) -> Response | None:
        if request.method in allowed:
            return None
        return _text_error(
            405,
            f"method {request.method} is not allowed on {request.url.path}; "
            f"use {' or '.join(allowed)}",
            headers={"Allow": ", ".join(allowed)},
        )

    async def _body(self, request: Request) -> bytes:
        limit = self.config.max_body_bytes
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise UnsupportedEncodingError(
                f"unsupported Content-Encoding {encoding!r}: send the body uncompressed"
            )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(
                f"request body too large: {declared} bytes, the limit is {limit} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        stream = request.stream()
        while True:
            try:
                with anyio.fail_after(BODY_IDLE_TIMEOUT_S):
                    chunk = await anext(stream)
            except StopAsyncIteration:
                break
            except TimeoutError:
                # (a body trickling in, or stopped, held its connection forever: QA)
                raise BodyTimeoutError(
                    f"request timeout: no part of the body arrived for {BODY_IDLE_TIMEOUT_S:g} s "
                    f"({size} bytes came)"
                ) from None
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(
                    f"request body too large: more than {limit} bytes, the limit is {limit} bytes"
                )
            chunks.append(chunk)
        body = b"".join(chunks)
        request.state.body = body  # kept for forwarding to the leader
        return body

    async def _statements(self, request: Request) -> list[Statement]:
        body = await self._body(request)
        return rqlite.parse_statements(body, request.headers.get("content-type"))

    # -- rqlite endpoints ----------------------------------------------------------------
    async def execute(self, request: Request) -> Response:
        if r := await self._gate(request, ("execute",), ("POST",)):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        if opts.queue:
            return await self.queued_execute(request, opts, start)
        statements = await self._statements(request)
        self.stats.add("execute_stmts_rx", len(statements))

        def write() -> WriteOutcome | None:
            # (a text of several statements goes on as a write: telling whether it only
            # reads would run its reads — twice, and under db_timeout, which is not a
            # write's — review)
            if self.store.is_read_only(statements, run=False):
                return None
            return self.store.execute(statements, transaction=opts.transaction)

        outcome = await to_thread.run_sync(write, limiter=self.write_threads)
        if outcome is None:
            # reads alone (a SELECT sent here; nothing is journaled) run as /db/request
            # runs them: under db_timeout, stopped when the client leaves, on no write
            # thread. As a write one held every other write back while it ran (HTTP QA: a
            # runaway recursive CTE, its client gone at once, for 5 minutes)
            limit = ReadLimit(opts.db_timeout, _client_gone(request))
            outcome = await to_thread.run_sync(
                lambda: self.store.request(
                    statements, transaction=opts.transaction, read_only=True, limit=limit
                )
            )
        doc = {
            "results": rqlite.format_results(
                outcome.results, timings=opts.timings, blob_array=opts.blob_array
            )
        }
        return self._finish(doc, opts, start, outcome.raft_index, outcome.log_revision)

    async def queued_execute(
        self, request: Request, opts: rqlite.QueryOptions, start: float
    ) -> Response:
        """rqlite's queuedExecute (http/service.go): the request takes the next number of the
        write queue and is answered ``{"results": [], "sequence_number": N}`` whatever its SQL
        does (a failing statement, a read, a failing transaction); with ``wait`` an empty
        batch is accepted as a checkpoint, without it it is 400 ``no statements``.

        rqlite answers at once and runs queued requests later, in batches, without their
        ``transaction`` flag, and drops their results. litecdc runs the statements before it
        answers, as one commit with ``transaction`` honoured, so an answer means the write is
        done (``wait`` has nothing to wait for); a statement that fails is logged with the
        request's number. On a follower the leader runs it and this node still answers
        with its own number."""
        self.stats.add("queued_executions")
        wait = "wait" in request.query_params
        try:
            statements = await self._statements(request)
        except RequestError as exc:
            if not (wait and str(exc).startswith(rqlite.ERR_NO_STATEMENTS)):
                raise
            statements = []  # a checkpoint: nothing to run (rqlite: nil statements)
        if wait:
            self.stats.add("queued_executions_wait")
        number = self.queue.take()
        self.stats.add("queued_executions_num_stmts_rx", len(statements))
        cid = revision = None
        failures: list[str] = []
        if statements:
            try:
                outcome = await to_thread.run_sync(
                    lambda: self.store.execute(statements, transaction=opts.transaction),
                    limiter=self.write_threads,
                )
            except NotLeaderError as exc:
                return await self._forward_queued(request, exc, number, len(statements), opts)
            except StatementError as exc:
                failures.append(f"refused: {exc}")
            else:
                cid, revision = outcome.raft_index, outcome.log_revision
                failures = [
                    f"statement {i} failed: {result.error}"
                    for i, result in enumerate(outcome.results, start=1)
                    if result.error
                ]
                if failures and opts.transaction:
                    failures[-1] += " (the transaction was rolled back: nothing was written)"
        for failure in failures:  # the error, never the statement's text or values
            log.warning("queued write %d: %s", number, failure)
        self._queued_done(number, len(statements), len(failures))
        doc: dict[str, Any] = {"results": [], "sequence_number": number}
        return self._finish(doc, opts, start, cid, revision)

    async def _forward_queued(
        self,
        request: Request,
        error: NotLeaderError,
        number: int,
        count: int,
        opts: rqlite.QueryOptions,
    ) -> Response:
        """A queued write on a follower goes to the leader as any write does, and the answer
        carries this node's number (an rqlite follower queues the write itself): a client
        that compares it with this node's /status finds it processed."""
        if self.forwarder is None:
            raise error
        answer = await self.forwarder.answer(request, error)
        if answer.status_code != 200:
            return answer  # not written (or a redirect): no number is processed
        try:
            doc = msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            doc = None
        if not isinstance(doc, dict):
            return answer
        doc["sequence_number"] = number
        self._queued_done(number, count, 0)  # failures are logged by the leader
        return _json(doc, pretty=opts.pretty)

    def _queued_done(self, number: int, statements: int, failed: int) -> None:
        self.queue.done(number)
        self.stats.add("queued_executions_ok")
        self.stats.add("queued_executions_num_stmts_tx", statements)
        self.stats.add("queued_statements_failed", failed)

    async def query(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET", "POST")):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        if request.method == "GET":
            sql = request.query_params.get("q")
            if sql is None or not sql.strip():
                raise RequestError(
                    f"{rqlite.ERR_NO_STATEMENTS}: give the SQL in the q parameter, "
                    "or POST a JSON array of statements"
                )
            statements = [Statement(sql)]
        else:
            statements = await self._statements(request)
        self.stats.add("query_stmts_rx", len(statements))
        client_gone = _client_gone(request)
        if opts.min_cid is not None and (
            gone := await self._await_cid(
                opts.min_cid, client_gone, "retry, or read with a stronger level"
            )
        ):
            return gone
        limit = ReadLimit(opts.db_timeout, client_gone)
        results = await to_thread.run_sync(
            lambda: self.store.query(
                statements, level=opts.level, transaction=opts.transaction, limit=limit
            )
        )
        doc = {
            "results": rqlite.format_results(
                results,
                timings=opts.timings,
                associative=opts.associative,
                blob_array=opts.blob_array,
                endpoint="query",
            )
        }
        return self._finish(doc, opts, start, None)

    async def request(self, request: Request) -> Response:
        if r := await self._gate(request, ("query", "execute"), ("POST",)):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        statements = await self._statements(request)
        self.stats.add("request_stmts_rx", len(statements))
        limit = ReadLimit(opts.db_timeout, _client_gone(request))
        read_only = await to_thread.run_sync(lambda: self.store.is_read_only(statements, limit))

        def run() -> WriteOutcome:
            return self.store.request(
                statements,
                transaction=opts.transaction,
                level=opts.level,
                read_only=read_only,
                limit=limit,
            )

        outcome = await to_thread.run_sync(run, limiter=None if read_only else self.write_threads)
        doc = {
            "results": rqlite.format_results(
                outcome.results,
                timings=opts.timings,
                associative=opts.associative,
                blob_array=opts.blob_array,
                # (reads only: rqlite runs them as a query, and encodes their errors so)
                endpoint="query" if outcome.read_only else "request",
            )
        }
        return self._finish(doc, opts, start, outcome.raft_index, outcome.log_revision)

    @staticmethod
    def _finish(
        doc: dict[str, Any],
        opts: rqlite.QueryOptions,
        start: float,
        cid: int | None,
        log_revision: int | None = None,
    ) -> Response:
        if opts.timings:
            doc["time"] = time.perf_counter() - start
        if cid and (opts.raft_index or log_revision is not None):
            doc["raft_index"] = cid  # in a cluster, always: the write's place in the log
        if log_revision is not None:
            doc["log_revision"] = log_revision
        return _json(doc, pretty=opts.pretty)

    async def backup(self, request: Request) -> Response:
        if r := await self._gate(request, ("backup",), ("GET",)):
            return r
        params = request.query_params
        # rqlite's BackupFormatFromString (command/strings.go): lower-cased; "sql" is the SQL
        # dump, "delete" the SQLite file in DELETE journal mode, anything else the SQLite
        # file as it is (WAL mode, like rqlite's)
        fmt = params.get("fmt", "").lower()
        compress = "compress" in params
        tables = _backup_tables(params.get("tables"))
        if tables is not None and fmt != "sql":
            raise RequestError(
                "tables limits an SQL dump (fmt=sql); a backup file holds every table"
            )
        if fmt == "sql":
            text = await to_thread.run_sync(lambda: self.store.dump_sql(tables))
            self.last_backup = datetime.now(UTC)
            data = text.encode("utf-8")
            if compress:
                data = gzip.compress(data)
            return Response(data, media_type="application/sql")
        fd, path = tempfile.mkstemp(
            prefix=BACKUP_FILE_PREFIX, suffix=".sqlite", dir=self.config.data_dir
        )
        os.close(fd)
        try:
            await to_thread.run_sync(lambda: self._backup_to(path, compress, fmt == "delete"))
        except BaseException:
            _remove(path)
            raise
        self.last_backup = datetime.now(UTC)
        return FileResponse(
            path, media_type="application/octet-stream", background=BackgroundTask(_remove, path)
        )

    def _backup_to(self, path: str, compress: bool, delete_mode: bool) -> None:
        try:
            self.store.backup(path, rollback_journal=delete_mode)
            if compress:
                packed = path + ".gz"
                try:
                    with open(path, "rb") as src, gzip.open(packed, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1024 * 1024)
                except BaseException:
                    _remove(packed)
                    raise
                os.replace(packed, path)
        except (apsw.FullError, OSError) as exc:
            if _storage_full(exc) is None:
                raise
            # SQLite's backup API reports it as "not an error" (retain QA)
            raise StorageFullError(
                "insufficient storage: no room for the backup's copy of the database on the "
                f"disk of the node's data directory {self.config.data_dir}, where it is made "
                "before it is sent; free space there, or ask for fmt=sql, which needs none"
            ) from exc

    async def load(self, request: Request) -> Response:
        if r := await self._gate(request, ("load",), ("POST",)):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        data = await self._body(request)
        if not data.strip():
            raise RequestError("nothing to load: the body is empty; send a SQLite file or SQL text")
        is_sqlite = data.startswith(SQLITE_HEADER)
        if not is_sqlite:
            _check_utf8(data)
        try:
            outcome = await to_thread.run_sync(
                lambda: self.store.load(data), limiter=self.write_threads
            )
        except (LoadError, RequestError) as exc:
            if is_sqlite or type(exc) not in (LoadError, RequestError):
                raise
            # SQL text that fails is an SQL error: rqlite reports it in results, HTTP 200.
            # The load is one transaction, so nothing was changed.
            return self._finish({"results": [{"error": str(exc)}]}, opts, start, None)
        results = (
            [] if is_sqlite else rqlite.format_results(outcome.results[-1:], timings=opts.timings)
        )
        return self._finish(
            {"results": results}, opts, start, outcome.raft_index, outcome.log_revision
        )

    async def boot(self, request: Request) -> Response:
        """rqlite v8's ``POST /boot`` (handleBoot, Store.ReadFrom): a SQLite file replaces the
        data of a single node — here what /db/load does with a SQLite file, one journaled
        commit. Anything but a SQLite file is 400; a node that does not lead, or leads a
        cluster of more than one node, answers 503 ``not leader`` / ``not single-node`` as
        rqlite does (its boot bypasses consensus, so it refuses clusters). 200 with an empty
        body once loaded."""
        if r := await self._gate(request, ("load",), ("POST",)):
            return r
        data = await self._body(request)
        if not data.startswith(SQLITE_HEADER):
            raise RequestError(
                "invalid SQLite data: /boot takes a SQLite database file (it starts with "
                "'SQLite format 3'); load SQL text with POST /db/load"
            )
        if self.cluster is not None:
            problem = await to_thread.run_sync(_boot_problem, self.cluster)
            if problem is not None:
                return _text_error(503, problem)
        try:
            await to_thread.run_sync(lambda: self.store.load(data), limiter=self.write_threads)
        except NotLeaderError as exc:  # lost the lead meanwhile: rqlite does not forward it
            return _text_error(503, f"not leader: {exc}")
        return Response(status_code=200)

    async def status(self, request: Request) -> Response:
        if r := await self._gate(request, ("status",), ("GET",)):
            return r
        node = await to_thread.run_sync(self.store.status)
        now = datetime.now(UTC)
        store_status = msgspec.to_builtins(node)
        # rqlite's store.leader (Raft address as "addr"): clients such as gorqlite read it
        # to find the leader and fail to connect without it; "" for both while none is known
        leader = (
            self.cluster.leader()
            if self.cluster is not None
            else (self.config.node_id, self.config.http_addr)
        )
        store_status["leader"] = {
            "node_id": leader[0] if leader else "",
            "addr": leader[1].split("://", 1)[-1] if leader else "",
        }
        doc: dict[str, Any] = {
            "build": {"version": VERSION, "python": platform.python_version()},
            "http": {
                "bind_addr": self.config.http_addr,
                "auth": "enabled" if self.credentials is not None else "disabled",
                "tls": {"enabled": "true" if self.tls else "false"},
                "queue": {"_default": {"sequence_number": self.queue.processed}},
            },
            "node": {
                "id": node.node_id,
                "mode": node.mode,
                "leader": self.cluster.is_leader() if self.cluster is not None else True,
                "start_time": _go_time(self.started),
                "current_time": _go_time(now),
                "uptime": format_go_duration((now - self.started).total_seconds()),
            },
            "os": {
                "pid": os.getpid(),
                "ppid": os.getppid(),
                "hostname": socket.gethostname(),
                "executable": sys.executable,
            },
            "runtime": {
                "python": sys.version.split()[0],
                "implementation": platform.python_implementation(),
                "platform": sys.platform,
                "machine": platform.machine(),
                "num_cpu": os.cpu_count() or 1,
            },
            "store": store_status,
        }
        if self.cdc is not None:
            doc["cdc"] = await to_thread.run_sync(self.cdc.status)
        if self.cluster is not None:
            doc["cluster"] = await to_thread.run_sync(self.cluster.status)
        if self.last_backup is not None:
            doc["last_backup_time"] = _go_time(self.last_backup)
        key = request.query_params.get("key")
        if key:
            doc = _sub_document(doc, key)
        return _json(doc, pretty="pretty" in request.query_params)

    async def nodes(self, request: Request) -> Response:
        if r := await self._gate(request, ("status",), ("GET",)):
            return r
        nodes = await self._node_docs()
        pretty = "pretty" in request.query_params
        if request.query_params.get("ver") == "2" or request.query_params.get("version") == "2":
            return _json({"nodes": nodes}, pretty=pretty)
        return _json({n["id"]: n for n in nodes}, pretty=pretty)

    async def leader(self, request: Request) -> Response:
        """rqlite's ``GET /leader``: the leader as ``/nodes`` lists it. (rqlite's ``POST
        /leader``, a leadership transfer, is not served: an etcd election cannot hand
        leadership to a chosen node.)"""
        if r := await self._gate(request, ("status",), ("GET",)):
            return r
        leader = next((n for n in await self._node_docs() if n["leader"]), None)
        if leader is None:
            return Response(
                "no leader: the cluster has none at the moment (an election under way, or "
                "etcd out of reach: see /readyz)\n",
                status_code=503,
                media_type=_TEXT,
            )
        return _json(leader, pretty="pretty" in request.query_params)

    async def _node_docs(self) -> list[dict[str, Any]]:
        """The nodes of ``/nodes``: this one when standalone, else every cluster member."""
        nodes = [
            {
                "id": self.config.node_id,
                "api_addr": self.config.advertise_url,
                "addr": self.config.http_addr,
                "voter": True,
                "reachable": True,
                "leader": True,
            }
        ]
        if self.cluster is not None:
            cluster = self.cluster
            members = await to_thread.run_sync(cluster.known_members)
            leader = cluster.leader()
            # as rqlite does, each member is contacted: a crashed node keeps its member
            # record until its lease expires (up to 10 s) and must not look reachable
            problems = await asyncio.gather(
                *(self._member_problem(m.node_id, m.address) for m in members)
            )
            nodes = [_node_doc(m, leader, p) for m, p in zip(members, problems, strict=True)]
        return nodes

    async def _member_problem(self, node_id: str, address: str) -> str | None:
        """Why member ``node_id`` cannot be reached (None: it answered, or it is us)."""
        if node_id == self.config.node_id or self.forwarder is None:
            return None
        return await self.forwarder.peer_problem(node_id, address)

    async def remove(self, request: Request) -> Response:
        """rqlite's ``DELETE /remove`` with ``{"id": "NODE_ID"}``: forget a node that left
        the cluster for good, so ``/nodes`` stops listing it."""
        if r := await self._gate(request, ("remove",), ("DELETE",)):
            return r
        doc = await self._json_object(request)
        node_id = doc.get("id")
        if set(doc) != {"id"} or not isinstance(node_id, str):
            raise RequestError(
                'the body of DELETE /remove must be {"id": "NODE_ID"}, the id of the node '
                f"to remove; got {json.dumps(doc)}"
            )
        if self.cluster is None:
            raise RequestError("this node is standalone: it has no cluster members to remove")
        cluster = self.cluster
        await to_thread.run_sync(lambda: cluster.remove_member(node_id))
        return Response(status_code=200)  # rqlite answers 200 with an empty body

    async def readyz(self, request: Request) -> Response:
        if r := await self._gate(request, ("ready",), ("GET",)):
            return r
        if "noleader" in request.query_params:
            return Response("[+]node ok", media_type=_TEXT)
        if self.cluster is None:  # (its own log: always in sync)
            sync = "\n[+]sync ok" if "sync" in request.query_params else ""
            return Response(f"[+]node ok\n[+]leader ok\n[+]store ok{sync}", media_type=_TEXT)
        leader = self.cluster.leader()
        status = self.cluster.status()
        apply_error = status.get("apply_error")
        if apply_error:
            # its apply loop stopped (a database that did not come from the log, an entry
            # it cannot apply): its data is not the cluster's and will not become it
            leader_line = "[+]leader ok" if leader is not None else "[-]leader not ok"
            return Response(
                f"[+]node ok\n{leader_line}\n[-]store not ok: {apply_error}",
                status_code=503,
                media_type=_TEXT,
            )
        # the log no longer holds (or never held: a grown cluster's founding data) what
        # this node misses and no snapshot could be installed yet: it cannot serve the data
        store_line = "[-]store not ok" if status.get("needs_snapshot") else "[+]store ok"
        if leader is None:
            etcd_error = status.get("etcd_error")
            why = f": {etcd_error}" if etcd_error else ""
            return Response(
                f"[+]node ok\n[-]leader not ok{why}\n{store_line}",
                status_code=503,
                media_type=_TEXT,
            )
        if status.get("needs_snapshot"):
            return Response(
                f"[+]node ok\n[+]leader ok\n{store_line}", status_code=503, media_type=_TEXT
            )
        if leader[0] == self.config.node_id and not self.cluster.is_leader():
            # the leader key names this node, yet it refuses writes: it is taking over (its
            # log not yet caught up), or it lost its lease and the key has not gone yet
            # (it said "[+]leader ok" while every write was 503: cluster QA)
            return Response(
                "[+]node ok\n[-]leader not ok: the leader key names this node, which does "
                "not lead yet (it is taking over) or any more (its lease is ending)"
                f"\n{store_line}",
                status_code=503,
                media_type=_TEXT,
            )
        if leader[0] != self.config.node_id and not self.cluster.is_leader():
            # as rqlite's readyz does: a follower that cannot reach its leader the way it
            # forwards writes (e.g. it cannot verify the leader's certificate) is not ready
            problem = await self._leader_problem(*leader)
            if problem is not None:
                return Response(
                    f"[+]node ok\n[-]leader not contactable: {problem}\n[+]store ok",
                    status_code=503,
                    media_type=_TEXT,
                )
        if "sync" in request.query_params:
            return await self._readyz_sync(request)
        return Response("[+]node ok\n[+]leader ok\n[+]store ok", media_type=_TEXT)

    async def _readyz_sync(self, request: Request) -> Response:
        """rqlite's ``/readyz?sync``: ready only once this node has applied everything the
        cluster's log held when asked, waiting up to ``timeout`` (pipeline QA: a follower
        restarted after kill -9 answered ready while it stayed 80 commits behind for 12 s,
        serving that old data)."""
        assert self.cluster is not None
        cluster = self.cluster
        timeout = rqlite.duration_param(request.query_params, "timeout", READYZ_SYNC_TIMEOUT)
        timeout = min(max(timeout, 0.0), READYZ_SYNC_MAX_TIMEOUT)  # (it holds a thread)
        started = time.monotonic()
        try:
            # (within the timeout too: etcd's own deadline is 10 s — pipeline QA re-test)
            target = await to_thread.run_sync(lambda: cluster.log_head_cid(max(timeout, 0.1)))
        except LitecdcError as exc:  # (ClusterError: etcd did not answer)
            return Response(
                "[+]node ok\n[+]leader ok\n[+]store ok\n[-]sync not ok: cannot read the "
                f"log's head: {exc}",
                status_code=503,
                media_type=_TEXT,
            )
        left = max(timeout - (time.monotonic() - started), 0.0)
        if await to_thread.run_sync(
            lambda: self.store.wait_for_cid(target, left, _client_gone(request))
        ):
            return Response("[+]node ok\n[+]leader ok\n[+]store ok\n[+]sync ok", media_type=_TEXT)
        applied = self.store.journal.available_snapshot()
        return Response(
            f"[+]node ok\n[+]leader ok\n[+]store ok\n[-]sync not ok: applied cid {applied} of "
            f"the log's {target} within {timeout:g} s",
            status_code=503,
            media_type=_TEXT,
        )

    async def _leader_problem(self, leader_id: str, address: str) -> str | None:
        """Why this node cannot reach the leader the way it forwards writes, or None."""
        if self.forwarder is None:
            return None
        return await self.forwarder.leader_problem(leader_id, address)

    async def expvar(self, request: Request) -> Response:
        """rqlite's ``/debug/vars``, Go's expvar, which the rqlite shell's ``.expvar`` prints:
        here ``cmdline`` (password values hidden), the process's ``memory``, Python's
        garbage collector (``gc``) and ``http``, this API's counters under rqlite's names.
        ``key`` keeps one of them. Needs ``status``; any method, as in rqlite."""
        if r := await self._denied(request, ("status",)):
            return r
        doc: dict[str, Any] = {
            "cmdline": _cmdline(sys.orig_argv),
            "memory": _process_memory(),
            "gc": gc.get_stats(),
            "http": self.stats.snapshot(),
        }
        key = request.query_params.get("key")
        if key:
            doc = {name: value for name, value in doc.items() if name == key}
        return _json(doc, pretty="pretty" in request.query_params)

    # -- litecdc's own endpoints -----------------------------------------------------------
    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition of the store's and the CDC service's figures."""
        if r := await self._gate(request, ("status",), ("GET",)):
            return r
        body, content_type = await to_thread.run_sync(self.node_metrics.render)
        return Response(body, media_type=content_type)

    async def journal(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        after, limit, pretty = _page_params(request)
        page = await to_thread.run_sync(lambda: self.store.journal_page(after, limit))
        doc: dict[str, Any] = {
            "entries": page.entries,
            "available_snapshot": page.available_snapshot,
            "oldest_cid": page.oldest_cid,
        }
        if page.more:
            doc["next"] = {"after": page.entries[-1].cid}
        return _json(doc, pretty=pretty)

    async def changes(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        after, limit, pretty = _page_params(request, _CHANGES_PARAMS)
        after_seq = (
            _int_param(request.query_params, "after_seq", 0, minimum=0, maximum=MAX_SEQ)
            if "after_seq" in request.query_params
            else None
        )
        changes, more = await to_thread.run_sync(
            lambda: self.store.changes_page(after, limit, after_seq)
        )
        doc: dict[str, Any] = {"changes": changes}
        if more:
            # a page ended at its limit or its size may have stopped inside a transaction:
            # the next starts after this exact change, not after its whole cid (that would
            # skip the rest)
            last = changes[-1]
            doc["next"] = {"after": last.cid, "after_seq": last.seq}
        return _json(doc, pretty=pretty)

    # -- the pull source (litecdc pipeline) ---------------------------------------------
    def _want_arrow(self, request: Request) -> bool:
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "arrow"):
            raise RequestError(f"format must be json or arrow, got {fmt!r}")
        return fmt == "arrow" or ARROW_STREAM in request.headers.get("accept", "")

    async def _json_object(self, request: Request) -> dict[str, Any]:
        body = await self._body(request)
        doc = rqlite.decode_json_body(body, "request body is not valid JSON") if body else {}
        if not isinstance(doc, dict):
            raise RequestError("request body must be a JSON object")
        return doc

    async def subscriptions(self, request: Request) -> Response:
        if request.method == "POST":
            if r := await self._gate(request, ("execute",), ("POST",)):
                return r
            _check_params(request, set())
            doc = await self._json_object(request)
            _check_keys(doc, {"name"}, "POST /cdc/subscriptions", frozenset({"cid"}))
            name = doc.get("name")
            if not isinstance(name, str):
                raise RequestError(f"name must be a string, got {name!r}")
            at = doc.get("cid")
            if at is not None and (not isinstance(at, int) or isinstance(at, bool)):
                raise RequestError(f"cid must be an integer, got {at!r}")
            cid = await to_thread.run_sync(lambda: self.store.register_subscriber(name, at))
            return _json({"name": name, "cid": cid})
        if r := await self._gate(request, ("query",), ("GET", "POST")):
            return r
        _check_params(request, {"pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        subs = await to_thread.run_sync(self.store.subscribers)
        return _json(
            {
                "subscriptions": [
                    {"name": h.name, "cid": h.cid, "expired": h.expired} for h in subs.holds
                ],
                "pruned_cid": subs.pruned_cid,
                "last_cid": subs.last_cid,
                "retention_cids": subs.retention_cids,
            },
            pretty="pretty" in request.query_params,
        )

    async def subscription(self, request: Request) -> Response:
        if r := await self._gate(request, ("execute",), ("DELETE",)):
            return r
        _check_params(request, set())
        name = request.path_params["name"]
        await to_thread.run_sync(lambda: self.store.release_subscriber(name))
        return _json({"name": name, "released": True})

    async def subscription_progress(self, request: Request) -> Response:
        if r := await self._gate(request, ("execute",), ("POST",)):
            return r
        _check_params(request, set())
        doc = await self._json_object(request)
        _check_keys(doc, {"cid"}, "POST /cdc/subscriptions/NAME/progress")
        cid = doc.get("cid")
        if not isinstance(cid, int) or isinstance(cid, bool):
            raise RequestError(f"cid must be an integer, got {cid!r}")
        name = request.path_params["name"]
        hold = await to_thread.run_sync(lambda: self.store.advance_subscriber(name, cid))
        return _json({"name": hold.name, "cid": hold.cid})

    async def _await_cid(
        self, min_cid: int, client_gone: Callable[[], bool] | None, advice: str
    ) -> Response | None:
        """Wait (up to MIN_CID_WAIT) until this node has applied ``min_cid``: None once it
        has, a 499 when the client left meanwhile; NotReadyError, with ``advice``, when it
        did not in time. A standalone node answers OtherHistoryError within a second
        (STANDALONE_CID_WAIT) instead: no wait brings a cid it never wrote (QA: a source
        restored from an older backup under a running pipeline held each read 10 s and
        answered "retry")."""
        standalone = self.cluster is None
        wait = STANDALONE_CID_WAIT if standalone else MIN_CID_WAIT
        if await to_thread.run_sync(lambda: self.store.wait_for_cid(min_cid, wait, client_gone)):
            return None
        if client_gone is not None and client_gone():
            # nobody reads the answer; the wait held one of the read threads
            return Response(status_code=499)
        if standalone:
            raise OtherHistoryError(
                f"min_cid {min_cid} is beyond this node's history, which ends at cid "
                f"{self.store.journal.available_snapshot()}: the node writes its history "
                "alone, so that cid was read from another history of the database (before "
                "a restore of an older backup, from another data directory or node)"
            )
        raise NotReadyError(
            f"this node has not applied cid {min_cid} within {MIN_CID_WAIT:g} s (it has "
            f"{self.store.journal.available_snapshot()}); {advice}"
        )

    def _source_problem(self) -> str | None:
        """Why this node must not serve the pull source now, None when it may. A cluster
        node out of touch with its cluster (etcd silent, no leader known, its apply loop
        stopped, a snapshot awaited) serves data that may be behind, unknown to it:
        pipeline QA — a node cut off from etcd served its stale head, and `pipeline run
        --until-caught-up` said every subscription had caught up (verify too compared
        with it) while another listed node was fine."""
        if self.cluster is None:
            return None
        status = self.cluster.status()
        for key in ("apply_error", "etcd_error"):
            if status.get(key):
                return str(status[key])
        if status.get("needs_snapshot"):
            return "it waits for a snapshot of the cluster's data"
        if status.get("leader") is None:
            return "it knows no leader right now"
        return None

    async def _source_gate(self, request: Request) -> Response | None:
        """The pull source's own checks, after the permission gate: this node serves it
        (see _source_problem), and has applied the request's ``min_cid`` — what the
        caller already saw elsewhere (pipeline QA: a snapshot chunk read from a node
        behind the subscription's registration came back older than it, and the finished
        snapshot swept its rows away: rows missing at the sink, lag 0)."""
        problem = self._source_problem()  # (in memory, as /readyz asks it)
        if problem is not None:
            raise NotReadyError(
                f"this node cannot serve the pull source now: {problem}; its data may be "
                "behind the cluster's (a pipeline given several nodes tries the next)"
            )
        min_cid = rqlite.min_cid_param(request.query_params.get("min_cid"))
        if min_cid is None:
            return None
        return await self._await_cid(
            min_cid, _client_gone(request), "retry, or read from another node"
        )

    async def source_table_route(self, request: Request) -> Response:
        """``/cdc/tables/NAME`` and ``/cdc/tables/NAME/{splits,rows,changes,position}``,
        routed on the raw path: a table name may hold a '/', which a client sends as
        ``%2F``, and the decoded path cannot tell it from a separator."""
        found = _table_endpoint(request.scope)
        if found is None:
            return _not_found(request.url.path)
        name, handler = found
        request.scope["path_params"] = {"table": name}
        return await handler(self, request)

    async def source_tables(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        tables = await to_thread.run_sync(self.store.source_tables)
        return _json({"tables": tables}, pretty="pretty" in request.query_params)

    async def source_table(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"pretty", "count", "min_cid"})
        if r := await self._source_gate(request):
            return r
        name = request.path_params["table"]
        count = _flag_param(request.query_params, "count")
        spec, rows, last_cid = await to_thread.run_sync(
            lambda: self.store.source_table(name, count_rows=count)
        )
        doc = spec.to_json() | {"last_cid": last_cid}
        if rows is not None:
            doc["rows"] = rows
        return _json(doc, pretty="pretty" in request.query_params)

    async def source_splits(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"partitions", "pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        name = request.path_params["table"]
        n = _int_param(request.query_params, "partitions", 2, minimum=1)
        cid, cuts = await to_thread.run_sync(lambda: self.store.source_splits(name, n))
        return _json(
            {"cid": cid, "splits": [json.loads(encode_key(k)) for k in cuts]},
            pretty="pretty" in request.query_params,
        )

    async def source_rows(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after_key", "until_key", "limit", "format", "pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        params = request.query_params
        name = request.path_params["table"]
        after_key = decode_key(params.get("after_key"), "after_key")
        until_key = decode_key(params.get("until_key"), "until_key")
        limit = _int_param(params, "limit", SOURCE_PAGE_DEFAULT, minimum=1)
        if self._want_arrow(request):
            body = await to_thread.run_sync(
                lambda: self.store.source_rows_ipc(name, after_key, until_key, limit)
            )
            return Response(body, media_type=ARROW_STREAM)
        page = await to_thread.run_sync(
            lambda: self.store.source_rows(name, after_key, until_key, limit)
        )
        doc = table_to_json(page.rows) | {
            "cid": page.cid,
            "last_key": json.loads(encode_key(page.last_key)),
            "done": page.done,
        }
        return _json(doc, pretty="pretty" in params)

    async def source_changes(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after", "until", "limit", "format", "pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        params = request.query_params
        name = request.path_params["table"]
        after = _int_param(params, "after", 0, minimum=0, maximum=MAX_CID)
        until = (
            _int_param(params, "until", 0, minimum=0, maximum=MAX_CID)
            if "until" in params
            else None
        )
        limit = _int_param(params, "limit", SOURCE_PAGE_DEFAULT, minimum=1)
        arrow = self._want_arrow(request)
        page = await to_thread.run_sync(
            lambda: self.store.source_changes(name, after, until, limit)
        )
        big = page.events.num_rows >= RELEASE_MEMORY_AFTER_EVENTS
        release = BackgroundTask(release_unused_memory) if big else None
        if arrow:
            return StreamingResponse(
                ipc_chunks(page.events), media_type=ARROW_STREAM, background=release
            )
        doc = table_to_json(page.events) | {"end_cid": page.end_cid, "last_cid": page.last_cid}
        response = _json(doc, pretty="pretty" in params)
        response.background = release
        return response

    async def source_position(self, request: Request) -> Response:
        if r := await self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after", "max_events", "pretty", "min_cid"})
        if r := await self._source_gate(request):
            return r
        params = request.query_params
        name = request.path_params["table"]
        after = _int_param(params, "after", 0, minimum=0, maximum=MAX_CID)
        max_events = _int_param(params, "max_events", SOURCE_PAGE_DEFAULT, minimum=1)
        position = await to_thread.run_sync(
            lambda: self.store.source_position(name, after, max_events)
        )
        return _json(
            {
                "end_cid": position.end_cid,
                "events": position.events,
                "last_cid": position.last_cid,
                "first_cid": position.first_cid,
                "after_mark": position.after_mark,
                "end_mark": position.end_mark,
                "reshaped_cid": position.reshaped_cid,
                "unlogged_cid": position.unlogged_cid,
            },
            pretty="pretty" in params,
        )


SOURCE_PAGE_DEFAULT = 50_000

#: the endpoints of one source table: what follows ``/cdc/tables/NAME`` → handler
_TABLE_ENDPOINTS: Mapping[str | None, Callable[[_Api, Request], Awaitable[Response]]] = {
    None: _Api.source_table,
    "splits": _Api.source_splits,
    "rows": _Api.source_rows,
    "changes": _Api.source_changes,
    "position": _Api.source_position,
}


def _table_endpoint(
    scope: Scope,
) -> tuple[str, Callable[[_Api, Request], Awaitable[Response]]] | None:
    """(table name, handler) of a ``/cdc/tables/NAME[/ENDPOINT]`` request, read from the
    still-encoded ``raw_path`` (segments split on '/' first, then decoded each), or
    None when it names no endpoint. Without a raw path (an ASGI server that gives
    none) the decoded path is split: a name with '/' cannot be reached then."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes):
        text = raw.split(b"?", 1)[0].decode("utf-8", "replace")
        segments = [urllib.parse.unquote(part) for part in text.split("/")]
    else:
        segments = str(scope["path"]).split("/")
    if segments[:3] != ["", "cdc", "tables"] or len(segments) not in (4, 5):
        return None
    name = segments[3]
    handler = _TABLE_ENDPOINTS.get(segments[4] if len(segments) == 5 else None)
    if not name or handler is None:
        return None
    return name, handler


def _node_doc(
    member: KnownClusterMember, leader: tuple[str, str] | None, problem: str | None
) -> dict[str, Any]:
    """One node of ``/nodes`` in rqlite's shape; a node without a live member record, or
    that did not answer (``problem``), is listed as not reachable, with the reason in
    ``error`` (as rqlite lists a configured node it cannot contact)."""
    doc: dict[str, Any] = {
        "id": member.node_id,
        "api_addr": member.address,
        "addr": member.address.split("://", 1)[-1],
        "voter": True,
    }
    live = member.live
    if live is None:
        return doc | {"reachable": False, "leader": False, "error": member.error}
    leads = leader is not None and leader[0] == member.node_id
    if problem is not None:
        return doc | {"reachable": False, "leader": leads, "error": problem}
    return doc | {
        "reachable": True,
        "leader": leads,
        # the record is rewritten every 2 s; the leader key in etcd is current
        "mode": "leader" if leads else ("follower" if live.mode == "leader" else live.mode),
        "applied_cid": live.applied_cid,
        "applied_revision": live.applied_revision,
    }


def _boot_problem(cluster: ClusterView) -> str | None:
    """Why this cluster node cannot boot: rqlite's Store.ReadFrom refuses with ErrNotLeader,
    then with ErrNotSingleNode, and handleBoot answers 503 with the error's text."""
    if not cluster.is_leader():
        return "not leader: /boot loads a SQLite file into the only node of a cluster"
    members = len(cluster.known_members())
    if members != 1:
        return (
            f"not single-node: this cluster has {members} nodes, and /boot loads a SQLite "
            "file into a cluster of one node; load it with POST /db/load to the leader"
        )
    return None


#: serve options whose values are secrets, which /debug/vars does not show
_SECRET_OPTIONS = ("--etcd-password", "--node-password")
#: serve options whose values may be URLs with credentials, shown without them
_URL_OPTIONS = ("--cdc-config", "--advertise-url")


def _cmdline(argv: Sequence[str]) -> list[str]:
    """The process's command line (Go expvar's ``cmdline``), secret values replaced and
    URLs without their ``user:password@`` (a webhook's credentials: docs/cdc.md)."""
    shown: list[str] = []
    value_of: str | None = None  # the option whose value comes next
    for arg in argv:
        if value_of is not None:
            shown.append("[redacted]" if value_of in _SECRET_OPTIONS else shown_cdc_config(arg))
            value_of = None
            continue
        name, eq, value = arg.partition("=")
        if eq and name in _SECRET_OPTIONS:
            shown.append(f"{name}=[redacted]")
        elif eq and name in _URL_OPTIONS:
            shown.append(f"{name}={shown_cdc_config(value)}")
        else:
            value_of = arg if arg in _SECRET_OPTIONS + _URL_OPTIONS else None
            shown.append(arg)
    return shown


def _process_memory() -> dict[str, int]:
    """This process's resident memory now and at its peak, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    doc = {"max_rss_bytes": peak if sys.platform == "darwin" else peak * 1024}  # Linux: KiB
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/statm") as statm:
            resident_pages = int(statm.read().split()[1])
        doc["rss_bytes"] = resident_pages * os.sysconf("SC_PAGE_SIZE")
    return doc


def _check_utf8(data: bytes) -> None:
    """/db/load takes SQL text as UTF-8; anything else is a bad request (HTTP 400)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(
            "load: the body is neither a SQLite database file nor UTF-8 SQL text "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start} is not UTF-8)"
        ) from None


def _flag_param(params: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter: absent = false; present empty, true or 1 = true."""
    text = params.get(name)
    if text is None:
        return False
    if text.lower() in ("", "true", "1"):
        return True
    if text.lower() in ("false", "0"):
        return False
    raise RequestError(f"{name} must be true or false, got {text!r}")


def _check_params(request: Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query_params.keys()) - allowed)
    if unknown:
        raise RequestError(
            f"unknown query parameter(s) {', '.join(unknown)} for {request.url.path}"
            + (f"; allowed: {', '.join(sorted(allowed))}" if allowed else "")
        )


def _check_keys(
    doc: Mapping[str, Any], allowed: set[str], what: str, optional: frozenset[str] = frozenset()
) -> None:
    unknown = sorted(set(doc) - allowed - optional)
    if unknown:
        raise RequestError(
            f"unknown field(s) {', '.join(unknown)} in the body of {what}; "
            f"allowed: {', '.join(sorted(allowed | optional))}"
        )
    missing = sorted(allowed - set(doc))
    if missing:
        raise RequestError(f"missing field(s) {', '.join(missing)} in the body of {what}")


_PAGE_PARAMS = frozenset({"after", "limit", "pretty"})
_CHANGES_PARAMS = _PAGE_PARAMS | {"after_seq"}


def _page_params(
    request: Request, allowed: frozenset[str] | set[str] | None = None
) -> tuple[int, int, bool]:
    params = request.query_params
    allowed = allowed or _PAGE_PARAMS
    unknown = sorted(set(params.keys()) - allowed)
    if unknown:
        raise RequestError(
            f"unknown query parameter(s) {', '.join(unknown)} for {request.url.path}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    return (
        _int_param(params, "after", 0, minimum=0, maximum=MAX_CID),
        _int_param(params, "limit", JOURNAL_PAGE_DEFAULT, minimum=1),
        "pretty" in params,
    )


def _int_param(
    params: Mapping[str, str], name: str, default: int, *, minimum: int, maximum: int | None = None
) -> int:
    text = params.get(name)
    if text is None:
        return default
    # (int() also takes "1_0", " 7" and other scripts' digits; Go's Atoi, as elsewhere, does not)
    if not rqlite.GO_INTEGER_RE.fullmatch(text):
        raise RequestError(f"{name} must be an integer, got {text!r}")
    value = int(text)
    if value < minimum:
        raise RequestError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise RequestError(f"{name} must be at most {maximum}, got {value}")
    return value


def _sub_document(doc: dict[str, Any], key: str) -> Any:
    """rqlite's ``/status?key=a.b``: the value at that path, ``{}`` if it is missing."""
    value: Any = doc
    for part in key.split("."):
        if not isinstance(value, dict):
            return value
        if part not in value:
            return {}
        value = value[part]
    return value


def _client_gone(request: Request) -> Callable[[], bool] | None:
    """Whether the request's client has disconnected, for a read to ask at its checks (no
    await: it runs on a thread). uvicorn marks the request when its connection is lost;
    None under another server. (A task per read waiting for the ASGI disconnect message
    cost a third of the reads' throughput.)"""
    cycle = getattr(request.receive, "__self__", None)
    if cycle is None or not isinstance(getattr(cycle, "disconnected", None), bool):
        return None
    # (or shut its sending side: litecdc.http.protocol keeps such a connection to answer)
    return lambda: bool(cycle.disconnected or getattr(cycle, READ_SIDE_CLOSED, False))


def _backup_tables(value: str | None) -> list[str] | None:
    """rqlite's ``tables=a,b`` of an SQL dump: the names, spaces around them dropped; None
    when not given (or empty: every table)."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    return names or None


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_backup_copies(data_dir: Path | str, *, left_by_a_crash: bool = False) -> None:
    """Remove every /db/backup copy in ``data_dir``: at shutdown (a cancelled backup left
    its copy) and at start (``left_by_a_crash``: the node was killed while serving one; the
    data directory's lock makes them this node's)."""
    for copy in Path(data_dir).glob(BACKUP_FILE_PREFIX + "*"):
        if left_by_a_crash:
            log.info("removing %s, a backup copy left by a node that did not stop cleanly", copy)
        _remove(str(copy))


def _guard(
    handler: Handler, *, json_errors: bool, forwarder: LeaderForwarder | None = None
) -> Handler:
    """Turn litecdc errors into HTTP answers (text for rqlite endpoints, JSON for ours);
    a write that needs the leader goes to it."""

    async def guarded(request: Request) -> Response:
        try:
            return await handler(request)
        except NotLeaderError as exc:
            if forwarder is None:
                raise
            return await forwarder.answer(request, exc)
        except ClientDisconnect:
            # gone before its whole body came: nothing ran, and no one reads an answer
            # (it was logged as an internal error, twice, with tracebacks: QA)
            log.info("%s %s: the client disconnected mid-body", request.method, request.url.path)
            return Response(status_code=400)
        except (LitecdcError, apsw.FullError, OSError) as exc:
            error = _storage_full(exc) if isinstance(exc, (apsw.FullError, OSError)) else exc
            if error is None:
                raise  # an OSError other than a full disk: a 500, with its traceback
            status = http_status_for(error)
            if status >= 500:
                # (a node not ready is no fault of its own: a follower behind a min_cid,
                # out of touch with its cluster — asked again and again by a pipeline)
                level = logging.WARNING if isinstance(error, NotReadyError) else logging.ERROR
                log.log(level, "%s %s failed: %s", request.method, request.url.path, error)
            if json_errors:
                return _json({"error": str(error)}, status=status)
            return _text_error(status, str(error))

    return guarded


def _storage_full(exc: BaseException) -> StorageFullError | None:
    """The answer to a full disk (SQLite's or the OS's ENOSPC): the node's environment,
    not a bug — it was a 500 "internal error" with two tracebacks (retain QA). Whatever
    met it changed nothing: a write that meets it rolls back as a whole."""
    if isinstance(exc, OSError) and exc.errno != errno.ENOSPC:
        return None
    return StorageFullError(
        f"insufficient storage: the node's disk is full ({exc}); nothing was changed: free "
        "space on the disk of the node's data directory, then retry (deleting rows needs "
        "room too: their changes are captured)"
    )


def _not_found(path: str) -> Response:
    return _text_error(404, f"not found: litecdc has no endpoint {path}")


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _text_error(500, f"internal error: {type(exc).__name__}: {exc}")


#: every route takes every method the HTTP parser (llhttp) reads: its handler answers
#: one it does not serve 405 with what to use, as rqlite does; Starlette's own 405
#: (TRACE, PROPFIND…) said only "Method Not Allowed", listed methods the endpoint
#: refuses, and took unknown paths' 404 and /debug/vars' any-method answer (HTTP QA)
_ALL_METHODS = [
    *("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"),
    *("COPY", "LOCK", "MKCOL", "MOVE", "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND"),
    *("REBIND", "UNBIND", "ACL", "REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH"),
    *("NOTIFY", "SUBSCRIBE", "UNSUBSCRIBE", "PURGE", "MKCALENDAR", "LINK", "UNLINK"),
    *("SOURCE", "QUERY", "PRI", "DESCRIBE", "ANNOUNCE", "SETUP", "PLAY", "PAUSE"),
    *("TEARDOWN", "GET_PARAMETER", "SET_PARAMETER", "REDIRECT", "RECORD", "FLUSH"),
]

#: a handler of _Api, unbound
ApiHandler = Callable[[_Api, Request], Awaitable[Response]]

#: rqlite's endpoints as its ServeHTTP matches them (http/service.go), in its order:
#: (path, exact?, handler, expvar counter). Not exact = any path starting with it.
_RQLITE_ROUTES: tuple[tuple[str, bool, ApiHandler, str | None], ...] = (
    ("/db/execute", False, _Api.execute, "executions"),
    ("/db/query", False, _Api.query, "queries"),
    ("/db/request", False, _Api.request, "requests"),
    ("/db/backup", False, _Api.backup, "backups"),
    ("/db/load", False, _Api.load, "loads"),
    ("/boot", True, _Api.boot, "boot"),
    ("/remove", False, _Api.remove, None),
    ("/status", False, _Api.status, "num_status"),
    ("/nodes", False, _Api.nodes, None),
    ("/leader", True, _Api.leader, None),
    ("/readyz", False, _Api.readyz, "num_readyz"),
    ("/debug/vars", True, _Api.expvar, None),
)
RQLITE_ENDPOINTS = tuple((path, exact) for path, exact, _, _ in _RQLITE_ROUTES)

#: litecdc's own endpoints (Starlette paths, matched exactly): (path, handler, JSON errors?)
_OWN_ROUTES: tuple[tuple[str, ApiHandler, bool], ...] = (
    ("/journal", _Api.journal, True),
    ("/cdc/changes", _Api.changes, True),
    ("/cdc/subscriptions", _Api.subscriptions, True),
    ("/cdc/subscriptions/{name}", _Api.subscription, True),
    ("/cdc/subscriptions/{name}/progress", _Api.subscription_progress, True),
    ("/cdc/tables", _Api.source_tables, True),
    # /cdc/tables/{table}[/splits|/rows|/changes|/position]: see _table_endpoint
    ("/cdc/tables/{table:path}", _Api.source_table_route, True),
    ("/metrics", _Api.metrics, False),
)
OWN_ROUTE_PATHS = tuple(path for path, _, _ in _OWN_ROUTES)


def _counted(handler: Handler, counter: str | None, stats: _HttpStats) -> Handler:
    """``handler``, counting its requests under rqlite's expvar name (as _rqlite_router)."""
    if counter is None:
        return handler

    async def counted(request: Request) -> Response:
        stats.add(counter)
        return await handler(request)

    return counted


def _rqlite_router(
    routes: Sequence[tuple[str, bool, Handler, str | None]], stats: _HttpStats
) -> Handler:
    """rqlite's ServeHTTP switch: ``/`` is a 302 to /status, then the first endpoint whose
    path is the request's (exact) or starts it (prefix); anything else is 404."""

    async def route(request: Request) -> Response:
        path = request.url.path
        if path in ("", "/"):
            return RedirectResponse("/status", status_code=302)
        for prefix, exact, handler, counter in routes:
            if path == prefix or (not exact and path.startswith(prefix)):
                if counter is not None:
                    stats.add(counter)
                return await handler(request)
        return _not_found(path)

    return route


class _RqliteHeaders:
    """What rqlite's ServeHTTP does before routing: every answer carries the build version
    (addBuildVersion) and the CORS headers (addAllowHeaders), ``OPTIONS`` on any path is
    answered 200 at once (a browser's preflight), and the URL parameters of any other
    request are checked (NewQueryParams: HTTP 400 naming a bad one). It wraps the whole
    Starlette app, so 404s, 500s and relayed answers of the leader carry the headers too.
    Of a repeated URL parameter only the first value reaches the endpoints, as in Go."""

    def __init__(self, app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> None:
        self.app = app
        self.headers = headers
        self._text_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS":
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*self.headers, (b"content-length", b"0")],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            rqlite.check_query_string(scope.get("query_string", b"").decode("utf-8", "replace"))
        except RequestError as exc:
            await _text_error(400, str(exc), dict(self._text_headers))(scope, receive, send)
            return
        query_string = scope.get("query_string", b"")
        if query_string:
            scope = {**scope, "query_string": rqlite.first_values_only(query_string)}

        started = finished = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", ()), *self.headers]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception:
            # Starlette's ServerErrorMiddleware raises the error on after _internal_error
            # logged it and the 500 went out: uvicorn then logged the same traceback again
            # ("Exception in ASGI application"). An error after a response had begun (a
            # stream broken off) goes on to uvicorn, which drops the connection.
            if finished:
                return
            raise
        except asyncio.CancelledError:
            # the node stops, and the request's grace ran out (litecdc/http/server.py):
            # say so, as an unknown outcome — a write may have committed (it answered a
            # bare 500 before: review QA)
            if not started:
                path = str(scope.get("path", "")).rstrip("/")
                if scope.get("method") in ("GET", "HEAD") or path.endswith("/db/query"):
                    # (a read: "a write … may have been applied" misled — reads QA)
                    outcome = "it only reads: retry it"
                else:
                    outcome = "a write in it may have been applied: check before retrying"
                await _text_error(
                    504,
                    f"the node stopped before this request finished; {outcome}",
                    dict(self._text_headers),
                )(scope, receive, send)
            raise


def _rqlite_headers(config: NodeConfig, auth: bool) -> list[tuple[bytes, bytes]]:
    """rqlite's addBuildVersion and addAllowHeaders: ``Authorization`` is allowed, with
    credentials, only when the node checks them; an origin only when configured."""
    headers = [(b"x-rqlite-version", VERSION_HEADER.encode())]
    if config.http_allow_origin:
        headers.append((b"access-control-allow-origin", config.http_allow_origin.encode()))
    headers.append((b"access-control-allow-methods", b"OPTIONS, GET, POST"))
    if auth:
        headers.append((b"access-control-allow-headers", b"Content-Type, Authorization"))
        headers.append((b"access-control-allow-credentials", b"true"))
    else:
        headers.append((b"access-control-allow-headers", b"Content-Type"))
    return headers


def create_app(
    store: Store,
    config: NodeConfig,
    *,
    cdc: CDCService | None = None,
    cluster: ClusterView | None = None,
) -> ASGIApp:
    """The ASGI app serving ``store`` (and ``cdc``'s status). Raises ConfigError for a bad
    auth file."""
    api = _Api(store, config, cdc, cluster)
    forwarder = api.forwarder = LeaderForwarder(
        config.node_id, ca_cert=str(config.node_ca_cert) if config.node_ca_cert else None
    )
    own = [
        Route(
            path,
            _guard(functools.partial(handler, api), json_errors=json_errors, forwarder=forwarder),
            methods=_ALL_METHODS,
        )
        for path, handler, json_errors in _OWN_ROUTES
    ]
    rqlite_routes = [
        (
            path,
            exact,
            _guard(functools.partial(handler, api), json_errors=False, forwarder=forwarder),
            counter,
        )
        for path, exact, handler, counter in _RQLITE_ROUTES
    ]
    # rqlite's endpoints at their exact paths first: Starlette tries routes in order, and
    # the hot ones reached the catch-all only after every other route's regex (measured:
    # +34 us a request, 12% of HTTP writes/s)
    exact = [
        Route(path, _counted(handler, counter, api.stats), methods=_ALL_METHODS)
        for path, _, handler, counter in rqlite_routes
    ]
    # every other path is rqlite's to match (its prefixes, its 404): no Starlette
    # redirect_slashes 307, which clients such as pyrqlite do not follow with the body
    catch_all = Route(
        "/{path:path}", _rqlite_router(rqlite_routes, api.stats), methods=_ALL_METHODS
    )
    app = Starlette(
        routes=[*exact, *own, catch_all], exception_handlers={Exception: _internal_error}
    )
    return _RqliteHeaders(app, _rqlite_headers(config, api.credentials is not None))
