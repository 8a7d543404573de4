"""The HTTP API: rqlite's endpoints plus litecdc's journal and change log.

Each handler does four things, in rqlite's order: check the permission (HTTP 401), check
the method (HTTP 405), parse the request, make ONE store call in a worker thread (the
store is synchronous and thread-safe) and format its answer. Nothing here touches SQLite.

Errors: a malformed request gets HTTP 400 before the store is called, so it changes
nothing. rqlite endpoints answer errors as ``text/plain`` (as Go's ``http.Error`` does);
litecdc's own endpoints answer ``{"error": "..."}``. A failing SQL statement is not an
HTTP error: it is an ``error`` entry in ``results`` with HTTP 200, as in rqlite.
See docs/http-api.md for every endpoint's parameters and bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import msgspec
from anyio import to_thread
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Route

from litecdc.cdc.service import CDCService
from litecdc.config import NodeConfig
from litecdc.db.datafile import SQLITE_HEADER
from litecdc.errors import (
    BodyTooLargeError,
    LitecdcError,
    LoadError,
    NotLeaderError,
    NotReadyError,
    RequestError,
    http_status_for,
)
from litecdc.http import rqlite
from litecdc.http.auth import CredentialStore, parse_basic_auth
from litecdc.http.forward import LeaderForwarder
from litecdc.http.metrics import NodeMetrics
from litecdc.results import MAX_CID, MAX_SEQ, Statement
from litecdc.store import Store
from litecdc.wire import ARROW_STREAM, decode_key, encode_key, table_to_json, to_ipc

__all__ = ["JOURNAL_PAGE_DEFAULT", "create_app"]

log = logging.getLogger("litecdc.http")

JOURNAL_PAGE_DEFAULT = 1000
#: longest a read with min_cid waits for this node to apply that cid, in seconds
MIN_CID_WAIT = 10.0

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
        self.node_metrics = NodeMetrics(store, cdc)
        self.credentials = (
            CredentialStore.from_file(config.auth_file) if config.auth_file is not None else None
        )
        self.tls = config.http_cert is not None
        self.scheme = "https" if self.tls else "http"
        self.started = datetime.now(UTC)
        self.last_backup: datetime | None = None
        #: forwards writes to the leader; readyz checks the leader through it (set by create_app)
        self.forwarder: LeaderForwarder | None = None

    # -- plumbing ----------------------------------------------------------------------
    def _denied(self, request: Request, perms: tuple[str, ...]) -> Response | None:
        if self.credentials is None:
            return None
        username, password = parse_basic_auth(request.headers.get("authorization"))
        if self.credentials.allows_all(username, password, perms):
            return None
        need = " and ".join(repr(p) for p in perms)
        return _text_error(
            401,
            f"unauthorized: this request needs the {need} permission"
            + ("s" if len(perms) > 1 else ""),
            headers={"WWW-Authenticate": 'Basic realm="litecdc"'},
        )

    def _gate(
        self, request: Request, perms: tuple[str, ...], methods: tuple[str, ...]
    ) -> Response | None:
        """rqlite's order: permission first (401), then method (405)."""
        return self._denied(request, perms) or self._wrong_method(request, methods)

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
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(
                f"request body too large: {declared} bytes, the limit is {limit} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
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
        if r := self._gate(request, ("execute",), ("POST",)):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        statements = await self._statements(request)
        outcome = await to_thread.run_sync(
            lambda: self.store.execute(statements, transaction=opts.transaction)
        )
        if opts.queue:
            doc: dict[str, Any] = {"results": []}
            if outcome.cid:
                doc["sequence_number"] = outcome.cid
        else:
            doc = {
                "results": rqlite.format_results(
                    outcome.results, timings=opts.timings, blob_array=opts.blob_array
                )
            }
        return self._finish(doc, opts, start, outcome.cid, outcome.log_revision)

    async def query(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET", "POST")):
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
        if opts.min_cid is not None:
            min_cid = opts.min_cid
            if not await to_thread.run_sync(lambda: self.store.wait_for_cid(min_cid, MIN_CID_WAIT)):
                raise NotReadyError(
                    f"this node has not applied cid {min_cid} within {MIN_CID_WAIT:g} s "
                    f"(it has {self.store.journal.available_snapshot()}); retry, or read with "
                    "a stronger level"
                )
        results = await to_thread.run_sync(
            lambda: self.store.query(statements, level=opts.level, transaction=opts.transaction)
        )
        doc = {
            "results": rqlite.format_results(
                results,
                timings=opts.timings,
                associative=opts.associative,
                blob_array=opts.blob_array,
            )
        }
        return self._finish(doc, opts, start, None)

    async def request(self, request: Request) -> Response:
        if r := self._gate(request, ("query", "execute"), ("POST",)):
            return r
        start = time.perf_counter()
        opts = rqlite.parse_options(request.query_params)
        statements = await self._statements(request)
        outcome = await to_thread.run_sync(
            lambda: self.store.request(statements, transaction=opts.transaction, level=opts.level)
        )
        doc = {
            "results": rqlite.format_results(
                outcome.results,
                timings=opts.timings,
                associative=opts.associative,
                blob_array=opts.blob_array,
            )
        }
        return self._finish(doc, opts, start, outcome.cid, outcome.log_revision)

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
        if r := self._gate(request, ("backup",), ("GET",)):
            return r
        params = request.query_params
        fmt = params.get("fmt", "binary")
        if fmt not in ("binary", "sql"):
            raise RequestError(f"unknown backup format {fmt!r}: use fmt=sql or leave fmt out")
        compress = "compress" in params
        if fmt == "sql":
            text = await to_thread.run_sync(self.store.dump_sql)
            self.last_backup = datetime.now(UTC)
            data = text.encode("utf-8")
            if compress:
                data = gzip.compress(data)
            return Response(data, media_type="application/sql")
        fd, path = tempfile.mkstemp(prefix="litecdc-backup-", suffix=".sqlite")
        os.close(fd)
        try:
            await to_thread.run_sync(lambda: self._backup_to(path, compress))
        except BaseException:
            _remove(path)
            raise
        self.last_backup = datetime.now(UTC)
        return FileResponse(
            path, media_type="application/octet-stream", background=BackgroundTask(_remove, path)
        )

    def _backup_to(self, path: str, compress: bool) -> None:
        self.store.backup(path)
        if compress:
            packed = path + ".gz"
            with open(path, "rb") as src, gzip.open(packed, "wb") as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
            os.replace(packed, path)

    async def load(self, request: Request) -> Response:
        if r := self._gate(request, ("load",), ("POST",)):
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
            outcome = await to_thread.run_sync(lambda: self.store.load(data))
        except (LoadError, RequestError) as exc:
            if is_sqlite or type(exc) not in (LoadError, RequestError):
                raise
            # SQL text that fails is an SQL error: rqlite reports it in results, HTTP 200.
            # The load is one transaction, so nothing was changed.
            return self._finish({"results": [{"error": str(exc)}]}, opts, start, None)
        results = (
            [] if is_sqlite else rqlite.format_results(outcome.results[-1:], timings=opts.timings)
        )
        return self._finish({"results": results}, opts, start, outcome.cid, outcome.log_revision)

    async def status(self, request: Request) -> Response:
        if r := self._gate(request, ("status",), ("GET",)):
            return r
        node = await to_thread.run_sync(self.store.status)
        now = datetime.now(UTC)
        store_status = msgspec.to_builtins(node)
        doc: dict[str, Any] = {
            "build": {"version": VERSION, "python": platform.python_version()},
            "http": {
                "bind_addr": self.config.http_addr,
                "auth": "enabled" if self.credentials is not None else "disabled",
                "tls": {"enabled": "true" if self.tls else "false"},
            },
            "node": {
                "id": node.node_id,
                "mode": node.mode,
                "leader": self.cluster.is_leader() if self.cluster is not None else True,
                "start_time": _go_time(self.started),
                "current_time": _go_time(now),
                "uptime": str(now - self.started),
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
        if r := self._gate(request, ("status",), ("GET",)):
            return r
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
        pretty = "pretty" in request.query_params
        if request.query_params.get("ver") == "2" or request.query_params.get("version") == "2":
            return _json({"nodes": nodes}, pretty=pretty)
        return _json({n["id"]: n for n in nodes}, pretty=pretty)

    async def _member_problem(self, node_id: str, address: str) -> str | None:
        """Why member ``node_id`` cannot be reached (None: it answered, or it is us)."""
        if node_id == self.config.node_id or self.forwarder is None:
            return None
        return await self.forwarder.peer_problem(node_id, address)

    async def remove(self, request: Request) -> Response:
        """rqlite's ``DELETE /remove`` with ``{"id": "NODE_ID"}``: forget a node that left
        the cluster for good, so ``/nodes`` stops listing it."""
        if r := self._gate(request, ("remove",), ("DELETE",)):
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
        if r := self._gate(request, ("ready",), ("GET",)):
            return r
        if "noleader" in request.query_params:
            return Response("[+]node ok", media_type=_TEXT)
        if self.cluster is None:
            return Response("[+]node ok\n[+]leader ok\n[+]store ok", media_type=_TEXT)
        leader = self.cluster.leader()
        if leader is None:
            return Response(
                "[+]node ok\n[-]leader not ok\n[+]store ok", status_code=503, media_type=_TEXT
            )
        if self.cluster.status().get("needs_snapshot"):
            # the log no longer holds what this node misses and no snapshot could be
            # installed yet (e.g. refused by its peers): it cannot serve current data
            return Response(
                "[+]node ok\n[+]leader ok\n[-]store not ok", status_code=503, media_type=_TEXT
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
        return Response("[+]node ok\n[+]leader ok\n[+]store ok", media_type=_TEXT)

    async def _leader_problem(self, leader_id: str, address: str) -> str | None:
        """Why this node cannot reach the leader the way it forwards writes, or None."""
        if self.forwarder is None:
            return None
        return await self.forwarder.leader_problem(leader_id, address)

    async def root(self, request: Request) -> Response:
        return RedirectResponse("/status", status_code=302)

    # -- litecdc's own endpoints -----------------------------------------------------------
    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition of the store's and the CDC service's figures."""
        if r := self._gate(request, ("status",), ("GET",)):
            return r
        body, content_type = await to_thread.run_sync(self.node_metrics.render)
        return Response(body, media_type=content_type)

    async def journal(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        after, limit, pretty = _page_params(request)
        page = await to_thread.run_sync(lambda: self.store.journal_page(after, limit))
        return _json(
            {
                "entries": page.entries,
                "available_snapshot": page.available_snapshot,
                "oldest_cid": page.oldest_cid,
            },
            pretty=pretty,
        )

    async def changes(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        after, limit, pretty = _page_params(request, _CHANGES_PARAMS)
        after_seq = (
            _int_param(request.query_params, "after_seq", 0, minimum=0, maximum=MAX_SEQ)
            if "after_seq" in request.query_params
            else None
        )
        changes = await to_thread.run_sync(lambda: self.store.changes(after, limit, after_seq))
        doc: dict[str, Any] = {"changes": changes}
        if len(changes) == limit:
            # a full page may have stopped inside a transaction: the next page starts after
            # this exact change, not after its whole cid (that would skip the rest)
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
            if r := self._gate(request, ("execute",), ("POST",)):
                return r
            _check_params(request, set())
            doc = await self._json_object(request)
            _check_keys(doc, {"name"}, "POST /cdc/subscriptions")
            name = doc.get("name")
            if not isinstance(name, str):
                raise RequestError(f"name must be a string, got {name!r}")
            cid = await to_thread.run_sync(lambda: self.store.register_subscriber(name))
            return _json({"name": name, "cid": cid})
        if r := self._gate(request, ("query",), ("GET", "POST")):
            return r
        _check_params(request, {"pretty"})
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
        if r := self._gate(request, ("execute",), ("DELETE",)):
            return r
        _check_params(request, set())
        name = request.path_params["name"]
        await to_thread.run_sync(lambda: self.store.release_subscriber(name))
        return _json({"name": name, "released": True})

    async def subscription_progress(self, request: Request) -> Response:
        if r := self._gate(request, ("execute",), ("POST",)):
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

    async def source_tables(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"pretty"})
        tables = await to_thread.run_sync(self.store.source_tables)
        return _json({"tables": tables}, pretty="pretty" in request.query_params)

    async def source_table(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"pretty", "count"})
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
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"partitions", "pretty"})
        name = request.path_params["table"]
        n = _int_param(request.query_params, "partitions", 2, minimum=1)
        cid, cuts = await to_thread.run_sync(lambda: self.store.source_splits(name, n))
        return _json(
            {"cid": cid, "splits": [json.loads(encode_key(k)) for k in cuts]},
            pretty="pretty" in request.query_params,
        )

    async def source_rows(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after_key", "until_key", "limit", "format", "pretty"})
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
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after", "until", "limit", "format", "pretty"})
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
        if arrow:
            body = await to_thread.run_sync(lambda: to_ipc(page.events))
            return Response(body, media_type=ARROW_STREAM)
        doc = table_to_json(page.events) | {"end_cid": page.end_cid, "last_cid": page.last_cid}
        return _json(doc, pretty="pretty" in params)

    async def source_position(self, request: Request) -> Response:
        if r := self._gate(request, ("query",), ("GET",)):
            return r
        _check_params(request, {"after", "max_events", "pretty"})
        params = request.query_params
        name = request.path_params["table"]
        after = _int_param(params, "after", 0, minimum=0, maximum=MAX_CID)
        max_events = _int_param(params, "max_events", SOURCE_PAGE_DEFAULT, minimum=1)
        end, events, head = await to_thread.run_sync(
            lambda: self.store.source_position(name, after, max_events)
        )
        return _json(
            {"end_cid": end, "events": events, "last_cid": head}, pretty="pretty" in params
        )


SOURCE_PAGE_DEFAULT = 50_000


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


def _check_keys(doc: Mapping[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise RequestError(
            f"unknown field(s) {', '.join(unknown)} in the body of {what}; "
            f"allowed: {', '.join(sorted(allowed))}"
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
    try:
        value = int(text)
    except ValueError:
        raise RequestError(f"{name} must be an integer, got {text!r}") from None
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


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


_CORS = {
    "Access-Control-Allow-Methods": "OPTIONS, GET, POST",
    "Access-Control-Allow-Headers": "Content-Type, Authorization",
}


def _guard(
    handler: Handler, *, json_errors: bool, forwarder: LeaderForwarder | None = None
) -> Handler:
    """Turn litecdc errors into HTTP answers (text for rqlite endpoints, JSON for ours);
    a write that needs the leader goes to it."""

    async def guarded(request: Request) -> Response:
        if request.method == "OPTIONS":  # CORS preflight: rqlite answers 200 to any path
            return Response(status_code=200, headers=_CORS)
        try:
            return await handler(request)
        except NotLeaderError as exc:
            if forwarder is None:
                raise
            return await forwarder.answer(request, exc)
        except LitecdcError as exc:
            status = http_status_for(exc)
            if status >= 500:
                log.error("%s %s failed: %s", request.method, request.url.path, exc)
            if json_errors:
                return _json({"error": str(exc)}, status=status)
            return _text_error(status, str(exc))

    return guarded


async def _not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return _text_error(405, f"method {request.method} is not allowed on {request.url.path}")
    return _text_error(404, f"not found: litecdc has no endpoint {request.url.path}")


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return _text_error(500, f"internal error: {type(exc).__name__}: {exc}")


_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def create_app(
    store: Store,
    config: NodeConfig,
    *,
    cdc: CDCService | None = None,
    cluster: ClusterView | None = None,
) -> Starlette:
    """The Starlette app serving ``store`` (and ``cdc``'s status). Raises ConfigError for a
    bad auth file."""
    api = _Api(store, config, cdc, cluster)
    forwarder = api.forwarder = LeaderForwarder(
        config.node_id, ca_cert=str(config.node_ca_cert) if config.node_ca_cert else None
    )
    rq: dict[str, Any] = dict(json_errors=False, forwarder=forwarder)
    own: dict[str, Any] = dict(json_errors=True, forwarder=forwarder)
    routes = [
        Route("/", api.root),
        Route("/db/execute", _guard(api.execute, **rq), methods=_ALL_METHODS),
        Route("/db/query", _guard(api.query, **rq), methods=_ALL_METHODS),
        Route("/db/request", _guard(api.request, **rq), methods=_ALL_METHODS),
        Route("/db/backup", _guard(api.backup, **rq), methods=_ALL_METHODS),
        Route("/db/load", _guard(api.load, **rq), methods=_ALL_METHODS),
        Route("/status", _guard(api.status, **rq), methods=_ALL_METHODS),
        Route("/nodes", _guard(api.nodes, **rq), methods=_ALL_METHODS),
        Route("/readyz", _guard(api.readyz, **rq), methods=_ALL_METHODS),
        Route("/remove", _guard(api.remove, **rq), methods=_ALL_METHODS),
        Route("/journal", _guard(api.journal, **own), methods=_ALL_METHODS),
        Route("/cdc/changes", _guard(api.changes, **own), methods=_ALL_METHODS),
        Route("/cdc/subscriptions", _guard(api.subscriptions, **own), methods=_ALL_METHODS),
        Route("/cdc/subscriptions/{name}", _guard(api.subscription, **own), methods=_ALL_METHODS),
        Route(
            "/cdc/subscriptions/{name}/progress",
            _guard(api.subscription_progress, **own),
            methods=_ALL_METHODS,
        ),
        Route("/cdc/tables", _guard(api.source_tables, **own), methods=_ALL_METHODS),
        Route("/cdc/tables/{table}", _guard(api.source_table, **own), methods=_ALL_METHODS),
        Route("/cdc/tables/{table}/splits", _guard(api.source_splits, **own), methods=_ALL_METHODS),
        Route("/cdc/tables/{table}/rows", _guard(api.source_rows, **own), methods=_ALL_METHODS),
        Route(
            "/cdc/tables/{table}/changes",
            _guard(api.source_changes, **own),
            methods=_ALL_METHODS,
        ),
        Route(
            "/cdc/tables/{table}/position",
            _guard(api.source_position, **own),
            methods=_ALL_METHODS,
        ),
        Route("/metrics", _guard(api.metrics, **rq), methods=_ALL_METHODS),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: _not_found, 405: _not_found, Exception: _internal_error},
    )
