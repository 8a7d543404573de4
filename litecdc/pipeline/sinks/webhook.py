"""Webhook sink: POST each batch as one JSON document (at-least-once).

Body of a change batch::

    {"subscription": "orders-hook", "table": "orders", "kind": "changes",
     "after_cid": 40, "end_cid": 42, "part": 1, "parts": 1,
     "events": [{"id": "orders-hook:5d41402abc4b:41-0-upsert", "table": …, "op": …,
                 "cid": …, "seq": …, "key": {…}, "row": {…}}, …]}

(event form: ``litecdc.pipeline.sinks.messages``). A snapshot chunk is
``"kind": "snapshot"`` with its rows as events of op 'snapshot'; the end of a snapshot is
``"kind": "snapshot_done"`` with ``init_cid`` (rows older than it are gone). A batch goes
as several parts when it has more than ``MAX_EVENTS_PER_POST`` events or its body would be
larger than ``MAX_BODY_BYTES`` — receivers commonly refuse more than 1 MiB (nginx's default
``client_max_body_size``) with 413, which no retry gets past; an event larger than that
goes alone.

Ids, the same on every retry and after a restart (receivers de-duplicate on them), scoped
as every message sink's (``messages.scoped_id``: ``<subscription>:<registration>:…``, so
neither another subscription sending here nor a subscription re-created under the name,
whose cids may be the same again, repeats them):

- header ``webhook-id``: ``…:<after_cid>-<end_cid>-<part>`` for changes,
  ``…:<first event's id>-<part>`` for a snapshot chunk, ``…:snapshot-done-<init_cid>``;
- each event's ``id``: ``…:<cid>-<seq>-<op>`` (snapshot rows: ``…:<cid>-snapshot-<hash>``),
  as RabbitMQ's ``message_id`` and NATS's ``Nats-Msg-Id``.

With ``litecdc_secret`` every request carries a Standard Webhooks signature.

Requests: ``litecdc_timeout`` bounds one request whole — connecting, sending, waiting for
and reading the answer. httpx's timeouts bound each network operation only, so a receiver
answering a byte at a time would hold a request for ever; here a timer shuts the
request's socket down at its deadline (as the CDC service's webhook sink does,
``litecdc.cdc.sinks``). Credentials in the URL are sent as basic auth and kept out of the
URL httpx handles (and logs); errors and this module's logs show the URL masked
(``mask_url``).

Answers: the status decides. 2xx: delivered (the body is not needed: up to
``MAX_ANSWER_BYTES`` of it is read, so that the connection serves the next request, and
a longer or slower one is cut). 408, 429, 5xx and failures of any kind — a refused or
dropped connection, the deadline, an answer that is not HTTP — are retried, with
exponential backoff, up to ``litecdc_retries`` attempts in all. A redirect (3xx) or any
other 4xx is a SinkError at once: redirects are not followed (the batch and its signature
would go to another address); give the sink the address the receiver redirects to.

``applied_cid`` is what this process has delivered (0 after a restart: the pipeline
resumes from its own progress record and the receiver de-duplicates).

Example::

    sink = WebhookSink("https://hooks.example/orders?litecdc_secret=whsec_…", spec, "orders-hook")
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.messages import encode, event_messages, scoped_id, snapshot_messages
from litecdc.pipeline.sinks.registry import (
    WebhookOptions,
    mask_url,
    parse_sink_url,
    scrub_url_password,
)
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")

USER_AGENT = "litecdc-pipeline/0.1"
MAX_EVENTS_PER_POST = 10_000
#: the largest body of one POST, unless a single event is larger (under nginx's 1 MiB)
MAX_BODY_BYTES = 1_000_000
#: how much of an answer's body is read (to reuse the connection); the rest is cut
MAX_ANSWER_BYTES = 64 * 1024
BACKOFF_BASE = 0.2  # seconds; doubled per attempt
BACKOFF_CAP = 10.0

#: httpcore's trace events that hand over a new connection's network stream
_NEW_STREAM_EVENTS = ("connection.connect_tcp.complete", "connection.start_tls.complete")
_Message = tuple[str, dict[str, Any]]  # (unscoped id, event document)


class _Redirected(Exception):
    """A 3xx answer, raised by the response hook (httpx parses a redirect's Location, and
    fails on one it cannot, even when it does not follow it)."""

    def __init__(self, status: int, location: str | None) -> None:
        super().__init__(status, location)
        self.status = status
        self.location = location


def _refuse_redirects(response: httpx.Response) -> None:
    if 300 <= response.status_code < 400:
        raise _Redirected(response.status_code, response.headers.get("location"))


class WebhookSink(Sink):
    kind = "log"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, WebhookOptions):
            raise SinkError(f"webhook sink: {mask_url(url)} is not an http(s):// URL")
        self.options = options
        self._safe = mask_url(options.url)
        self._key: bytes | None = None
        if options.secret:
            from litecdc.cdc.signing import decode_secret

            self._key = decode_secret(options.secret)
        # credentials in the URL become basic auth and leave the URL, which httpx logs
        endpoint = httpx.URL(options.url)
        auth = httpx.BasicAuth(endpoint.username, endpoint.password) if endpoint.userinfo else None
        self._endpoint = endpoint.copy_with(userinfo=b"") if endpoint.userinfo else endpoint
        self._lock = threading.Lock()
        #: network streams of the client's connections (closed ones are pruned)
        self._streams: list[Any] = []
        self._request = 0  # number of the latest request
        self._in_flight = False
        self._expired = False  # the request in flight passed its deadline
        self._client = httpx.Client(
            auth=auth,
            # each network operation's own limit; the connect phase, which has no socket
            # to shut down yet, ends by this too
            timeout=options.timeout,
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
            follow_redirects=False,
            event_hooks={"response": [_refuse_redirects]},
        )
        self._extensions: dict[str, Any] = {"trace": self._trace}
        self._applied = 0
        self.sleep = time.sleep  # tests may speed the backoff up

    def prepare(self) -> None:
        """Nothing to create; reachability shows at the first POST."""

    # -- one batch ----------------------------------------------------------------------

    def _post(self, body: bytes, batch_id: str) -> None:
        """Deliver one document, retried per the policy (module docstring)."""
        webhook_id = scoped_id(self.subscription, self.registration, batch_id)
        retries = self.options.retries
        last = ""
        for attempt in range(1, retries + 1):
            headers = {"webhook-id": webhook_id}
            if self._key is not None:
                from litecdc.cdc.signing import signature_headers

                headers = signature_headers(self._key, webhook_id, int(time.time()), body)
            try:
                status = self._attempt(body, headers)
            except _Redirected as exc:
                raise self._redirect_error(exc.status, exc.location) from None
            except Exception as exc:  # every failure of a send is the batch's to retry
                last = self._failure(exc)
            else:
                if 200 <= status < 300:
                    return
                if 400 <= status < 500 and status not in (408, 429):
                    size = f" (a body of {len(body)} bytes)" if status == 413 else ""
                    raise SinkError(
                        f"webhook sink: {self._safe} refused the batch with HTTP {status}"
                        f"{size}: check the endpoint's URL and what it accepts"
                    )
                last = f"HTTP {status}"
            if attempt < retries:
                delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1))
                log.warning(
                    "webhook sink: POST to %s failed (%s), retry %d/%d in %.1fs",
                    self._safe,
                    last,
                    attempt,
                    retries - 1,
                    delay,
                )
                self.sleep(delay)
        raise SinkError(
            f"webhook sink: cannot deliver to {self._safe} after {retries} attempt(s) "
            f"({last}): check the endpoint is up"
        )

    def _attempt(self, body: bytes, headers: dict[str, str]) -> int:
        """POST once, within ``litecdc_timeout`` all of it; the answer's status."""
        with self._lock:
            self._request += 1
            request = self._request
            self._in_flight, self._expired = True, False
        watchdog = threading.Timer(self.options.timeout, self._expire, args=(request,))
        watchdog.daemon = True
        watchdog.start()
        try:
            with self._client.stream(
                "POST", self._endpoint, content=body, headers=headers, extensions=self._extensions
            ) as response:
                _read_some(response)
                return response.status_code
        finally:
            watchdog.cancel()
            with self._lock:
                self._in_flight = False

    def _failure(self, exc: Exception) -> str:
        """What went wrong in one attempt, in a few words, without the URL's password."""
        with self._lock:
            expired = self._expired
        if expired:
            return (
                f"timed out: no complete answer within litecdc_timeout ({self.options.timeout:g}s)"
            )
        if isinstance(exc, httpx.TimeoutException):
            return (
                f"timed out: {type(exc).__name__} after litecdc_timeout ({self.options.timeout:g}s)"
            )
        detail = scrub_url_password(str(exc), self.options.url)
        return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__

    def _redirect_error(self, status: int, location: str | None) -> SinkError:
        target = f" to {mask_url(location)}" if location else ""
        return SinkError(
            f"webhook sink: {self._safe} answered HTTP {status}, a redirect{target}: "
            "redirects are not followed (the batch and its signature would go to another "
            "address): give the sink the URL the endpoint redirects to"
        )

    # -- the deadline -------------------------------------------------------------------

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: note each new connection's stream, TCP then TLS."""
        if event not in _NEW_STREAM_EVENTS or info.get("return_value") is None:
            return
        stream = info["return_value"]
        with self._lock:
            self._streams = [s for s in self._streams if _open_socket(s) is not None]
            self._streams.append(stream)
            late = self._expired  # connected after the deadline
        if late:
            _shut_down(stream)

    def _expire(self, request: int) -> None:
        """The watchdog: request number ``request`` reached its deadline. Shut down every
        connection's socket — the only busy one is the request's; idle ones are
        reconnected — so the read or write blocked on it returns at once."""
        with self._lock:  # held throughout: the next request cannot start meanwhile
            if self._in_flight and request == self._request:
                self._expired = True
                for stream in self._streams:
                    _shut_down(stream)

    # -- documents ----------------------------------------------------------------------

    def _send(self, kind: str, messages: Sequence[_Message], batch_id: str, **fields: Any) -> None:
        """POST ``messages`` as one document of ``kind``, or as several parts."""
        events = [
            encode({"id": scoped_id(self.subscription, self.registration, i), **doc})
            for i, doc in messages
        ]

        def head(part: int, parts: int) -> bytes:
            doc = {
                "subscription": self.subscription,
                "table": self.spec.name,
                "kind": kind,
                **fields,
                "part": part,
                "parts": parts,
            }
            return encode(doc)[:-1] + b',"events":['  # "events" goes last

        room = MAX_BODY_BYTES - len(head(10**9, 10**9)) - len(b"]}")
        groups = _groups(events, room)
        for number, group in enumerate(groups, start=1):
            body = head(number, len(groups)) + b",".join(group) + b"]}"
            self._post(body, f"{batch_id}-{number}")

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        messages = list(snapshot_messages(rows, self.spec))
        cid = pc.max(rows[CID_COLUMN]).as_py()
        # the first row's id names the chunk: stable across retries and processes
        self._send("snapshot", messages, messages[0][0], cid=cid)

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        if batch.end_cid <= self._applied:
            return False
        if self._applied and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], self._applied))
        after = max(batch.after_cid, self._applied)
        self._send(
            "changes",
            list(event_messages(events, self.spec)),
            f"{after}-{batch.end_cid}",
            after_cid=after,
            end_cid=batch.end_cid,
        )
        self._applied = batch.end_cid
        return True

    def finish_snapshot(self, init_cid: int) -> int:
        doc = {
            "subscription": self.subscription,
            "table": self.spec.name,
            "kind": "snapshot_done",
            "init_cid": init_cid,
        }
        self._post(encode(doc), f"snapshot-done-{init_cid}")
        return 0

    def applied_cid(self) -> int:
        return self._applied

    def close(self) -> None:
        self._client.close()


def _groups(events: list[bytes], room: int) -> list[list[bytes]]:
    """``events`` in order, in groups of at most MAX_EVENTS_PER_POST events and ``room``
    bytes (with the commas between them) — an event larger than ``room`` alone. One
    empty group for no events (the batch's document still goes)."""
    groups: list[list[bytes]] = [[]]
    size = 0
    for event in events:
        group = groups[-1]
        if group and (len(group) >= MAX_EVENTS_PER_POST or size + 1 + len(event) > room):
            group = []
            groups.append(group)
            size = 0
        size += len(event) + (1 if len(group) else 0)
        group.append(event)
    return groups


def _read_some(response: httpx.Response) -> None:
    """Read up to MAX_ANSWER_BYTES of the answer's body, so that a short one leaves the
    connection to the next request. The status alone says whether the batch was taken:
    a longer body, or one cut by the deadline, is dropped with its connection."""
    received = 0
    try:
        for chunk in response.iter_raw():
            received += len(chunk)
            if received >= MAX_ANSWER_BYTES:
                return
    except Exception as exc:  # whatever broke the body, the status was answered
        log.debug("webhook sink: answer's body cut: %s: %s", type(exc).__name__, exc)


def _open_socket(stream: Any) -> socket.socket | None:
    sock = stream.get_extra_info("socket")
    if not isinstance(sock, socket.socket) or sock.fileno() == -1:
        return None  # closed, or handed over to its TLS stream
    return sock


def _shut_down(stream: Any) -> None:
    """Shut the stream's socket down for both directions: a recv or send blocked on it in
    another thread returns at once (closing the descriptor would not wake it)."""
    sock = _open_socket(stream)
    if sock is not None:
        with contextlib.suppress(OSError):
            # the plain socket's method: SSLSocket.shutdown would also drop its SSL
            # object under the thread reading through it
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
