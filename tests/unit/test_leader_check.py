"""readyz's leader check (LeaderForwarder.leader_problem) against a real HTTP server.

Review: the check shared the forwarding pool, so with 100 forwarded requests in flight
a follower's readyz waited for a connection, timed out and called a healthy leader
unreachable — load balancers would drop followers exactly when they are busy.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trustme

from litecdc.http.forward import IDLE_PEER_CONNECTION_S, KEEP_ALIVE_S, LeaderForwarder

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class SlowLeader:
    """A minimal HTTP/1.1 server: /readyz answers at once, anything else waits until
    ``release`` is set. Counts the readyz requests it served."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.readyz = 0
        self.held = 0
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path.startswith(b"/readyz"):
                    self.readyz += 1
                else:
                    self.held += 1
                    await self.release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def leader() -> AsyncIterator[tuple[SlowLeader, str]]:
    slow = SlowLeader()
    server = await asyncio.start_server(slow.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield slow, f"http://127.0.0.1:{port}"
        slow.release.set()


async def test_a_busy_forwarding_pool_does_not_make_the_leader_unreachable(
    leader: tuple[SlowLeader, str],
) -> None:
    slow, url = leader
    forwarder = LeaderForwarder("n1")
    try:
        # more forwarded requests in flight than the forwarding pool has connections
        busy = [
            asyncio.ensure_future(forwarder._client.post(url + "/db/execute", content=b"[]"))
            for _ in range(120)
        ]
        while slow.held < 100:
            await asyncio.sleep(0.01)
        assert await forwarder.leader_problem("n0", url) is None
        slow.release.set()
        assert all(r.status_code == 200 for r in await asyncio.gather(*busy))
    finally:
        await forwarder.close()


async def test_checks_are_shared_and_reused_briefly(leader: tuple[SlowLeader, str]) -> None:
    slow, url = leader
    forwarder = LeaderForwarder("n1")
    try:
        answers = await asyncio.gather(*(forwarder.leader_problem("n0", url) for _ in range(20)))
        assert answers == [None] * 20 and slow.readyz == 1
    finally:
        await forwarder.close()


async def test_a_leader_that_is_not_listening_is_named() -> None:
    forwarder = LeaderForwarder("n1")
    try:
        problem = await forwarder.leader_problem("n0", "http://127.0.0.1:9")
        assert problem is not None
        assert problem.startswith("the leader n0 at http://127.0.0.1:9 does not answer"), problem
    finally:
        await forwarder.close()


async def test_an_idle_connection_to_the_leader_is_dropped_before_the_leader_drops_it(
    leader: tuple[SlowLeader, str],
) -> None:
    """Cluster QA: forwarder and leader both kept idle connections 5 s, so a write sent
    as the leader closed one failed ("ReadError"), and was answered 504 "the write may
    have been applied" though the leader never read it. The forwarder lets go first."""
    slow, url = leader
    slow.release.set()
    assert IDLE_PEER_CONNECTION_S < KEEP_ALIVE_S  # (the nodes' uvicorn keep-alive: server.py)
    forwarder = LeaderForwarder("n1")
    try:
        for check in (forwarder._client, forwarder._check_client):
            before = slow.connections
            assert (await check.post(url + "/db/execute", content=b"[]")).status_code == 200
            assert (await check.post(url + "/db/execute", content=b"[]")).status_code == 200
            assert slow.connections == before + 1  # kept alive while in use
            await asyncio.sleep(IDLE_PEER_CONNECTION_S + 0.5)  # idle: still < KEEP_ALIVE_S
            assert (await check.post(url + "/db/execute", content=b"[]")).status_code == 200
            assert slow.connections == before + 2  # a new one, not the idle one
    finally:
        await forwarder.close()


@pytest.mark.parametrize(
    ("method", "path", "error", "status", "says"),
    [
        # never reached the leader: safe to send again, whatever it is
        ("POST", "/db/execute", httpx.PoolTimeout("no free connection"), 503, "forwarding"),
        ("POST", "/db/execute", httpx.ConnectTimeout("timed out"), 503, "forwarding"),
        # reached it, no answer: a write may have been applied, a read changed nothing
        ("POST", "/db/execute", httpx.ReadError("reset"), 504, "may have been applied"),
        # (an error without words is named alone, not "(ReadError: )": cluster QA)
        ("POST", "/db/execute", httpx.ReadError(""), 504, "did not answer (ReadError); the"),
        ("GET", "/db/query", httpx.ReadError("reset"), 503, "a read changes nothing"),
        ("POST", "/db/query", httpx.RemoteProtocolError("closed"), 503, "try again"),
        # a read that outlived the forwarder's timeout may still run: no invitation to
        # send it again at once (review)
        ("GET", "/db/query", httpx.ReadTimeout("slow"), 504, "may still be running there"),
    ],
)
async def test_a_forwarded_request_without_an_answer_says_whether_to_retry(
    method: str, path: str, error: httpx.HTTPError, status: int, says: str
) -> None:
    """Review: a write that never left (no connection, or none free in the pool) was a 504
    "the write may have been applied"; a read that lost its connection was one too."""
    from starlette.requests import Request

    from litecdc.errors import NotLeaderError

    forwarder = LeaderForwarder("n1")

    async def fail(*args: object, **kwargs: object) -> httpx.Response:
        raise error

    forwarder._client.request = fail  # type: ignore[method-assign]

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    scope = {
        "type": "http", "method": method, "path": path, "raw_path": path.encode(),
        "query_string": b"", "headers": [(b"host", b"follower")],
    }  # fmt: skip
    request = Request(scope, receive)
    request.state.body = b"[]"
    try:
        answer = await forwarder.answer(
            request,
            NotLeaderError("not the leader", leader_id="n0", leader_address="http://127.0.0.1:9"),
        )
    finally:
        await forwarder.close()
    text = bytes(answer.body).decode()
    assert answer.status_code == status and says in text, text
    assert ("retry-after" in answer.headers) == (status == 503), answer.headers


@pytest.mark.parametrize(
    ("valid", "fix"),
    [
        (
            (-30, -1),
            "that node's certificate (--http-cert), or the CA that signed it (--node-ca-cert), "
            "has expired: renew it and restart",
        ),
        ((1, 30), "that node's certificate starts later: check its dates and both clocks"),
    ],
    ids=["expired", "not-yet-valid"],
)
async def test_a_leader_certificate_out_of_its_dates_is_named_so(
    tmp_path: Path, valid: tuple[int, int], fix: str
) -> None:
    """Authz QA: a leader serving an expired certificate, signed by the right CA, was
    said to need another --node-ca-cert ('must be the CA that signed the nodes'
    certificates'): the CA was right, the certificate was to renew."""
    ca = trustme.CA()
    now = datetime.now(UTC)
    leaf = ca.issue_cert(
        "127.0.0.1",
        not_before=now + timedelta(days=valid[0]),
        not_after=now + timedelta(days=valid[1]),
    )
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.configure_cert(context)
    slow = SlowLeader()
    server = await asyncio.start_server(slow.handle, "127.0.0.1", 0, ssl=context)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    forwarder = LeaderForwarder("n1", ca_cert=str(ca_file))
    try:
        async with server:
            problem = await forwarder.leader_problem("n0", url)
    finally:
        await forwarder.close()
    assert problem is not None and problem.startswith(
        f"the HTTPS certificate of the leader n0 at {url} cannot be verified ("
    ), problem
    assert problem.endswith(f"): {fix}"), problem


async def test_a_header_that_is_not_ascii_is_forwarded_as_it_came(
    leader: tuple[SlowLeader, str],
) -> None:
    """Review: Basic credentials holding a non-ASCII byte count as none (anonymous), and a
    follower where anonymous users may write forwarded the request — httpx refused the
    header's str, and the client got a 500. It goes as the bytes it came as (the leader
    decides on it)."""
    from starlette.requests import Request

    from litecdc.errors import NotLeaderError

    slow, url = leader
    slow.release.set()
    forwarder = LeaderForwarder("n1")

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    scope = {
        "type": "http", "method": "POST", "path": "/db/execute", "raw_path": b"/db/execute",
        "query_string": b"", "headers": [(b"host", b"follower"), (b"authorization", b"Basic \xe9")],
    }  # fmt: skip
    request = Request(scope, receive)
    request.state.body = b"[]"
    try:
        answer = await forwarder.answer(
            request, NotLeaderError("not the leader", leader_id="n0", leader_address=url)
        )
    finally:
        await forwarder.close()
    assert answer.status_code == 200 and bytes(answer.body) == b"ok", answer.body
    assert slow.held == 1
