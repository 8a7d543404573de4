"""uvicorn's httptools protocol with the two limits Go's net/http gives rqlite and uvicorn
does not: the size of a request's head (request line plus headers) and the time it may
take to arrive — and without one it has that Go has not: URLs of at most 64 KiB.

Without them (HTTP QA): one connection streaming 400 MB of headers grew the node by as
much and was then answered 200, and connections that sent nothing, or half their
headers, were held forever — enough of them use up the process's file descriptors.
The body has its own limit (``--max-body-bytes``, checked by the application).

And it keeps the order of answers on a connection where uvicorn did not (HTTP QA): a
refusal of a request that cannot be parsed waits for the answers to the requests before
it; a client that shut down its sending side is answered; a connection lost marks every
request on it as disconnected, not the last parsed only.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import is_ssl

#: the most bytes of request line and headers (Go's http.DefaultMaxHeaderBytes)
MAX_HEAD_BYTES = 1 << 20
#: seconds a request's head may take to arrive, from the connection (or the previous
#: response) on; a keep-alive connection idle between requests is closed sooner by
#: uvicorn's own keep-alive timeout
HEAD_TIMEOUT_S = 30.0

#: set (True) on a request's uvicorn cycle when its client shut its sending side (or
#: closed) HALF_CLOSE_GRACE_S before it was answered: reads take it as their client gone
READ_SIDE_CLOSED = "litecdc_read_side_closed"
HALF_CLOSE_GRACE_S = 2.0

#: the longest URL httptools.parse_url takes
_PARSE_URL_MAX_BYTES = 65_535

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that answers 431 to a head over MAX_HEAD_BYTES and 408 (then
    closes) when a head takes longer than HEAD_TIMEOUT_S."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str] | None = None
        #: the answer to a request that could not be parsed, held until the requests
        #: before it on the connection are answered
        self._held_refusal: bytes | None = None
        #: the client closed its side after its request(s): answer them, then close
        self._read_side_closed = False
        #: a queued request refused in its body, which does not run
        self._dropped: object | None = None
        #: the requests parsed on this connection not known to be answered, in order
        self._unanswered: collections.deque[Any] = collections.deque()
        self._half_close_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._half_close_timer is not None:
            self._half_close_timer.cancel()
            self._half_close_timer = None
        # uvicorn marks only the request parsed last as disconnected: one running before
        # it wrote its answer to the closed connection and failed, logged twice as an
        # internal error with its traceback (HTTP QA: a client that pipelined requests
        # and closed). Those queued behind do not run: nobody can read their answers.
        for cycle in self._unanswered:
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        self.pipeline.clear()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF, as Go counts them
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        hosts = sum(1 for name, _ in self.headers if name == b"host")
        if hosts > 1 or (hosts == 0 and self.parser.get_http_version() == "1.1"):
            # RFC 9112 3.2, as Go's server (rqlite) answers: which host a request is for
            # must be known (uvicorn took the request, Host or not)
            self._refusal = (
                400,
                "too many Host headers" if hosts else "missing required Host header",
            )
            raise _Refused
        query = None
        if len(self.url) > _PARSE_URL_MAX_BYTES:
            # httptools.parse_url refuses longer URLs, and uvicorn then answers 400: the
            # query (a GET /db/query's SQL, where pyrqlite puts every SELECT with its
            # parameters written in) is split off here instead (rqlite QA: an IN list of
            # 15,000 values failed)
            self.url, _, query = self.url.partition(b"?")
        super().on_headers_complete()
        if query is not None:
            self.scope["query_string"] = query.partition(b"#")[0]
        self._unanswered.append(self.cycle)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return  # (a `Connection: close` request: what came after it is not answered)
        if self._answered_all():
            if self._held_refusal is not None:
                self._write_and_close(self._held_refusal)
                return
            if self._read_side_closed:
                self.transport.close()  # nothing more can come
                return
        self._arm_head_timer()  # the next request's head, if one comes

    def data_received(self, data: bytes) -> None:
        if self._held_refusal is not None:
            return  # (the parser failed: what follows cannot be read as requests)
        super().data_received(data)

    def eof_received(self) -> bool:  # type: ignore[override]
        """The client shut down its sending side (``nc -N``, socat, some proxies). uvicorn
        closed the connection, and a request that had fully arrived was run — a write
        committed — but never answered (HTTP QA); Go's server answers it. The connection
        stays open until the requests that came are answered. (Not over TLS: asyncio
        closes it whatever this returns, with a warning.)"""
        if self._answered_all() or (self.cycle is not None and self.cycle.more_body):
            return False  # nothing to answer, or a body cut short: the client has gone
        if is_ssl(self.transport):
            return False
        self._read_side_closed = True
        # A close() looks the same until a write fails: reads still unanswered after a
        # grace stop as for a client gone (runaway reads whose clients had left held
        # every read thread); ones that end sooner are answered (review: reads of a
        # half-closed client, SELECT 1 included, were all answered "query cancelled").
        # A write runs on and is answered.
        self._half_close_timer = self.loop.call_later(
            HALF_CLOSE_GRACE_S, self._half_closed_too_long
        )
        return True

    def _half_closed_too_long(self) -> None:
        self._half_close_timer = None
        for cycle in self._unanswered:
            setattr(cycle, READ_SIDE_CLOSED, True)

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error so; a callback's refusal says what it was
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            status, message = 400, msg
        else:
            status, message = refusal
        self._refuse(status, message)

    # -- limits ---------------------------------------------------------------------------
    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refusal = (
                431,
                f"request header fields too large: the request line and headers hold more "
                f"than {MAX_HEAD_BYTES} bytes",
            )
            raise _Refused  # (httptools then raises its callback error: send_400_response)

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_too_slow)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport is None or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its head came in time
        if self._head_bytes == 0 and not getattr(self, "url", b""):
            self.transport.close()  # nothing came: close quietly, as Go does
            return
        self._refuse(
            408,
            f"request timeout: the request's headers did not arrive within {HEAD_TIMEOUT_S:g} s",
        )

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` and close — after the requests before it on the connection
        (pipelined: uvicorn answered at once and closed, so a write that had arrived
        earlier committed while its client read this refusal as the write's answer, and
        retried it: HTTP QA). A refusal inside a request's own body is that request's."""
        body = (message + "\n").encode()
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))
        )
        if self._held_refusal is not None:
            return
        cycle = self.cycle
        if cycle is not None and cycle.more_body and self.pipeline and self.pipeline[0][0] is cycle:
            # the refused request is one queued behind others, cut off in its body: it
            # does not run (it would wait for the rest of its body for good)
            self.pipeline.popleft()
            self._dropped = cycle
        own_body = cycle is not None and cycle.more_body and cycle is not self._dropped
        if own_body or self._answered_all():
            self._write_and_close(head + body)
            return
        self._held_refusal = head + body
        self.flow.pause_reading()

    def _write_and_close(self, data: bytes) -> None:
        self.transport.write(data)
        self.transport.close()

    def _answered_all(self) -> bool:
        """Whether every request that arrived on this connection (and runs) has been
        answered. (uvicorn keeps no hold of the running request once another is parsed
        behind it: ``cycle`` is the last parsed.)"""
        waiting = self._unanswered
        while waiting and (waiting[0].response_complete or waiting[0] is self._dropped):
            waiting.popleft()
        return not waiting
