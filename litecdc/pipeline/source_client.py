"""The client of a node's source API (``/cdc/subscriptions``, ``/cdc/tables/…``).

Everything the pipeline asks a source node goes through :class:`SourceClient`: register
and advance subscriptions, describe a table, plan key ranges, read snapshot chunks and
change ranges as Arrow. It is synchronous (Spark tasks are threads of a Python worker,
not event loops) and picklable, so a data source reader can carry one to executors.

Errors, converted at this boundary::

    NotFoundError               404: unknown table or subscription
    PositionUnavailableError    410: the change log was pruned past the asked cid, or the
                                subscription expired: re-snapshot
    SourceError                 every address unreachable, or any other 4xx/5xx (with the
                                node's message)

Any node of a cluster answers (followers forward to the leader), so the client takes
several addresses and moves to the next one on connection errors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pyarrow as pa
import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, ProtocolError, ReadTimeoutError

from litecdc.errors import NotFoundError, PositionUnavailableError, SourceError
from litecdc.pipeline.metadata import redact_url
from litecdc.pipeline.tables import TableSpec

__all__ = [
    "DEFAULT_TIMEOUT",
    "ChangesPage",
    "Key",
    "KeyRange",
    "Position",
    "RowsPage",
    "SourceClient",
    "Splits",
    "Subscription",
    "Subscriptions",
    "TableInfo",
    "parse_urls",
]

log = logging.getLogger("litecdc.pipeline")

#: Seconds to wait for a node to connect and answer one request (a page of rows).
DEFAULT_TIMEOUT = 60.0
#: ... and for the answer to a data read (a page of rows, a batch of changes) at least:
#: a batch holds whole transactions, and one of 1.5M row changes took a node 24 s to
#: answer alone, over 60 s with three subscriptions reading it at once (scale QA: every
#: read timed out, retried, and the batch was never applied). A node hung before a step
#: still shows within DEFAULT_TIMEOUT (each step asks for the table or the position
#: first); one that stalls during a data read holds the step this long before the next
#: address is tried: the price of not refusing big transactions (review).
DATA_READ_TIMEOUT = 300.0

ARROW_STREAM = "application/vnd.apache.arrow.stream"

#: A key value as JSON carries it: one value per key column.
Key = list[Any]
#: (after_key, until_key): rows with after_key < key <= until_key; None = unbounded.
KeyRange = tuple[Key | None, Key | None]


@dataclass(frozen=True)
class Subscription:
    name: str
    cid: int  # the hold: changes after this cid are kept for the subscriber
    expired: bool = False


@dataclass(frozen=True)
class Subscriptions:
    subscriptions: tuple[Subscription, ...]
    pruned_cid: int  # the change log no longer holds changes at or before this cid
    last_cid: int  # the node's head
    retention_cids: int  # the retention cap, in cids

    def get(self, name: str) -> Subscription | None:
        return next((s for s in self.subscriptions if s.name == name), None)


@dataclass(frozen=True)
class TableInfo:
    spec: TableSpec
    rows: int | None  # with count_rows only
    last_cid: int
    #: the cid that created the table or last changed it other than by adding a column
    #: (DROP TABLE and CREATE again, DROP or RENAME COLUMN…): a copy of the table from
    #: before it is stale. 0: not known (a node that does not say, or a table from before
    #: the node recorded it)
    reshaped_cid: int = 0
    #: the last cid that changed the table's rows without change events (DROP TABLE,
    #: RENAME TO, CREATE … AS SELECT, ADD COLUMN … DEFAULT…): changes read across it are
    #: refused. 0: none, or an older node
    unlogged_cid: int = 0


@dataclass(frozen=True)
class Splits:
    cid: int
    keys: tuple[Key, ...]  # split keys in key order

    def ranges(self) -> list[KeyRange]:
        """(None, s1], (s1, s2], …, (s_last, None]: every key in exactly one range."""
        bounds: list[Key | None] = [None, *self.keys, None]
        return [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


@dataclass(frozen=True)
class RowsPage:
    """One snapshot chunk, read in one SQLite read transaction at ``cid``."""

    table: pa.Table  # TableSpec.row_schema()
    cid: int
    last_key: Key | None  # key of the last row (page on from here); None when empty
    done: bool  # the range is exhausted


@dataclass(frozen=True)
class ChangesPage:
    """Change events of whole transactions after some cid, up to ``end_cid``."""

    table: pa.Table  # TableSpec.change_schema()
    end_cid: int  # position reached: read again from here
    last_cid: int  # the node's head


@dataclass(frozen=True)
class Position:
    end_cid: int  # where a batch of at most max_events (whole transactions) would end
    events: int
    last_cid: int
    first_cid: int | None = None  # the cid of the batch's first event (None: no events)
    #: what tells the commit ``after`` (and end_cid) of this history from another's with
    #: that cid (None: the journal no longer holds it, or an older node)
    after_mark: str | None = None
    end_mark: str | None = None
    #: the table's last reshape (TableInfo.reshaped_cid; 0: not known, an older node)
    reshaped_cid: int = 0
    #: the first cid after ``after`` that changed the table's rows without change events
    #: (see TableInfo.unlogged_cid; 0: none, or an older node): changes read across it
    #: are refused
    unlogged_cid: int = 0


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """Addresses from a comma-separated string or a list, without trailing slashes."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    if not any(u.strip() for u in items):
        raise SourceError("source: no address given (the node's URL: http://host:port)")
    if any(not u.strip() for u in items):
        # ("a,,b": a stray comma, or a variable that was empty — QA)
        raise SourceError(f"sources {','.join(items)!r}: an empty address between commas")
    out = [u.strip().rstrip("/") for u in items]
    for u in out:
        if not u.startswith(("http://", "https://")):
            raise SourceError(f"source {redact_url(u)}: not an http:// or https:// address")
        try:
            parts = urlsplit(u)
        except ValueError as exc:
            raise SourceError(f"source {redact_url(u)}: not a URL ({exc})") from None
        if parts.username is not None or parts.password is not None:
            # (spark data source QA: ignored — a 401 — and the password shown in the error)
            raise SourceError(
                f"source {redact_url(u)}: credentials go in the user and password options "
                "(pipeline subscribe --user/--password), not in the address"
            )
    return out


class SourceClient:
    """Calls one source node (or the first reachable of several).

    ``ca_cert`` is a PEM file of the CA that signed the node's HTTPS certificate, or
    ``ca_pem`` its text (what a Spark executor gets: it may not have the driver's files).
    ``timeout`` (seconds, default 60) bounds connecting and each read; a data read
    (rows, changes) waits at least DATA_READ_TIMEOUT for its answer.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        user: str | None = None,
        password: str | None = None,
        ca_cert: str | None = None,
        ca_pem: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.urls = parse_urls(urls)
        self.user = user
        self.password = password
        self.ca_cert = ca_cert
        self.ca_pem = ca_pem
        self.timeout = timeout
        self._current = 0  # index of the address that answered last
        self._client: urllib3.PoolManager | None = None

    # pickling: a connection pool holds sockets and locks; a copy opens its own
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:  # never shows the password
        return f"SourceClient({','.join(self.urls)!r}, user={self.user!r})"

    def close(self) -> None:
        if self._client is not None:
            self._client.clear()
            self._client = None

    def __enter__(self) -> SourceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> urllib3.PoolManager:
        """The connection pool (urllib3: it reads a 10 MB snapshot chunk with a quarter of
        the CPU httpx spends on it, which a Spark executor shares with the JVM)."""
        if self._client is None:
            context = None
            if self.ca_cert or self.ca_pem:
                try:
                    context = ssl.create_default_context(cafile=self.ca_cert, cadata=self.ca_pem)
                except (OSError, ssl.SSLError) as exc:
                    where = self.ca_cert or "given as PEM text"
                    raise SourceError(
                        f"source: cannot load the CA certificate {where} ({exc})"
                    ) from exc
            headers = (
                urllib3.make_headers(
                    basic_auth=f"{self.user}:{self.password or ''}", basic_auth_encoding="utf-8"
                )
                if self.user
                else None
            )
            self._client = urllib3.PoolManager(
                headers=headers,
                timeout=urllib3.Timeout(connect=self.timeout, read=self.timeout),
                retries=False,  # _request moves between addresses itself
                ssl_context=context,
                maxsize=8,  # connections kept per address (threads of one task share it)
            )
        return self._client

    # -- subscriptions ---------------------------------------------------------------

    def register(self, name: str, cid: int | None = None) -> Subscription:
        """Register (or restart) subscriber ``name``: its cid is the initial snapshot
        version, and the node keeps the changes after it. With ``cid``, its hold is placed
        there (PositionUnavailableError when the node pruned past it)."""
        body: dict[str, Any] = {"name": name} if cid is None else {"name": name, "cid": cid}
        try:
            doc = self._json("POST", "/cdc/subscriptions", json=body, idempotent=True)
        except SourceError as exc:
            if cid is None or "unknown field(s) cid" not in str(exc):
                raise
            # a node from before holds could be placed at a cid (QA: a stream's
            # starting_cid with a subscription failed against it): at its head, as then
            log.warning(
                "subscriber %s: the node cannot place a hold at cid %d (an older version): "
                "registered at its head, which keeps only the changes after it",
                name,
                cid,
            )
            doc = self._json("POST", "/cdc/subscriptions", json={"name": name}, idempotent=True)
        return Subscription(str(doc["name"]), int(doc["cid"]))

    def subscriptions(self) -> Subscriptions:
        doc = self._json("GET", "/cdc/subscriptions")
        subs = tuple(
            Subscription(str(s["name"]), int(s["cid"]), bool(s.get("expired")))
            for s in doc["subscriptions"]
        )
        return Subscriptions(
            subs, int(doc["pruned_cid"]), int(doc["last_cid"]), int(doc["retention_cids"])
        )

    def progress(self, name: str, cid: int) -> None:
        """Move ``name``'s hold forward to ``cid`` (it no longer needs changes up to it)."""
        # idempotent: moving a hold to the same cid twice is a no-op
        self._json(
            "POST", f"/cdc/subscriptions/{_seg(name)}/progress", json={"cid": cid}, idempotent=True
        )

    def unsubscribe(self, name: str) -> None:
        """Release ``name``'s hold."""
        self._json("DELETE", f"/cdc/subscriptions/{_seg(name)}")

    # -- tables ----------------------------------------------------------------------

    def table_info(
        self, table: str, *, count_rows: bool = False, min_cid: int | None = None
    ) -> TableInfo:
        """The table's description and the node's head; its row count (a read of the whole
        table on the node) only with ``count_rows``; from a node that has applied
        ``min_cid`` (see :meth:`rows`)."""
        params: dict[str, Any] = {"count": "true"} if count_rows else {}
        if min_cid:
            params["min_cid"] = min_cid
        doc = self._json("GET", f"/cdc/tables/{_seg(table)}", params=params or None)
        rows = doc.get("rows")
        return TableInfo(
            TableSpec.from_json(doc),
            int(rows) if rows is not None else None,
            int(doc["last_cid"]),
            int(doc.get("reshaped_cid") or 0),
            int(doc.get("unlogged_cid") or 0),
        )

    def table_spec(self, table: str) -> TableSpec:
        return self.table_info(table).spec

    def splits(self, table: str, partitions: int, *, min_cid: int | None = None) -> Splits:
        """``min_cid``: read on a node that has applied it (a node behind it waits, then
        answers 503 and the next address is tried; see :meth:`rows`)."""
        params: dict[str, Any] = {"partitions": partitions}
        if min_cid:
            params["min_cid"] = min_cid
        doc = self._json("GET", f"/cdc/tables/{_seg(table)}/splits", params=params)
        return Splits(int(doc["cid"]), tuple(list(k) for k in doc["splits"]))

    def rows(
        self,
        table: str,
        *,
        after_key: Key | None = None,
        until_key: Key | None = None,
        limit: int,
        min_cid: int | None = None,
    ) -> RowsPage:
        """Rows with after_key < key <= until_key, in key order, at most ``limit``; read at
        ``min_cid`` or later. A snapshot's pages must be (pipeline QA: a page read on a
        cluster node behind the subscription's registration was older than it, and the
        finished snapshot swept its rows away, silently): the node waits until it has
        applied ``min_cid``, or answers 503 and the next address is tried."""
        params: dict[str, Any] = {"limit": limit, "format": "arrow"}
        if after_key is not None:
            params["after_key"] = json.dumps(after_key)
        if until_key is not None:
            params["until_key"] = json.dumps(until_key)
        if min_cid:
            params["min_cid"] = min_cid
        data, meta = self._arrow(f"/cdc/tables/{_seg(table)}/rows", params)
        last_key = json.loads(meta.get(b"litecdc.last_key", b"null"))
        cid = int(meta[b"litecdc.cid"])
        if min_cid and cid < min_cid:  # (a node that ignored min_cid)
            raise SourceError(
                f"source: a page of {table} was read at cid {cid}, before cid {min_cid}: "
                "the node is behind; retried"
            )
        return RowsPage(
            data,
            cid,
            list(last_key) if last_key is not None else None,
            meta.get(b"litecdc.done", b"false") == b"true",
        )

    def changes(
        self, table: str, *, after: int, until: int | None = None, limit: int
    ) -> ChangesPage:
        """Events of whole transactions with after < cid <= until, about ``limit`` of them,
        from a node that has applied ``until`` (one behind waits; see :meth:`rows`).

        Raises PositionUnavailableError when the log no longer reaches back to ``after``.
        """
        params: dict[str, Any] = {"after": after, "limit": limit, "format": "arrow"}
        if until is not None:
            params["until"] = params["min_cid"] = until
        data, meta = self._arrow(f"/cdc/tables/{_seg(table)}/changes", params)
        return ChangesPage(data, int(meta[b"litecdc.end_cid"]), int(meta[b"litecdc.last_cid"]))

    def position(
        self, table: str, *, after: int, max_events: int, min_cid: int | None = None
    ) -> Position:
        # (no min_cid by default: a head behind ``after`` is how a replaced source shows,
        # see pipeline.server._check_not_behind)
        params: dict[str, Any] = {"after": after, "max_events": max_events}
        if min_cid is not None:
            params["min_cid"] = min_cid
        doc = self._json("GET", f"/cdc/tables/{_seg(table)}/position", params=params)
        first = doc.get("first_cid")
        marks = [doc.get(k) for k in ("after_mark", "end_mark")]
        return Position(
            int(doc["end_cid"]),
            int(doc["events"]),
            int(doc["last_cid"]),
            int(first) if first is not None else None,
            after_mark=str(marks[0]) if marks[0] is not None else None,
            end_mark=str(marks[1]) if marks[1] is not None else None,
            reshaped_cid=int(doc.get("reshaped_cid") or 0),
            unlogged_cid=int(doc.get("unlogged_cid") or 0),
        )

    def commit_time_ms(self, after: int) -> int | None:
        """When the first commit with changes after cid ``after`` was made (the leader's
        clock, Unix ms), or None when there is none yet: the age of the oldest unapplied
        change. Read from the change log, which keeps a change as long as a subscriber
        needs it; the journal may have trimmed that commit's entry already."""
        doc = self._json("GET", "/cdc/changes", params={"after": after, "limit": 1})
        changes = doc.get("changes") or []
        return int(changes[0]["timestamp_ms"]) if changes else None

    # -- transport -------------------------------------------------------------------

    def _arrow(self, path: str, params: dict[str, Any]) -> tuple[pa.Table, dict[bytes, bytes]]:
        response = self._request(
            "GET", path, params=params, read_timeout=max(self.timeout, DATA_READ_TIMEOUT)
        )
        kind = response.headers.get("content-type", "")
        if not kind.startswith(ARROW_STREAM):
            raise SourceError(f"source {response.url}: expected Arrow IPC, got {kind!r}")
        try:
            with pa.ipc.open_stream(response.data) as reader:
                data = reader.read_all()
        except pa.ArrowInvalid as exc:
            raise SourceError(f"source {response.url}: unreadable Arrow stream ({exc})") from exc
        return data, dict(data.schema.metadata or {})

    def _json(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        idempotent: bool | None = None,
    ) -> Any:
        response = self._request(method, path, params=params, json=json, idempotent=idempotent)
        try:
            return response.json()
        except ValueError as exc:
            raise SourceError(f"source {response.url}: answer is not JSON") from exc

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        idempotent: bool | None = None,
        read_timeout: float | None = None,
    ) -> _Response:
        """Send to the address that answered last, then the others in turn.

        A refused connection never reached a node, so any request moves on; after a
        timeout or a dropped connection only idempotent ones do (GETs by default).
        ``read_timeout``: how long to wait for the answer (default: ``timeout``).
        """
        timeout = urllib3.Timeout(connect=self.timeout, read=read_timeout or self.timeout)
        timed_out = 0  # addresses that took the connection but did not answer in time
        retry_any_failure = method == "GET" if idempotent is None else idempotent
        failures: list[str] = []
        n = len(self.urls)
        # every address once; an idempotent request also gets a second go at an address
        # whose connection dropped (a kept-alive one the node closed as it was reused)
        order = [(self._current + i) % n for i in range(n)]
        redone: set[int] = set()
        while order:
            index = order.pop(0)
            sent = params
            if params and "min_cid" in params and self.urls[index] in _NODES_WITHOUT_MIN_CID:
                sent = {k: v for k, v in params.items() if k != "min_cid"}
            url = self.urls[index] + path + (f"?{urlencode(sent)}" if sent else "")
            try:
                raw = self.client.request(method, url, json=json, redirect=False, timeout=timeout)
            except HTTPError as exc:
                failures.append(f"{self.urls[index]}: {type(exc).__name__}: {exc}")
                timed_out += isinstance(exc, ReadTimeoutError)
                if retry_any_failure and isinstance(exc, ProtocolError) and index not in redone:
                    redone.add(index)
                    order.insert(0, index)
                    continue
                if _never_sent(exc) or retry_any_failure:
                    log.debug("source %s unreachable, trying the next address", self.urls[index])
                    continue
                raise SourceError(
                    f"source {self.urls[index]}: {method} {path} failed ({failures[-1]}); "
                    "the request may have been applied"
                ) from exc
            response = _Response(method, self.urls[index], path, url, raw)
            if sent and "min_cid" in sent and _refuses_min_cid(response):
                # upgrade QA: a pipeline upgraded before its nodes failed every
                # subscription. Such a node reads as the pipelines of its time read it
                # (a page read before min_cid is still refused: see rows). Known to the
                # process, not the client: Spark's tasks make clients of their own (review)
                with _NODES_LOCK:
                    known = self.urls[index] in _NODES_WITHOUT_MIN_CID
                    _NODES_WITHOUT_MIN_CID.add(self.urls[index])
                if not known:
                    log.warning(
                        "source %s is a litecdc node older than this pipeline (it takes no "
                        "min_cid): its reads are not held back until it has applied what "
                        "the sink did; upgrade it", self.urls[index],
                    )  # fmt: skip
                order.insert(0, index)
                continue
            if response.status == 503 and order and retry_any_failure:
                # a node that cannot serve now (behind min_cid, out of touch with its
                # cluster, no leader to forward to): the next may (pipeline QA: a node cut
                # off from etcd was asked again and again, another listed one never)
                failures.append(str(_error_for(response)))  # (it names the address)
                log.debug("source %s cannot serve now, trying the next address",
                          self.urls[index])  # fmt: skip
                continue
            if response.status != 503:  # (the next request starts elsewhere then)
                self._current = index
            if response.status >= 400:
                error = _error_for(response)
                if failures and response.status == 503:  # (every node said why: review)
                    raise SourceError(f"{error}; before it: {'; '.join(failures)}") from error
                raise error
            return response
        if timed_out == len(failures):
            # it took the connection and is working, or hung: not unreachable (scale QA)
            raise SourceError(
                f"source {', '.join(self.urls)}: no answer within {timeout.read_timeout:g} s "
                f"({'; '.join(failures)}); is the node overloaded or hung?"
            )
        raise SourceError(f"source {', '.join(self.urls)}: unreachable ({'; '.join(failures)})")


#: addresses of nodes from before min_cid, which refuse it (see SourceClient._request);
#: for the process's life (a node upgraded meanwhile is read so until `run` restarts)
_NODES_WITHOUT_MIN_CID: set[str] = set()
_NODES_LOCK = threading.Lock()


def _refuses_min_cid(response: _Response) -> bool:
    """Whether ``response`` is a node's refusal of the min_cid parameter, as nodes from
    before it refuse any parameter they do not know (HTTP 400)."""
    if response.status != 400:
        return False
    try:
        error = str(response.json().get("error", ""))
    except (ValueError, AttributeError):
        return False
    return error.startswith("unknown query parameter(s) min_cid for ")


def _never_sent(exc: HTTPError) -> bool:
    """Whether the request surely never reached the node: the connection was refused or
    timed out, or TLS refused the node's certificate. (Other TLS errors can come after
    the request went out.)"""
    if isinstance(exc, ConnectTimeoutError):  # NewConnectionError (refused, DNS) too
        return True
    seen: BaseException | None = exc
    while seen is not None:
        if any(isinstance(a, ssl.SSLCertVerificationError) for a in (seen, *seen.args)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass(frozen=True)
class _Response:
    """A node's answer, read whole, and the request it answers."""

    method: str
    base: str  # the node's address
    path: str
    url: str
    raw: urllib3.BaseHTTPResponse

    @property
    def status(self) -> int:
        return int(self.raw.status)

    @property
    def headers(self) -> Any:
        return self.raw.headers

    @property
    def data(self) -> bytes:
        return bytes(self.raw.data)

    def json(self) -> Any:
        return json.loads(self.raw.data)

    @property
    def text(self) -> str:
        return bytes(self.raw.data).decode("utf-8", "replace")


def _error_for(response: _Response) -> Exception:
    """The litecdc error for a node's 4xx/5xx answer, with the node's message."""
    doc: Any = None
    with contextlib.suppress(ValueError):
        doc = response.json()
    if response.status == 401:
        # a litecdc node answers 401 in plain text (rqlite's form), for wrong credentials
        # and for a missing permission alike: not "is this address a litecdc node?"
        said = " ".join(response.text.split())[:200]
        return SourceError(
            f"source {response.base}: {response.method} {response.path}: the node refused "
            f"the credentials (401{': ' + said if said else ''}): check the user and password "
            "(pipeline subscribe --user/--password; the data source's user/password options) "
            "and that the user has this permission"
        )
    if isinstance(doc, dict) and "error" in doc:
        message = str(doc["error"])
        if response.status == 400 and message.startswith("unknown query parameter(s) "):
            message += " (a litecdc node older than this pipeline? upgrade the node)"
    elif response.headers.get("X-RQLITE-VERSION", "").startswith("litecdc/"):
        # a litecdc node's plain-text answer (rqlite's form: a write forwarded to no
        # leader, 503) — not "is this a litecdc node?" (pipeline QA)
        message = " ".join(response.text.split())[:500] or f"HTTP {response.status}"
    else:  # not a litecdc node's answer (every error of the API is JSON with "error")
        kind = response.headers.get("content-type", "") or "no content type"
        text = " ".join(response.text.split())[:200]
        message = (
            f"{text or 'an empty answer'} ({kind}; is this address a litecdc node, and its "
            "HTTP API?)"
        )
    text = f"source {response.base}: {response.method} {response.path}: {message}"
    status = response.status
    if status == 404:
        return NotFoundError(text)
    if status == 410:
        pruned = int(doc.get("pruned_cid", 0)) if isinstance(doc, dict) else 0
        return PositionUnavailableError(text, pruned_cid=pruned)
    return SourceError(f"{text} (HTTP {status})")


def _seg(name: str) -> str:
    """A table or subscription name as one URL path segment: a name that is "." or ".."
    encoded too (idents QA: the HTTP client took them as dot segments, and the request
    went to /cdc/tables/ or /cdc/)."""
    segment = quote(name, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment
