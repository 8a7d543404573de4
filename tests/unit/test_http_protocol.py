"""The limits litecdc adds to uvicorn's httptools protocol, on a real uvicorn server
listening on 127.0.0.1 (a trivial ASGI app; the head timeout shortened for the test).

HTTP QA: 400 MB of headers grew a node by as much and were answered 200; connections
that sent nothing or half their headers were held forever."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from litecdc.http import protocol
from litecdc.http.protocol import GuardedHttpToolsProtocol

#: the paths the app answered, in order
RAN: list[str] = []
#: what the app's answers failed with
FAILED: list[str] = []


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b"ok"
    if scope["path"] == "/echo":
        body = b"%s %s" % (scope["raw_path"], scope["query_string"])
    if scope["path"] == "/slow":  # a write that takes a while: later requests arrive meanwhile
        while (await receive()).get("more_body"):
            pass
        await asyncio.sleep(0.3)
        body = b"slow"
    RAN.append(scope["path"])
    length = str(len(body)).encode()
    try:
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]}
        )
        await send({"type": "http.response.body", "body": body})
    except Exception as exc:
        FAILED.append(repr(exc))
        raise


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(protocol, "HEAD_TIMEOUT_S", 0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app, http=GuardedHttpToolsProtocol, lifespan="off", log_level="critical"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)
    sock.close()


def _read_all(conn: socket.socket) -> bytes:
    conn.settimeout(10)
    chunks = []
    try:
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass  # (a server closing with the request unread resets; the answer came first)
    return b"".join(chunks)


def test_a_normal_request_and_keep_alive_still_work(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        for _ in range(2):
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            conn.settimeout(10)
            answer = conn.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"ok")


def test_a_head_over_one_mebibyte_is_431(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        try:
            for i in range(2000):
                conn.sendall(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused mid-way, as it should be
        answer = _read_all(conn)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert answer.endswith(
        b"request header fields too large: the request line and headers hold more than "
        b"1048576 bytes\n"
    )


def test_a_url_over_64_kib_is_taken_as_a_whole(port: int) -> None:
    """rqlite QA: pyrqlite sends every SELECT as GET /db/query?q=… with its parameters
    written in; one with an IN list of 15,000 values (a URL over httptools' 64 KiB) was
    answered 400 "Invalid HTTP request received." Go takes it (up to the 1 MiB head)."""
    query = b"q=" + b"%2C1" * 50_000
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /echo?%s#fragment HTTP/1.1\r\nHost: x\r\n\r\n" % query)
        conn.settimeout(10)
        answer = b""
        while not answer.endswith(query):
            chunk = conn.recv(65536)
            assert chunk, answer[:200]
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
    assert answer.endswith(b"\r\n\r\n/echo " + query)


def test_half_a_head_is_408_and_nothing_at_all_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /db/execute HTTP/1.1\r\nHost: x\r\nContent-Ty")
        answer = _read_all(conn)  # the server closes it after the head timeout
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert answer.endswith(b"request timeout: the request's headers did not arrive within 0.5 s\n")
    with socket.create_connection(("127.0.0.1", port)) as idle:
        assert _read_all(idle) == b""  # closed without a word, as Go does


def test_a_body_that_stops_arriving_is_408(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """HTTP QA: a body that trickled in (or stopped) held its connection forever; the head
    limits do not cover it. litecdc's app answers 408 once no byte came for a while (here
    0.5 s), with nothing run."""
    from litecdc import NodeConfig, Statement, Store
    from litecdc.http import app as app_module

    monkeypatch.setattr(app_module, "BODY_IDLE_TIMEOUT_S", 0.5)
    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(
            app_module.create_app(store, store.config),
            http=GuardedHttpToolsProtocol,
            lifespan="off",
            log_level="critical",
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        with socket.create_connection(sock.getsockname()) as conn:
            conn.sendall(
                b"POST /db/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n["CREATE TABLE never'
            )
            answer = _read_all(conn)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"request timeout: no part of the body arrived for 0.5 s (20 bytes came)" in answer
        assert store.query([Statement("SELECT count(*) FROM sqlite_schema WHERE name = 'never'")])[
            0
        ].rows == [(0,)]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        store.close()


def test_an_advertised_scheme_unlike_the_served_one_is_warned_of(tmp_path: Path) -> None:
    """Authz QA: an HTTPS node advertising http:// started without a word; a follower's
    forwarded write then got no answer (504 "may have been applied", nothing could
    have been) and went out with the client's credentials in clear."""
    from litecdc.config import NodeConfig
    from litecdc.http.server import advertise_scheme_problem

    cert = tmp_path / "cert.pem"
    cert.write_text("")
    cluster = {"data_dir": tmp_path, "http_addr": "127.0.0.1:4001", "etcd_endpoints": ("e:2379",)}
    https = {"http_cert": cert, "http_key": cert}
    assert advertise_scheme_problem(
        NodeConfig(**cluster, **https, advertise_url="http://127.0.0.1:4001")  # type: ignore[arg-type]
    ) == (
        "--advertise-url http://127.0.0.1:4001 is http://, but this node serves HTTPS "
        "(--http-cert): other nodes forward writes and fetch snapshots there, and get no "
        "answer unless a proxy in between speaks https to this node"
    )
    assert "serves HTTP: other nodes" in str(
        advertise_scheme_problem(NodeConfig(**cluster, advertise_url="https://n1:4001"))  # type: ignore[arg-type]
    )
    for fine in (
        NodeConfig(**cluster, **https),  # type: ignore[arg-type]
        NodeConfig(**cluster, **https, advertise_url="https://n1:4001"),  # type: ignore[arg-type]
        NodeConfig(**cluster),  # type: ignore[arg-type]
        NodeConfig(data_dir=tmp_path, advertise_url="https://n1:4001"),  # (standalone)
    ):
        assert advertise_scheme_problem(fine) is None


def _answers(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each HTTP/1.1 answer in ``data``, in order."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(
            next(
                line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            ).split(b":")[1]
        )
        found.append((status, rest[:length]))
        data = rest[length:]
    return found


SLOW = b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"


@pytest.mark.parametrize(
    "bad",
    [b"GARBAGE\r\n\r\n", b"\x00", b"GET / HTTP/1.1\r\nno colon here\r\n\r\n"],
    ids=["garbage", "nul", "bad-header"],
)
def test_a_bad_request_pipelined_behind_others_is_answered_after_them(
    port: int, bad: bytes
) -> None:
    """HTTP QA: a write followed in the same packet by bytes that do not parse got only
    uvicorn's 400 — sent at once, the connection closed — while the write committed: its
    client read the 400 as the write's answer (and retried). The requests before it are
    answered first, in order, then the 400."""
    RAN.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(SLOW + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bad)
        answers = _answers(_read_all(conn))
    assert answers == [(200, b"slow"), (200, b"ok"), (400, b"Invalid HTTP request received.\n")]
    assert RAN == ["/slow", "/"]


def test_a_huge_head_pipelined_behind_a_request_is_refused_after_its_answer(port: int) -> None:
    RAN.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(
            SLOW + b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (1 << 20) + b"\r\nX-Next: b\r\n"
        )
        answers = _answers(_read_all(conn))
    assert [status for status, _ in answers] == [200, 431] and RAN == ["/slow"]


def test_a_queued_request_refused_in_its_body_does_not_run(port: int) -> None:
    RAN.clear()
    chunked = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(SLOW + chunked)
        answers = _answers(_read_all(conn))
    assert [status for status, _ in answers] == [200, 400] and RAN == ["/slow"]


def test_a_client_that_shut_its_sending_side_gets_its_answers(port: int) -> None:
    """HTTP QA: a complete request followed by shutdown(SHUT_WR) (nc -N, socat, some
    proxies) ran — a write committed — and the connection was closed unanswered."""
    RAN.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(SLOW + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        conn.shutdown(socket.SHUT_WR)
        answers = _answers(_read_all(conn))  # (ends: the server closes after them)
    assert answers == [(200, b"slow"), (200, b"ok")] and RAN == ["/slow", "/"]
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhi")
        conn.shutdown(socket.SHUT_WR)  # mid-body: gone, nothing to answer
        assert _read_all(conn) == b""


def test_a_client_gone_with_requests_pipelined_leaves_no_failed_answer(port: int) -> None:
    """HTTP QA: a client that pipelined requests and closed: the one running wrote its
    answer to the closed connection and failed (logged twice as an internal error, with
    its traceback); those queued behind it ran too, for nobody."""
    RAN.clear()
    FAILED.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(SLOW + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        time.sleep(0.1)  # (the first is running)
    time.sleep(0.6)  # the first has answered by now, into nothing
    assert (RAN, FAILED) == (["/slow"], [])


def test_garbage_after_a_connection_close_request_ends_the_connection_quietly(port: int) -> None:
    """A refusal held for after a `Connection: close` request is not written: that
    request closes the connection, and nothing after it is answered."""
    RAN.clear()
    FAILED.clear()
    close = b"POST /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi"
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(close + b"GARBAGE\r\n\r\n")
        answers = _answers(_read_all(conn))
    assert answers == [(200, b"slow")] and (RAN, FAILED) == (["/slow"], [])


@pytest.mark.parametrize(
    ("head", "answer"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", b"missing required Host header"),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", b"too many Host headers"),
        (b"GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", b"too many Host headers"),
    ],
    ids=["none", "two", "two-http-1.0"],
)
def test_a_request_without_one_host_is_400(port: int, head: bytes, answer: bytes) -> None:
    """HTTP QA: an HTTP/1.1 request without a Host header, or one with two, was answered
    as any other (RFC 9112 3.2 and Go's server, rqlite's: 400). HTTP/1.0 needs none."""
    RAN.clear()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(SLOW + head)
        answers = _answers(_read_all(conn))
    assert [status for status, _ in answers] == [200, 400], answers
    assert answer in answers[1][1] and RAN == ["/slow"]
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert _read_all(conn).startswith(b"HTTP/1.1 200 OK")
