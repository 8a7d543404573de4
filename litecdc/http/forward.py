"""Writes that reach a follower go to the leader, as the client sent them.

rqlite's behaviour: a follower forwards the request to the leader and relays the answer;
with the ``redirect`` URL parameter it answers 301 with the leader's URL instead. The
forwarded request keeps the client's ``Authorization`` header (the leader checks it
again) and is marked so it is never forwarded twice. HTTPS leaders are verified with
the CA given by ``--node-ca-cert`` (default: the system's CAs).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Awaitable
from urllib.parse import parse_qsl, quote, urlencode

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from litecdc.errors import NotLeaderError

#: set on a forwarded request: a node that receives it and does not lead refuses it
FORWARDED_HEADER = "x-litecdc-forwarded-by"
_KEPT_HEADERS = ("authorization", "content-type", "accept")
_RELAYED_HEADERS = ("content-type", "location", "www-authenticate", "retry-after")


#: seconds readyz waits for the leader (and /nodes for each member) to answer: the
#: leader's lease time, after which a leader that does not answer has been replaced anyway
PEER_CHECK_TIMEOUT = 2.0
#: seconds a leader check's answer is reused: readyz probes cost the leader one request
#: per second per follower at most
LEADER_CHECK_REUSE = 1.0
#: seconds a node keeps an idle keep-alive connection open (uvicorn's default, made
#: explicit: server.py) ...
KEEP_ALIVE_S = 5
#: ... and seconds a forwarder keeps its idle connection to the leader: well under that,
#: so a forwarded write never goes out on a connection the leader is closing (with 5 s on
#: both sides, a write sent as the leader closed the idle connection was answered 504
#: "the write may have been applied" though the leader never read it: cluster QA)
IDLE_PEER_CONNECTION_S = KEEP_ALIVE_S / 2
#: errors of a forwarded request that never reached the leader (safe to retry)
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH
_HOSTNAME_MISMATCH = 62
#: OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID, X509_V_ERR_CERT_HAS_EXPIRED
_CERT_NOT_YET_VALID, _CERT_HAS_EXPIRED = 9, 10


class LeaderForwarder:
    def __init__(self, node_id: str, *, ca_cert: str | None = None, timeout: float = 30.0) -> None:
        self._node_id = node_id
        self._ca_cert = ca_cert
        self._timeout = timeout
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_cert) if ca_cert else True
        )
        self._client = httpx.AsyncClient(
            verify=verify,
            timeout=timeout,
            limits=httpx.Limits(  # httpx's default pool, connections kept for less
                max_connections=100,
                max_keepalive_connections=20,
                keepalive_expiry=IDLE_PEER_CONNECTION_S,
            ),
        )
        # readyz's and /nodes' checks have a client of their own: in the forwarding pool
        # they would wait behind busy forwarded requests and call a healthy peer unreachable
        self._check_client = httpx.AsyncClient(
            verify=verify,
            timeout=PEER_CHECK_TIMEOUT,
            limits=httpx.Limits(
                max_connections=8,
                max_keepalive_connections=8,
                keepalive_expiry=IDLE_PEER_CONNECTION_S,
            ),
        )
        self._check_lock = asyncio.Lock()
        #: (leader address, monotonic time, problem) of the last check
        self._last_check: tuple[str, float, str | None] | None = None

    async def answer(self, request: Request, error: NotLeaderError) -> Response:
        """Forward ``request`` to the leader (or redirect to it); 503 when none is known."""
        leader = error.leader_address
        if not leader or request.headers.get(FORWARDED_HEADER):
            message = str(error)
            if leader:
                message += "; the request was forwarded once"
            elif "no leader" not in message and "holds the leader key" not in message:
                message += "; no leader is known"
            if "try again" not in message:
                message += ", try again shortly"
            return Response(
                f"not leader: {message}\n",
                status_code=503,
                media_type="text/plain; charset=utf-8",
                headers={"Retry-After": "1"},
            )
        # the path as the client sent it: the decoded one would lose a %2F (and turn %20
        # into a space the leader's URL parsing must guess at)
        raw_path = request.scope.get("raw_path")
        path = raw_path.decode("latin-1") if raw_path else quote(request.url.path)
        target = leader.rstrip("/") + path
        if request.url.query:
            target += "?" + request.url.query
        if "redirect" in request.query_params:
            return RedirectResponse(target, status_code=301)
        # (a header that is not ASCII — Basic credentials this node took as none — goes
        # as the bytes it came as: httpx refuses such a str, and the request was a 500)
        headers = {
            k.encode(): v.encode("latin-1")
            for k in _KEPT_HEADERS
            if (v := request.headers.get(k)) is not None
        }
        headers[FORWARDED_HEADER.encode()] = self._node_id.encode()
        body = getattr(request.state, "body", None)  # the handler read it already
        if body is None:
            # a handler that refuses before reading takes no body (a GET): none is sent —
            # reading it here would skip the body limits (review QA: 200 MB read whole)
            body = b""
        method = request.method
        try:
            httpx.URL(target)
        except httpx.InvalidURL:
            # httpx makes no URL with a part over 64 KiB, which this node took (a pyrqlite
            # SELECT with a long IN list: review QA, a 500): a GET /db/query's SQL goes to
            # the leader as the body of a POST, which it answers alike
            moved = _query_in_body(request, leader)
            if moved is None:
                return Response(
                    "URI too long to forward to the leader (httpx's limit: 64 KiB a part); "
                    "send it to the leader, or the SQL in a POST body\n",
                    status_code=414,
                    media_type="text/plain; charset=utf-8",
                )
            method, target, body = moved
            headers[b"content-type"] = b"application/json"
        outcome = await self._unless_client_leaves(
            request, self._client.request(method, target, content=body, headers=headers)
        )
        if outcome is None:
            # the client left: dropping the forwarded request lets the leader stop its read
            # (it kept running there until this client's 30 s timeout: review QA)
            return Response(status_code=499)
        if isinstance(outcome, httpx.HTTPError):
            exc = outcome
            # no connection, or none free in the pool: the leader never saw the request
            never_sent = isinstance(exc, _NEVER_SENT)
            if not never_sent and _is_read(request):
                if isinstance(exc, httpx.TimeoutException):
                    # still running there: asking again at once would run it twice
                    return Response(
                        f"forwarded to the leader at {leader}, which did not answer within "
                        f"{self._timeout:g} s; a read changes nothing, but it may still be "
                        "running there\n",
                        status_code=504,
                        media_type="text/plain; charset=utf-8",
                    )
                # (the connection dropped): nothing to apply twice, the client may ask again
                return Response(
                    f"forwarded to the leader at {leader}, which did not answer "
                    f"({_named(exc)}); a read changes nothing: try again\n",
                    status_code=503,
                    media_type="text/plain; charset=utf-8",
                    headers={"Retry-After": "1"},
                )
            if not never_sent:
                # the leader may have received it: a retry could apply the write twice
                return Response(
                    f"forwarded to the leader at {leader}, which did not answer "
                    f"({_named(exc)}); the write may have been applied: "
                    "check before retrying\n",
                    status_code=504,
                    media_type="text/plain; charset=utf-8",
                )
            problem = self._problem(error.leader_id, leader, exc)
            return Response(
                f"not leader, and forwarding to the leader failed: {problem}\n",
                status_code=503,
                media_type="text/plain; charset=utf-8",
                headers={"Retry-After": "1"},
            )
        answer = outcome
        relayed = {k: v for k in _RELAYED_HEADERS if (v := answer.headers.get(k)) is not None}
        return Response(answer.content, status_code=answer.status_code, headers=relayed)

    @staticmethod
    async def _unless_client_leaves(
        request: Request, forwarding: Awaitable[httpx.Response]
    ) -> httpx.Response | httpx.HTTPError | None:
        """The leader's answer (or the error reaching it); None when the client
        disconnected first, which cancels the forwarded request."""
        outcome: httpx.Response | httpx.HTTPError | None = None
        async with anyio.create_task_group() as group:

            async def watch_client() -> None:
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch_client)
            try:
                outcome = await forwarding
            except httpx.HTTPError as exc:  # (returned: a task group would wrap it)
                outcome = exc
            group.cancel_scope.cancel()
        return outcome

    async def leader_problem(self, leader_id: str, address: str) -> str | None:
        """Why writes cannot be forwarded to the leader at ``address`` (it does not answer,
        its certificate cannot be verified…), or None. Any answer (a 401 too) shows the
        address works and the certificate is trusted. Concurrent callers share one check,
        and an answer is reused for LEADER_CHECK_REUSE seconds."""
        async with self._check_lock:
            last = self._last_check
            now = time.monotonic()
            if last is not None and last[0] == address and now - last[1] < LEADER_CHECK_REUSE:
                return last[2]
            problem = await self.peer_problem(leader_id, address, role="the leader")
            self._last_check = (address, time.monotonic(), problem)
            return problem

    async def peer_problem(self, node_id: str, address: str, *, role: str = "node") -> str | None:
        """Why node ``node_id`` at ``address`` cannot be reached as this node reaches its
        peers (no answer within PEER_CHECK_TIMEOUT, a certificate it cannot verify…), or
        None. Any answer of its ``/readyz?noleader`` (a 401 too) will do."""
        try:
            await self._check_client.get(address.rstrip("/") + "/readyz?noleader")
        except httpx.HTTPError as exc:
            return self._problem(node_id, address, exc, role=role)
        return None

    def _problem(
        self, node_id: str | None, address: str, exc: httpx.HTTPError, *, role: str = "the leader"
    ) -> str:
        """What went wrong reaching a peer (``role``: "the leader", "node"); a certificate
        that cannot be verified says which option fixes it."""
        who = f"{role} {node_id} at {address}" if node_id else f"{role} at {address}"
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            return f"{who} does not answer ({_named(exc)})"
        if cause.verify_code == _HOSTNAME_MISMATCH:
            fix = "its certificate must name the host of the node's --advertise-url"
        elif cause.verify_code == _CERT_HAS_EXPIRED:
            # (authz QA: "--node-ca-cert … must be the CA that signed …", the CA being right;
            # OpenSSL says so of any certificate of the chain, the CA's too — review)
            fix = (
                "that node's certificate (--http-cert), or the CA that signed it "
                "(--node-ca-cert), has expired: renew it and restart"
            )
        elif cause.verify_code == _CERT_NOT_YET_VALID:
            fix = "that node's certificate starts later: check its dates and both clocks"
        elif self._ca_cert is None:
            fix = "pass --node-ca-cert with the CA that signed the nodes' certificates"
        else:
            fix = (
                f"--node-ca-cert {self._ca_cert} must be the CA that signed the nodes' certificates"
            )
        return (
            f"the HTTPS certificate of {who} cannot be verified "
            f"({cause.verify_message or cause}): {fix}"
        )

    async def close(self) -> None:
        await self._client.aclose()
        await self._check_client.aclose()


def _query_in_body(request: Request, leader: str) -> tuple[str, str, bytes] | None:
    """A ``GET /db/query?q=SQL`` as the equivalent POST of ``["SQL"]`` to ``leader``, its
    other parameters kept: (method, URL, body); None for any other request."""
    sql = request.query_params.get("q")
    if request.method != "GET" or not request.url.path.startswith("/db/query") or sql is None:
        return None
    rest = [(k, v) for k, v in parse_qsl(request.url.query, keep_blank_values=True) if k != "q"]
    raw_path = request.scope.get("raw_path")
    path = raw_path.decode("latin-1") if raw_path else quote(request.url.path)
    target = leader.rstrip("/") + path + (f"?{urlencode(rest)}" if rest else "")
    try:
        httpx.URL(target)
    except httpx.InvalidURL:
        return None
    return "POST", target, json.dumps([sql]).encode()


def _is_read(request: Request) -> bool:
    """Whether a forwarded request only reads (a query, or any GET: a backup), so that
    asking again is always safe; a /db/request may write, and is counted as a write."""
    return request.method == "GET" or request.url.path.startswith("/db/query")


def _named(exc: Exception) -> str:
    """The exception's type and its words, when it has any (httpx's ReadError may not:
    a message read "(ReadError: )" — cluster QA)."""
    words = str(exc).strip()
    return f"{exc.__class__.__name__}: {words}" if words else exc.__class__.__name__
