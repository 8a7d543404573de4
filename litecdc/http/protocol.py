"""uvicorn's httptools protocol with the two limits Go's net/http gives rqlite and uvicorn
does not: the size of a request's head (request line plus headers) and the time it may
take to arrive — and without one it has that Go has not: URLs of at most 64 KiB.

Without them (HTTP QA): one connection streaming 400 MB of headers grew the node by as
much and was then answered 200, and connections that sent nothing, or half their
headers, were held forever — enough of them use up the process's file descriptors.
The body has its own limit (``--max-body-bytes``, checked by the application).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: the most bytes of request line and headers (Go's http.DefaultMaxHeaderBytes)
MAX_HEAD_BYTES = 1 << 20
#: seconds a request's head may take to arrive, from the connection (or the previous
#: response) on; a keep-alive connection idle between requests is closed sooner by
#: uvicorn's own keep-alive timeout
HEAD_TIMEOUT_S = 30.0

#: the longest URL httptools.parse_url takes
_PARSE_URL_MAX_BYTES = 65_535

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


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

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
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

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_timer()  # the next request's head, if one comes

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error so; a callback's refusal says what it was
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            super().send_400_response(msg)
        else:
            self._send_refusal(*refusal)

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
        self._send_refusal(
            408,
            f"request timeout: the request's headers did not arrive within {HEAD_TIMEOUT_S:g} s",
        )

    def _send_refusal(self, status: int, message: str) -> None:
        body = (message + "\n").encode()
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body))
        )
        self.transport.write(head + body)
        self.transport.close()
