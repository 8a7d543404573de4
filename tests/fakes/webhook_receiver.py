"""A real HTTP(S) webhook receiver for tests, with failure injection.

``WebhookReceiver`` listens on 127.0.0.1 (a free port unless one is given), answers
in background threads (``http.server.ThreadingHTTPServer``, HTTP/1.1 keep-alive),
and records every request: method, path, headers, raw body, parsed JSON, arrival
time and the answer given. It can be told, at any time while it runs, to answer a
share of requests with 503 (deterministically, from a seeded ``random.Random``), to
fail the next N requests, to sleep before answering (to outlast a client's
timeout), to trickle its answer (status and headers at once, then the body one byte
every ``trickle_seconds``: each read completes, so only a limit on the whole request
ends it; with ``trickle_head`` the status line and headers go a byte at a time too), to
close connections without answering, or to answer 202/204 instead of
200. With ``tls=make_certs(...)`` it serves HTTPS, and with
``require_client_cert=True`` it demands a client certificate signed by that CA.

Usage::

    with WebhookReceiver(fail_share=0.5, seed=7) as receiver:
        start_the_service(endpoint=receiver.url)       # http://127.0.0.1:PORT/hook
        batches = receiver.wait_for(lambda bs: len(bs) >= 3, timeout=10)
        assert all(receiver.verify_standard_webhooks("whsec_..."))

Starting late on a port chosen in advance (the endpoint is "down" until then)::

    port = reserve_port()
    receiver = WebhookReceiver(port=port)        # receiver.url is known already
    ...                                          # the client fails to connect
    receiver.start()                             # now it answers; stop() frees the port

Which answer a request gets, first rule that applies:

1. ``drop_connections`` or ``drop_next(n)``: the connection is closed, no answer;
2. ``fail_next(n, status)``: that status;
3. ``fail_share``: 503 for that share of requests (one draw per request, always, so
   the sequence of draws depends only on the seed and the number of requests);
4. a method other than POST: 405; a body that is not JSON: 400;
5. otherwise ``status_code`` (200 by default).

``delay_seconds`` is slept before any of these answers; with ``trickle_seconds``
set, an answer with a body goes out a byte at a time until the setting goes back
to 0 (the rest then goes at once) or the receiver stops. A request answered 2xx
after a delay counts as accepted even if the client gave up waiting (as a real
endpoint would have processed it); ``RecordedRequest.delay_seconds`` tells them apart.
A request is recorded just before its answer goes out, so once a client has its
answer the record is there to assert on.

The Standard Webhooks signature check (``verify_standard_webhook``) is written here
from the specification, independently of litecdc's signing code.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import itertools
import json
import random
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self, TypeVar

from .certs import CertFiles, server_ssl_context

__all__ = [
    "RecordedRequest",
    "TLSFailure",
    "WebhookReceiver",
    "decode_standard_webhooks_secret",
    "reserve_port",
    "sign_standard_webhook",
    "verify_standard_webhook",
]

DEFAULT_PATH = "/hook"
#: length of a trickled answer's body (padded with spaces): long enough to outlast any test
TRICKLE_BODY_BYTES = 4096
HANDSHAKE_TIMEOUT_SECONDS = 10.0
IDLE_CONNECTION_TIMEOUT_SECONDS = 60.0
STANDARD_WEBHOOKS_TOLERANCE_SECONDS = 300.0
_SECRET_PREFIX = "whsec_"

T = TypeVar("T")


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the receiver saw it, and how it was answered."""

    seq: int
    """Arrival order (0, 1, 2 …) across the receiver's whole life, restarts included."""
    method: str
    path: str
    """Path and query string as sent, e.g. ``/hook``."""
    headers: Mapping[str, str]
    """Header names in lower case; repeated headers joined with ``", "``."""
    body: bytes
    json_body: Any
    """The body parsed as JSON, or None when it is empty or not JSON."""
    received_monotonic: float
    received_wall: float
    """Arrival time (body fully read), ``time.monotonic()`` and ``time.time()``."""
    status: int | None
    """Status answered, or None when the connection was dropped."""
    accepted: bool
    """True when answered 2xx."""
    dropped: bool
    delay_seconds: float
    """Seconds slept before answering."""
    answered_monotonic: float
    """When the answer (or the drop) went out, ``time.monotonic()``."""
    connection_id: int
    """Same id = same TCP connection (keep-alive reuse)."""
    tls: bool
    client_cert_subject: str | None
    """Verified client certificate subject, e.g. ``commonName=x,organizationName=y``."""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class TLSFailure:
    """A connection whose TLS handshake failed (e.g. no client certificate under mTLS)."""

    client_address: tuple[str, int]
    error: str
    monotonic: float


@dataclass(frozen=True)
class _Decision:
    seq: int
    drop: bool
    status: int
    delay: float


def reserve_port(host: str = "127.0.0.1") -> int:
    """A port that is free now, for a receiver to be started on later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


# --- Standard Webhooks (https://www.standardwebhooks.com), written from the spec --------


def decode_standard_webhooks_secret(secret: str | bytes) -> bytes:
    """The HMAC key: ``whsec_`` + base64 for a str (prefix optional), raw key for bytes."""
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret.removeprefix(_SECRET_PREFIX)
        try:
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError("standard webhooks secret is not base64") from exc
    if not key:
        raise ValueError("standard webhooks secret is empty")
    return key


def sign_standard_webhook(secret: str | bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,`` + base64(HMAC-SHA256(key, f"{msg_id}.{timestamp}.{body}"))."""
    key = decode_standard_webhooks_secret(secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify_standard_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_seconds: float | None = STANDARD_WEBHOOKS_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """True when one ``v1`` signature in ``webhook-signature`` matches.

    Requires ``webhook-id`` (non-empty; any text, dots included — the signed content
    ``{id}.{timestamp}.{body}`` is never split, and the reference libraries accept
    such ids) and ``webhook-timestamp`` (integer seconds); with ``tolerance_seconds``
    the timestamp must be within that many seconds of ``now`` (default: the current
    time). Other signature versions (e.g. ``v1a``) in the space-separated list are
    skipped.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id = lower.get("webhook-id", "")
    timestamp = lower.get("webhook-timestamp", "")
    signatures = lower.get("webhook-signature", "")
    if not msg_id or not timestamp.isdigit() or not signatures:
        return False
    if tolerance_seconds is not None:
        reference = time.time() if now is None else now
        if abs(reference - int(timestamp)) > tolerance_seconds:
            return False
    expected = base64.b64decode(
        sign_standard_webhook(secret, msg_id, int(timestamp), body).split(",", 1)[1]
    )
    for item in signatures.split(" "):
        version, _, encoded = item.partition(",")
        if version != "v1" or not encoded:
            continue
        try:
            candidate = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if hmac.compare_digest(expected, candidate):
            return True
    return False


# --- the server ---------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        owner: WebhookReceiver,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        self.owner = owner
        self.ssl_context = ssl_context
        super().__init__(address, _Handler)

    def finish_request(
        self,
        request: socket.socket | tuple[bytes, socket.socket],
        client_address: Any,
    ) -> None:
        if isinstance(request, tuple):  # datagram servers only
            return
        conn: socket.socket = request
        if self.ssl_context is not None:
            # The handshake runs here, in the connection's own thread, so a client
            # that never finishes it cannot block the accept loop.
            request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
            try:
                conn = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self.owner._record_tls_failure(client_address, exc)
                return
        try:
            _Handler(conn, client_address, self)
        finally:
            if conn is not request:
                conn.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connections reset by clients are expected here; stay quiet."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "litecdc-test-webhook/1"
    timeout = IDLE_CONNECTION_TIMEOUT_SECONDS
    # Headers and body go out in separate writes; without TCP_NODELAY, Nagle plus the
    # client's delayed ACK would stall every keep-alive request by ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    connection_id: int
    client_cert_subject: str | None

    def setup(self) -> None:
        super().setup()
        self.client_cert_subject = _peer_subject(self.connection)
        self.connection_id = self.server.owner._register_connection(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass
        finally:
            self.server.owner._unregister_connection(self.connection_id)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr."""

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        owner = self.server.owner
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        received_monotonic, received_wall = time.monotonic(), time.time()
        parsed, json_ok = _parse_json(body)
        decision = owner._decide(self.command, json_ok)

        dropped = decision.drop
        if decision.delay > 0 and owner._stopping.wait(decision.delay):
            dropped = True  # stopped while sleeping: the answer never comes

        # Recorded before the answer goes out, so a client that has its answer can
        # assert on the receiver's records straight away.
        status = None if dropped else decision.status
        owner._record(
            seq=decision.seq,
            method=self.command,
            path=self.path,
            headers=_lower_headers(self.headers.items()),
            body=body,
            json_body=parsed,
            received_monotonic=received_monotonic,
            received_wall=received_wall,
            status=status,
            accepted=status is not None and 200 <= status < 300,
            dropped=dropped,
            delay_seconds=decision.delay,
            answered_monotonic=time.monotonic(),
            connection_id=self.connection_id,
            tls=isinstance(self.connection, ssl.SSLSocket),
            client_cert_subject=self.client_cert_subject,
        )
        if dropped:
            self._drop()
        else:
            self._answer(decision.status)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline(65537)
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _answer(self, status: int) -> None:
        payload = b"" if status in (204, 304) else json.dumps({"status": status}).encode()
        owner = self.server.owner
        trickle = bool(payload) and owner.trickle_seconds > 0
        if trickle:
            payload = payload.ljust(TRICKLE_BODY_BYTES)
        try:
            if trickle and owner.trickle_head:
                head = (
                    f"{self.protocol_version} {status} {HTTPStatus(status).phrase}\r\n"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n"
                ).encode()
                self.wfile.write(self._trickle(head + payload))
                self.wfile.flush()
                return
            self.send_response(status)
            if status not in (204, 304):
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
            if self.server.owner._stopping.is_set():
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if trickle:
                self.wfile.flush()
                payload = self._trickle(payload)
            self.wfile.write(payload)
            self.wfile.flush()
        except OSError:
            self.close_connection = True

    def _trickle(self, payload: bytes) -> bytes:
        """Send ``payload`` a byte at a time while trickling is on; return what is left."""
        owner = self.server.owner
        while payload and owner.trickle_seconds > 0:
            if owner._stopping.wait(owner.trickle_seconds):
                raise ConnectionAbortedError("receiver stopping")
            self.wfile.write(payload[:1])
            self.wfile.flush()
            payload = payload[1:]
        return payload

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _parse_json(body: bytes) -> tuple[Any, bool]:
    if not body:
        return None, False
    try:
        return json.loads(body), True
    except ValueError:
        return None, False


def _lower_headers(items: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in items:
        key = str(name).lower()
        out[key] = f"{out[key]}, {value}" if key in out else str(value)
    return out


def _peer_subject(conn: socket.socket) -> str | None:
    if not isinstance(conn, ssl.SSLSocket):
        return None
    cert = conn.getpeercert()
    if not cert or "subject" not in cert:
        return None
    parts: list[str] = []
    for rdn in cert["subject"]:
        for attribute in rdn:
            parts.append(f"{attribute[0]}={attribute[1]}")
    return ",".join(parts)


class WebhookReceiver:
    """A real HTTP(S) server on 127.0.0.1 that records webhook requests. See module doc."""

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        path: str = DEFAULT_PATH,
        tls: CertFiles | None = None,
        require_client_cert: bool = False,
        status_code: int = 200,
        fail_share: float = 0.0,
        seed: int = 0,
        delay_seconds: float = 0.0,
        drop_connections: bool = False,
    ) -> None:
        if require_client_cert and tls is None:
            raise ValueError("require_client_cert needs tls=make_certs(...)")
        self.host = host
        self.path = path
        self.tls = tls
        self.require_client_cert = require_client_cert
        self._port = port
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rng = random.Random(seed)
        self._status_code = 200
        self._fail_share = 0.0
        self._delay_seconds = 0.0
        #: seconds between the bytes of an answer's body; 0 sends it at once
        self.trickle_seconds = 0.0
        #: trickle the status line and headers too (no status arrives for a long time)
        self.trickle_head = False
        self.drop_connections = drop_connections
        self.status_code = status_code
        self.fail_share = fail_share
        self.delay_seconds = delay_seconds
        self._fail_queue: deque[int] = deque()
        self._drop_next = 0
        self._seq = itertools.count()
        self._connection_ids = itertools.count(1)
        self._connections: dict[int, socket.socket] = {}
        self._records: list[RecordedRequest] = []
        self._tls_failures: list[TLSFailure] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # --- life cycle -----------------------------------------------------------------------

    def start(self) -> Self:
        """Start serving (again, on the same port, after a stop). Returns self."""
        if self._server is not None:
            return self
        ctx = None
        if self.tls is not None:
            ctx = server_ssl_context(self.tls, require_client_cert=self.require_client_cert)
        self._stopping.clear()
        server = _Server((self.host, self._port), self, ctx)
        self._port = int(server.server_address[1])
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"webhook-receiver-{self._port}",
            daemon=True,
        )
        self._server, self._thread = server, thread
        thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, close every open connection and release the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            open_connections = list(self._connections.values())
        for conn in open_connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if thread is not None:
            thread.join(timeout)
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._connections and time.monotonic() < deadline:
                self._changed.wait(0.05)
        self._server, self._thread = None, None

    @property
    def running(self) -> bool:
        return self._server is not None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- where it listens -----------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port == 0:
            raise RuntimeError("port unknown before start(); pass port=reserve_port()")
        return self._port

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The webhook URL, e.g. ``http://127.0.0.1:PORT/hook``."""
        return self.base_url + self.path

    # --- failure injection (safe to change while running) ----------------------------------

    @property
    def status_code(self) -> int:
        """Status for requests no failure rule applies to (200; 202 and 204 work too)."""
        return self._status_code

    @status_code.setter
    def status_code(self, value: int) -> None:
        if not 100 <= value <= 599:
            raise ValueError(f"status_code must be an HTTP status, got {value}")
        self._status_code = value

    @property
    def fail_share(self) -> float:
        """Share of requests (0.0-1.0) answered 503, drawn from the seeded generator."""
        return self._fail_share

    @fail_share.setter
    def fail_share(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"fail_share must be within 0.0-1.0, got {value}")
        self._fail_share = value

    @property
    def delay_seconds(self) -> float:
        """Seconds to sleep before answering each request."""
        return self._delay_seconds

    @delay_seconds.setter
    def delay_seconds(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"delay_seconds must not be negative, got {value}")
        self._delay_seconds = value

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next ``n`` requests with ``status``."""
        if n < 0:
            raise ValueError(f"n must not be negative, got {n}")
        with self._lock:
            self._fail_queue.extend([status] * n)

    def drop_next(self, n: int) -> None:
        """Close the connection without answering for the next ``n`` requests."""
        if n < 0:
            raise ValueError(f"n must not be negative, got {n}")
        with self._lock:
            self._drop_next += n

    def _decide(self, method: str, json_ok: bool) -> _Decision:
        with self._lock:
            seq = next(self._seq)
            draw = self._rng.random()
            delay = self._delay_seconds
            drop, status = False, self._status_code
            if self.drop_connections or self._drop_next > 0:
                if not self.drop_connections:
                    self._drop_next -= 1
                drop, status = True, 0
            elif self._fail_queue:
                status = self._fail_queue.popleft()
            elif draw < self._fail_share:
                status = 503
            elif method != "POST":
                status = 405
            elif not json_ok:
                status = 400
            return _Decision(seq=seq, drop=drop, status=status, delay=delay)

    # --- what was received -----------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request, in arrival order."""
        with self._lock:
            return sorted(self._records, key=lambda r: r.seq)

    @property
    def batches(self) -> list[Any]:
        """Parsed JSON bodies of the requests answered 2xx, in arrival order."""
        return [r.json_body for r in self.requests if r.accepted]

    @property
    def accepted(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.accepted]

    @property
    def rejected(self) -> list[RecordedRequest]:
        """Requests answered with a non-2xx status or dropped."""
        return [r for r in self.requests if not r.accepted]

    @property
    def tls_failures(self) -> list[TLSFailure]:
        with self._lock:
            return list(self._tls_failures)

    def reset(self) -> None:
        """Forget recorded requests and TLS failures (injection settings are kept)."""
        with self._lock:
            self._records.clear()
            self._tls_failures.clear()

    def wait_for(self, predicate: Callable[[list[Any]], bool], timeout: float = 10.0) -> list[Any]:
        """Wait until ``predicate(batches)`` holds; return the batches, or raise TimeoutError."""
        return self._wait(lambda: self.batches, predicate, timeout, "batches")

    def wait_for_requests(
        self, predicate: Callable[[list[RecordedRequest]], bool], timeout: float = 10.0
    ) -> list[RecordedRequest]:
        """Wait until ``predicate(requests)`` holds (all requests, answered or not)."""
        return self._wait(lambda: self.requests, predicate, timeout, "requests")

    def _wait(
        self,
        snapshot: Callable[[], list[T]],
        predicate: Callable[[list[T]], bool],
        timeout: float,
        what: str,
    ) -> list[T]:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                count = len(self._records)
            items = snapshot()
            if predicate(items):
                return items
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"condition on {what} not met within {timeout}s "
                    f"({len(self.requests)} requests, {len(self.batches)} accepted batches)"
                )
            with self._changed:
                if len(self._records) == count:
                    self._changed.wait(min(remaining, 0.05))

    def verify_standard_webhooks(
        self,
        secret: str | bytes,
        *,
        tolerance_seconds: float | None = STANDARD_WEBHOOKS_TOLERANCE_SECONDS,
    ) -> list[bool]:
        """For each recorded request (arrival order): does its signature verify?

        The timestamp tolerance is measured against the request's arrival time.
        """
        return [
            verify_standard_webhook(
                secret,
                r.headers,
                r.body,
                tolerance_seconds=tolerance_seconds,
                now=r.received_wall,
            )
            for r in self.requests
        ]

    # --- called from the server threads ----------------------------------------------------

    def _record(self, **fields: Any) -> None:
        with self._changed:
            self._records.append(RecordedRequest(**fields))
            self._changed.notify_all()

    def _record_tls_failure(self, client_address: Any, exc: BaseException) -> None:
        failure = TLSFailure(
            client_address=(str(client_address[0]), int(client_address[1])),
            error=f"{type(exc).__name__}: {exc}",
            monotonic=time.monotonic(),
        )
        with self._changed:
            self._tls_failures.append(failure)
            self._changed.notify_all()

    def _register_connection(self, conn: socket.socket) -> int:
        with self._lock:
            connection_id = next(self._connection_ids)
            self._connections[connection_id] = conn
            return connection_id

    def _unregister_connection(self, connection_id: int) -> None:
        with self._changed:
            self._connections.pop(connection_id, None)
            self._changed.notify_all()
