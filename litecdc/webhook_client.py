"""POST to one webhook endpoint with a deadline on each whole request.

Shared by the node's CDC service (``litecdc.cdc.sinks``) and the pipeline's webhook sink
(``litecdc.pipeline.sinks.webhook``). httpx's timeouts bound each network operation only
(connect, each write, each read), so an endpoint that answers one byte at a time would
keep a request alive for ever. Here a timer ends the request at its deadline whatever
it is doing: it shuts down the sockets of the client's connections (learnt through
httpcore's documented ``trace`` extension), so the read or write blocked on one returns
at once. ``abort`` does the same from another thread (a service stopping).

The status of the answer decides; at most ``MAX_ANSWER_BYTES`` of its body is read (so
that a short one leaves the connection to the next request) and a longer or slower body
is dropped with its connection. Redirects are not followed: the answer is the 3xx and
where it leads. Credentials in the URL are sent as basic auth and kept out of the URL
httpx handles, which it logs::

    client = WebhookClient("https://user:pw@hooks.example/in", timeout=5.0,
                           headers={"Content-Type": "application/json"})
    try:
        answer = client.post(b"{}", {"webhook-id": "msg_1"})
    except RequestExpired:
        ...  # no complete answer within 5 s
    finally:
        client.close()
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

#: how much of an answer's body is read (to reuse the connection); the rest is cut
MAX_ANSWER_BYTES = 64 * 1024

#: httpcore's trace events that hand over a new connection's network stream
_NEW_STREAM_EVENTS = ("connection.connect_tcp.complete", "connection.start_tls.complete")
#: httpcore's trace events just before the first byte of a request is sent
_SENDING_EVENTS = ("http11.send_request_headers.started", "http2.send_request_headers.started")


def host_problem(url: str) -> str | None:
    """Why the HTTP client could never connect to the host of ``url`` (a parsable URL),
    or None: its name does not encode for DNS — an empty label (``a..b``), one of more
    than 63 characters, a malformed ``xn--`` label. httpx parses hosts leniently and
    the name is encoded only when connecting, so such an endpoint failed every request
    instead of being refused at start (QA)."""
    try:
        parsed = httpx.URL(url)
        _ = parsed.host  # decodes "xn--" labels
        host = parsed.raw_host.decode("ascii")
    except UnicodeError as exc:  # (idna's IDNAError is one)
        return str(exc)
    if not host or ":" in host:  # (an IPv6 literal has no labels)
        return None
    name = host.removesuffix(".")  # (a trailing dot: the root, fully qualified)
    if len(name) > 253:
        return f"the name is {len(name)} characters long; DNS takes at most 253"
    if any(not 1 <= len(label) <= 63 for label in name.split(".")):
        return "a label (the text between dots) is empty or longer than 63 characters"
    try:
        name.encode("idna")  # what the socket layer does with a name
    except UnicodeError as exc:
        return str(exc)
    return None


class RequestExpired(Exception):
    """The request had no complete answer by its deadline."""


class RequestAborted(Exception):
    """``abort`` was called: the request was cut, and no other is sent."""


@dataclass(frozen=True)
class Answer:
    status: int
    #: where a redirect (3xx) leads, as the endpoint wrote it; None otherwise
    location: str | None = None


class _Redirected(Exception):
    """A 3xx answer, raised by the response hook: httpx parses a redirect's Location even
    when it does not follow it, and fails on one it cannot parse."""

    def __init__(self, status: int, location: str | None) -> None:
        super().__init__(status, location)
        self.status = status
        self.location = location


def _stop_at_redirects(response: httpx.Response) -> None:
    if 300 <= response.status_code < 400:
        raise _Redirected(response.status_code, response.headers.get("location"))


class RequestWithdrawn(Exception):
    """``may_send`` said no once the connection was ready: nothing of the request was
    sent."""


class WebhookClient:
    """POSTs to one URL, each request bounded whole by ``timeout`` seconds."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        headers: Mapping[str, str],
        verify: Any = True,
        sni_hostname: str | None = None,
    ) -> None:
        endpoint = httpx.URL(url)
        auth = httpx.BasicAuth(endpoint.username, endpoint.password) if endpoint.userinfo else None
        #: the endpoint without its credentials
        self.url = endpoint.copy_with(userinfo=b"") if endpoint.userinfo else endpoint
        self.timeout = timeout
        self._extensions: dict[str, Any] = {"trace": self._trace}
        if sni_hostname:
            self._extensions["sni_hostname"] = sni_hostname
        self._lock = threading.Lock()
        #: network streams of the client's connections (closed ones are pruned)
        self._streams: list[Any] = []
        self._request = 0  # number of the latest request
        self._in_flight = False
        self._expired = False  # the request in flight passed its deadline
        self._aborted = False  # abort() was called: no more requests
        #: the request in flight's deadline (time.monotonic()) and its may_send
        self._deadline_at = 0.0
        self._may_send: Callable[[], bool] | None = None
        self._client = httpx.Client(
            auth=auth,
            headers=dict(headers),
            # each operation's own limit; the connect phase, which has no socket to shut
            # down yet, ends by this too
            timeout=timeout,
            verify=verify,
            follow_redirects=False,
            event_hooks={"response": [_stop_at_redirects]},
        )

    def post(
        self,
        body: bytes,
        headers: Mapping[str, str],
        *,
        timeout: float | None = None,
        may_send: Callable[[], bool] | None = None,
    ) -> Answer:
        """POST ``body`` once, within ``timeout`` seconds (the client's by default).
        ``may_send`` is asked once the connection is ready (connected, TLS done), just
        before the request's first byte goes: False withdraws it (RequestWithdrawn).
        Raises RequestExpired, RequestAborted, RequestWithdrawn, or whatever else made
        the request fail (httpx's errors, and others: h11's, idna's…)."""
        deadline = self.timeout if timeout is None else timeout
        with self._lock:
            if self._aborted:
                raise RequestAborted
            self._request += 1
            request = self._request
            self._in_flight, self._expired = True, False
            self._deadline_at = time.monotonic() + deadline
            self._may_send = may_send
        watchdog = threading.Timer(deadline, self._expire, args=(request,))
        watchdog.daemon = True
        watchdog.start()
        try:
            with self._client.stream(
                "POST",
                self.url,
                content=body,
                headers=headers,
                extensions=self._extensions,
                timeout=deadline,  # each operation's too, or a read ends at the default
            ) as response:
                _read_some(response)
                return Answer(response.status_code)
        except _Redirected as redirect:
            return Answer(redirect.status, redirect.location)
        except Exception as exc:
            with self._lock:
                expired, aborted = self._expired, self._aborted
            if aborted:
                raise RequestAborted from exc
            if expired:
                raise RequestExpired from exc
            raise
        finally:
            watchdog.cancel()
            with self._lock:
                self._in_flight = False

    def abort(self) -> None:
        """Cut the request in flight now and refuse any other (from any thread)."""
        with self._lock:
            self._aborted = True
            self._cut()

    def close(self) -> None:
        self._client.close()

    # -- the deadline ---------------------------------------------------------------------

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: note each new connection's stream, TCP then TLS; and
        before the request's first byte, whether it may still go."""
        if event in _SENDING_EVENTS:
            self._before_sending()
            return
        if event not in _NEW_STREAM_EVENTS or info.get("return_value") is None:
            return
        stream = info["return_value"]
        with self._lock:
            self._streams = [s for s in self._streams if _open_socket(s) is not None]
            self._streams.append(stream)
            late = self._expired or self._aborted  # connected after the cut
        if late:
            _shut_down(stream)

    def _before_sending(self) -> None:
        """Webhook QA: a CDC leader stopped (SIGSTOP) during a TLS handshake finished it
        on waking, seconds after another node took the lead, and sent its batch — the
        deadline's timer, waking at the same moment, lost the race. Asked here, the
        lease's own clock says the node no longer leads, and the deadline has passed."""
        with self._lock:
            may_send, late = self._may_send, time.monotonic() >= self._deadline_at
            if late:
                self._expired = True
        if late:
            raise RequestExpired
        if may_send is not None and not may_send():
            raise RequestWithdrawn

    def _expire(self, request: int) -> None:
        """The watchdog: request number ``request`` reached its deadline."""
        with self._lock:  # held throughout: the next request cannot start meanwhile
            if self._in_flight and request == self._request:
                self._expired = True
                self._cut()

    def _cut(self) -> None:
        """End the request in flight now (the lock held): shut down every connection's
        socket — the only busy one is the request's; idle ones are reconnected."""
        for stream in self._streams:
            _shut_down(stream)


def _read_some(response: httpx.Response) -> None:
    """Read up to MAX_ANSWER_BYTES of the answer's body. The status alone says whether
    the body was taken: a longer body, or one cut by the deadline, is dropped with its
    connection (closing the response closes a connection not read to its end)."""
    received = 0
    try:
        for chunk in response.iter_raw():
            received += len(chunk)
            if received >= MAX_ANSWER_BYTES:
                return
    except Exception:  # whatever broke the body, the status was answered
        return


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
