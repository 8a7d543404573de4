"""Where batches go. One registry maps an endpoint's scheme to a sink factory, so new
schemes can be added (``register_sink``) without touching the service.

Built in: ``http`` and ``https`` (:class:`WebhookSink`) and ``stdout`` (:class:`StdoutSink`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO

import httpx

from litecdc.cdc.config import STDOUT, CDCConfig, build_ssl_context
from litecdc.cdc.signing import decode_secret, signature_headers
from litecdc.errors import ConfigError

USER_AGENT = "litecdc-cdc/0.1"


class TransmitError(Exception):
    """One attempt to deliver a batch failed; the service retries per its policy."""


class Sink(Protocol):
    def send(self, body: bytes, message_id: str) -> None:
        """Deliver one batch or raise TransmitError — for every way it can fail, since
        the service applies its retry policy, drop limit and status to TransmitErrors
        only. ``message_id`` is stable across retries."""

    def abort(self) -> None:
        """Called from another thread when the service stops: make a ``send`` in progress
        end now (raising TransmitError), and every later one. May do nothing when sends
        cannot block for long; a sink registered without it is left to end its send."""

    def close(self) -> None: ...


SinkFactory = Callable[[CDCConfig], Sink]
_REGISTRY: dict[str, SinkFactory] = {}


def register_sink(scheme: str, factory: SinkFactory) -> None:
    """Make ``scheme://`` endpoints deliver through ``factory(config)``."""
    _REGISTRY[scheme.lower()] = factory


def known_schemes() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def create_sink(config: CDCConfig) -> Sink:
    factory = _REGISTRY.get(config.scheme)
    if factory is None:
        raise ConfigError(f"cdc config: no sink for endpoint scheme {config.scheme!r}")
    return factory(config)


#: httpcore's trace events that hand over a new connection's network stream
_NEW_STREAM_EVENTS = ("connection.connect_tcp.complete", "connection.start_tls.complete")


class WebhookSink:
    """POST each batch as JSON to an HTTP(S) endpoint; any 2xx is success.

    ``transmit_timeout`` bounds the whole request. httpx's timeouts bound each network
    operation only (connect, each write, each read), so an endpoint that answers one
    byte at a time would keep a request alive for ever. Here a timer ends the request
    at its deadline whatever it is doing: it shuts down the sockets of the client's
    connections (which it learns through httpcore's documented ``trace`` extension), so
    the read or write blocked on one returns at once. ``abort`` does the same at
    shutdown.
    """

    def __init__(self, config: CDCConfig) -> None:
        # credentials in the URL become basic auth and leave the URL, so that no log
        # line or error message (httpx logs every request's URL) can show them
        url = httpx.URL(config.endpoint)
        auth = httpx.BasicAuth(url.username, url.password) if url.userinfo else None
        self._url = url.copy_with(userinfo=b"") if url.userinfo else url
        self._key = decode_secret(config.hmac_secret) if config.hmac_secret else None
        self._timeout = config.transmit_timeout
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        headers.update(config.headers)
        verify: object = True
        if config.scheme == "https":
            verify = build_ssl_context(config.tls)
        extensions: dict[str, Any] = {"trace": self._trace}
        if config.tls.server_name:
            extensions["sni_hostname"] = config.tls.server_name
        self._extensions = extensions
        self._lock = threading.Lock()
        #: network streams of the client's connections (closed ones are pruned)
        self._streams: list[Any] = []
        self._request = 0  # number of the latest request
        self._in_flight = False
        self._expired = False  # the request in flight passed its deadline
        self._aborted = False  # abort() was called: no more requests
        self._client = httpx.Client(
            auth=auth,
            headers=headers,
            # each operation's own limit; the connect phase, which has no socket to shut
            # down yet, ends by this too
            timeout=config.transmit_timeout,
            verify=verify,  # type: ignore[arg-type]
            follow_redirects=False,
        )

    def send(self, body: bytes, message_id: str) -> None:
        headers = {}
        if self._key is not None:
            headers = signature_headers(self._key, message_id, int(time.time()), body)
        with self._lock:
            if self._aborted:
                raise TransmitError("aborted: the CDC service is stopping")
            self._request += 1
            self._in_flight, self._expired = True, False
        watchdog = threading.Timer(self._timeout, self._expire, args=(self._request,))
        watchdog.daemon = True
        watchdog.start()
        try:
            response = self._client.post(
                self._url, content=body, headers=headers, extensions=self._extensions
            )
        except Exception as exc:  # every failure is the batch's to retry, whatever raised
            raise self._failure(exc) from exc
        finally:
            watchdog.cancel()
            with self._lock:
                self._in_flight = False
        if not 200 <= response.status_code < 300:
            raise TransmitError(f"endpoint answered HTTP {response.status_code}")

    def _failure(self, exc: Exception) -> TransmitError:
        with self._lock:
            expired, aborted = self._expired, self._aborted
        if aborted:
            return TransmitError("aborted: the CDC service is stopping")
        if expired:
            return TransmitError(
                f"timed out: no complete answer within transmit_timeout ({self._timeout:g}s)"
            )
        if isinstance(exc, httpx.TimeoutException):
            return TransmitError(f"timed out: {exc.__class__.__name__}")
        # (h11's LocalProtocolError, raised for a body the client cannot frame, is not an
        # httpx.HTTPError: httpcore lets it through)
        return TransmitError(f"{exc.__class__.__name__}: {exc}")

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: note each new connection's stream, TCP then TLS."""
        if event not in _NEW_STREAM_EVENTS or info.get("return_value") is None:
            return
        stream = info["return_value"]
        with self._lock:
            self._streams = [s for s in self._streams if _open_socket(s) is not None]
            self._streams.append(stream)
            late = self._expired or self._aborted  # connected after the cut
        if late:
            _shut_down(stream)

    def _expire(self, request: int) -> None:
        """The watchdog: request number ``request`` reached its deadline."""
        with self._lock:  # held throughout: the next request cannot start meanwhile
            if self._in_flight and request == self._request:
                self._expired = True
                self._cut()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            self._cut()

    def _cut(self) -> None:
        """End the request in flight now (the lock held): shut down every connection's
        socket — the only busy one is the request's; idle ones are reconnected."""
        for stream in self._streams:
            _shut_down(stream)

    def close(self) -> None:
        self._client.close()


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


class StdoutSink:
    """Print each batch as one JSON line (``--cdc-config stdout``)."""

    def __init__(self, config: CDCConfig, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    def send(self, body: bytes, message_id: str) -> None:
        try:
            self._stream.write(body.decode() + "\n")
            self._stream.flush()
        except Exception as exc:  # a closed pipe (… | head), a full disk, a closed stream
            raise TransmitError(f"stdout: {exc.__class__.__name__}: {exc}") from exc

    def abort(self) -> None:
        pass  # a write to a stalled pipe cannot be interrupted

    def close(self) -> None:
        pass


register_sink("http", WebhookSink)
register_sink("https", WebhookSink)
register_sink(STDOUT, StdoutSink)
