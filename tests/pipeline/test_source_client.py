"""SourceClient against a real ``litecdc serve`` process (no Spark)."""

from __future__ import annotations

import http.server
import json
import pickle
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import trustme
from e2e.litecdc_node import Node, free_port
from fakes.http_server import serving

from litecdc.errors import NotFoundError, PositionUnavailableError, SourceError
from litecdc.pipeline.source_client import SourceClient, Splits
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, SEQ_COLUMN


def execute(node: Node, statements: list[Any]) -> Any:
    with node.client() as c:
        return node.execute(c, statements)


@pytest.fixture(scope="module")
def people(node: Node) -> str:
    """A table of 1,000 rows: id, name, score, data."""
    execute(
        node,
        [
            "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, score REAL, data BLOB)",
            *[
                ["INSERT INTO people VALUES (?, ?, ?, ?)", i, f"name-{i}", i / 7, [i % 256, 0]]
                for i in range(1, 1001)
            ],
        ],
    )
    return "people"


@pytest.fixture
def client(node: Node) -> Iterator[SourceClient]:
    with SourceClient([node.url]) as c:
        yield c


def closed_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_table_info(client: SourceClient, people: str) -> None:
    info = client.table_info(people)
    assert info.spec.name == "people"
    assert info.spec.key == ("id",)
    assert [(c.name, c.arrow) for c in info.spec.columns] == [
        ("id", "int64"),
        ("name", "string"),
        ("score", "float64"),
        ("data", "binary"),
    ]
    assert info.rows is None  # counting reads the whole table: only when asked
    assert info.last_cid >= 1
    counted = client.table_info(people, count_rows=True)
    assert counted.rows is not None and counted.rows > 0
    assert client.table_spec(people) == info.spec


def test_unknown_table_is_not_found(client: SourceClient) -> None:
    with pytest.raises(NotFoundError, match="nosuchtable"):
        client.table_info("nosuchtable")
    with pytest.raises(NotFoundError):
        client.rows("nosuchtable", limit=10)


def test_splits_cover_the_key_space_in_order(client: SourceClient, people: str) -> None:
    splits = client.splits(people, 4)
    assert 1 <= len(splits.keys) <= 3
    assert splits.cid >= 1
    firsts = [k[0] for k in splits.keys]
    assert firsts == sorted(firsts)
    ranges = splits.ranges()
    assert ranges[0][0] is None and ranges[-1][1] is None
    assert len(ranges) == len(splits.keys) + 1
    assert Splits(5, ()).ranges() == [(None, None)]


def test_rows_pages_by_last_key(client: SourceClient, people: str) -> None:
    ids: list[int] = []
    after = None
    pages = 0
    while True:
        page = client.rows(people, after_key=after, limit=300)
        pages += 1
        assert page.table.schema.names == ["id", "name", "score", "data", CID_COLUMN]
        assert set(page.table.column(CID_COLUMN).to_pylist()) == {page.cid}
        ids += page.table.column("id").to_pylist()
        if page.done:
            break
        assert page.last_key == [ids[-1]]
        after = page.last_key
    assert ids == list(range(1, 1001))
    assert pages == 4
    row = client.rows(people, after_key=[9], until_key=[10], limit=5).table.to_pylist()
    assert row == [
        {
            "id": 10,
            "name": "name-10",
            "score": 10 / 7,
            "data": bytes([10, 0]),
            CID_COLUMN: row[0][CID_COLUMN],
        }
    ]


def test_rows_until_key_bounds_the_range(client: SourceClient, people: str) -> None:
    page = client.rows(people, after_key=[100], until_key=[200], limit=1000)
    assert page.table.column("id").to_pylist() == list(range(101, 201))
    assert page.done
    assert page.last_key == [200]
    empty = client.rows(people, after_key=[5000], limit=10)
    assert empty.table.num_rows == 0 and empty.done and empty.last_key is None


def test_changes_and_position(node: Node, client: SourceClient) -> None:
    execute(node, ["CREATE TABLE moves (id INTEGER PRIMARY KEY, v TEXT)"])
    start = client.register("moves-test").cid
    execute(node, [["INSERT INTO moves VALUES (?, ?)", i, f"v{i}"] for i in range(1, 6)])
    execute(node, ["UPDATE moves SET v = 'changed' WHERE id = 2"])
    execute(node, ["DELETE FROM moves WHERE id = 3"])
    for i in range(10, 13):  # three single-row transactions
        execute(node, [["INSERT INTO moves VALUES (?, ?)", i, "x"]])

    page = client.changes("moves", after=start, limit=1000)
    events = page.table
    assert events.schema.names[:3] == [CID_COLUMN, SEQ_COLUMN, OP_COLUMN]
    rows = events.to_pylist()
    assert [(r[OP_COLUMN], r["id"]) for r in rows] == [
        *[("upsert", i) for i in range(1, 6)],
        ("upsert", 2),
        ("delete", 3),
        ("upsert", 10),
        ("upsert", 11),
        ("upsert", 12),
    ]
    assert rows[5]["v"] == "changed"
    assert rows[6]["v"] == "v3"  # a delete carries the before image
    cids = [(r[CID_COLUMN], r[SEQ_COLUMN]) for r in rows]
    assert cids == sorted(cids)
    assert page.end_cid == page.last_cid >= rows[-1][CID_COLUMN]

    # at most ~limit events, never splitting the 5-row transaction
    first = client.changes("moves", after=start, limit=2)
    assert first.table.num_rows == 5
    assert first.end_cid == rows[0][CID_COLUMN]
    second = client.changes("moves", after=first.end_cid, limit=2)
    assert second.table.column("id").to_pylist() == [2, 3]  # two one-row transactions
    bounded = client.changes("moves", after=start, until=first.end_cid, limit=1000)
    assert bounded.table.num_rows == 5 and bounded.end_cid == first.end_cid

    pos = client.position("moves", after=start, max_events=6)
    assert pos.end_cid == rows[5][CID_COLUMN]  # 5 + 1 events, whole transactions
    assert pos.events == 6
    everything = client.position("moves", after=start, max_events=1_000_000)
    assert everything.end_cid == everything.last_cid
    assert everything.events == len(rows)
    client.unsubscribe("moves-test")


def test_subscriptions(node: Node, client: SourceClient) -> None:
    execute(node, ["CREATE TABLE subs (id INTEGER PRIMARY KEY)"])
    sub = client.register("subs-a")
    listed = client.subscriptions()
    hold = listed.get("subs-a")
    # registering is a write: its cid is the snapshot version; the hold is at or before it
    assert hold is not None and hold.cid <= sub.cid and not hold.expired
    assert listed.last_cid >= sub.cid
    assert listed.retention_cids > 0
    assert listed.get("nobody") is None

    execute(node, [["INSERT INTO subs VALUES (?)", 1]])
    head = client.subscriptions().last_cid
    client.progress("subs-a", head)
    assert client.subscriptions().get("subs-a") == type(sub)("subs-a", head)

    again = client.register("subs-a")  # registering again restarts it at the head
    assert again.cid >= head

    client.unsubscribe("subs-a")
    assert client.subscriptions().get("subs-a") is None
    with pytest.raises(NotFoundError):
        client.progress("subs-a", head)
    with pytest.raises(NotFoundError):
        client.unsubscribe("subs-a")


def test_other_errors_carry_the_node_message(client: SourceClient, people: str) -> None:
    with pytest.raises(SourceError, match=r"HTTP 400") as info:
        client.splits(people, 0)
    assert not isinstance(info.value, NotFoundError)
    assert "partitions" in str(info.value)


def test_failover_to_the_next_address(node: Node, people: str) -> None:
    with SourceClient([closed_url(), node.url]) as c:
        assert c.table_spec(people).name == "people"
        assert c.urls[c._current] == node.url  # sticks to the address that answered
        assert c.register("failover").cid >= 1  # a refused connection: POSTs move on too
        c.unsubscribe("failover")
    with SourceClient(f"{closed_url()}, {node.url}") as c:
        assert c.rows(people, limit=1).table.num_rows == 1


def test_unreachable_everywhere(people: str) -> None:
    urls = [closed_url(), closed_url()]
    with (
        SourceClient(urls, timeout=2) as c,
        pytest.raises(SourceError, match=r"unreachable") as info,
    ):
        c.table_info(people)
    assert urls[0] in str(info.value) and urls[1] in str(info.value)


def test_bad_addresses_are_refused() -> None:
    with pytest.raises(SourceError, match="not an http"):
        SourceClient("127.0.0.1:4001")
    with pytest.raises(SourceError, match="no address"):
        SourceClient(" , ")


def test_pickles_without_its_connections(client: SourceClient, people: str) -> None:
    client.table_info(people)  # opens the pool
    copy = pickle.loads(pickle.dumps(client))
    assert copy._client is None
    assert copy.table_info(people).spec == client.table_info(people).spec
    secret = SourceClient("http://127.0.0.1:1", user="u", password="hunter2")
    assert "hunter2" not in repr(secret)


def test_basic_auth(tmp_path: Path, people: str) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(
        json.dumps(
            [
                {"username": "puller", "password": "s3cret", "perms": ["all"]},
                {"username": "zoë", "password": "пароль-ß", "perms": ["all"]},  # UTF-8
            ]
        )
    )
    secured = Node(tmp_path / "data", "--auth", str(auth)).start()
    try:
        with httpx.Client(base_url=secured.url, auth=("puller", "s3cret")) as c:
            secured.execute(c, ["CREATE TABLE t (id INTEGER PRIMARY KEY)"])
        with SourceClient([secured.url], user="puller", password="s3cret") as ok:
            assert ok.table_spec("t").key == ("id",)
        with SourceClient([secured.url], user="zoë", password="пароль-ß") as utf8:
            assert utf8.table_spec("t").key == ("id",)
        with (
            SourceClient([secured.url], user="puller", password="wrong") as bad,
            pytest.raises(SourceError) as refused,
        ):
            bad.table_spec("t")
        # (it asked "is this address a litecdc node?": the node answers 401 in plain text)
        assert "the node refused the credentials (401: unauthorized" in str(refused.value)
        assert "check the user and password" in str(refused.value)
        assert "is this address a litecdc node" not in str(refused.value)
    finally:
        secured.stop()


def test_https_with_a_ca_file_or_its_text(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    tls = Node(
        tmp_path / "data",
        "--http-cert",
        str(cert_file),
        "--http-key",
        str(key_file),
        https=True,
        verify=ssl.create_default_context(cafile=str(ca_file)),
    ).start()
    try:
        with tls.client() as h:
            tls.execute(h, ["CREATE TABLE t (id INTEGER PRIMARY KEY)"])
        with SourceClient([tls.url], ca_cert=str(ca_file)) as by_file:
            assert by_file.table_spec("t").key == ("id",)
        with SourceClient([tls.url], ca_pem=ca_file.read_text()) as by_text:
            assert pickle.loads(pickle.dumps(by_text)).table_spec("t").key == ("id",)
        with SourceClient([tls.url], timeout=5) as untrusted, pytest.raises(SourceError):
            untrusted.table_spec("t")
        # a certificate refused in the handshake: nothing was sent, so even a POST moves on
        with SourceClient([tls.url, tls.url], timeout=5) as untrusted:
            with pytest.raises(SourceError, match="unreachable") as info:
                untrusted.register("never-sent")
            assert "may have been applied" not in str(info.value)
    finally:
        tls.stop()


def test_pruned_position_and_expired_subscription(tmp_path: Path) -> None:
    """A node keeping 3 commits: an older position and a subscriber left behind get 410."""
    small = Node(tmp_path / "data", "--retention-cids", "3").start()
    try:
        with SourceClient([small.url]) as c:
            with httpx.Client(base_url=small.url) as h:
                small.execute(h, ["CREATE TABLE p (id INTEGER PRIMARY KEY)"])
                c.register("slow")
                for i in range(20):
                    small.execute(h, [["INSERT INTO p VALUES (?)", i]])
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:  # the node enforces the cap every few seconds
                listed = c.subscriptions()
                slow = listed.get("slow")
                assert slow is not None
                if slow.expired:
                    break
                time.sleep(0.2)
            assert slow.expired and listed.pruned_cid > slow.cid
            with pytest.raises(PositionUnavailableError, match="no longer available"):
                c.changes("p", after=1, limit=100)
            with pytest.raises(PositionUnavailableError):
                c.position("p", after=1, max_events=10)
            with pytest.raises(PositionUnavailableError):
                c.progress("slow", listed.last_cid)
    finally:
        small.stop()


class _StandIn(http.server.BaseHTTPRequestHandler):
    """The handler of an HTTP server standing in for a node: ``_handle`` answers every
    method with ``reply``; it logs nothing."""

    def _handle(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_DELETE = do_GET

    def reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _DropFirst(_StandIn):
    """Drops the connection of the first request without an answer (as a node closing a
    kept-alive connection just as it is reused), answers the others with JSON."""

    requests: ClassVar[list[str]] = []

    def _handle(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        if len(type(self).requests) == 1:
            self.close_connection = True
            return
        self.reply(200, b'{"name": "s", "cid": 7}', {"Content-Type": "application/json"})


@pytest.fixture
def drop_first() -> Iterator[str]:
    _DropFirst.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DropFirst)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_idempotent_request_is_sent_again_after_a_dropped_connection(drop_first: str) -> None:
    with SourceClient([drop_first]) as c:
        assert c.register("s").cid == 7  # idempotent POST: a second go at the same address
    assert _DropFirst.requests == ["POST /cdc/subscriptions", "POST /cdc/subscriptions"]


def test_a_request_that_may_have_been_applied_is_not_sent_again(drop_first: str) -> None:
    with (
        SourceClient([drop_first]) as c,
        pytest.raises(SourceError, match="may have been applied"),
    ):
        c.unsubscribe("s")
    assert _DropFirst.requests == ["DELETE /cdc/subscriptions/s"]


class _NotLitecdc(_StandIn):
    """Some other web server: an HTML 404 page, or an empty one."""

    def _handle(self) -> None:
        body = b"" if "empty" in self.path else b"<html><body><h1>Not here</h1></body></html>"
        self.reply(404, body, {"Content-Type": "text/html"})


def test_an_address_that_is_not_a_litecdc_node_is_said_so() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotLitecdc)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with SourceClient([f"http://127.0.0.1:{server.server_address[1]}"]) as c:
            for table, shown in (("t", "<html><body><h1>Not here"), ("empty", "an empty answer")):
                with pytest.raises(NotFoundError) as info:
                    c.table_info(table)
                message = str(info.value)
                assert shown in message and "is this address a litecdc node" in message
                assert "text/html" in message
    finally:
        server.shutdown()
        server.server_close()


class _CannotServe(_StandIn):
    """Answers 503 as a litecdc cluster node that cannot serve now does: a follower that
    knows no leader to forward to (plain text, rqlite's form) or one out of touch with its
    cluster (JSON). Stands in for such a node: a real one takes a three-member etcd and a
    SIGSTOP (tests/system/test_cluster_source.py has a lagging one)."""

    requests: ClassVar[list[str]] = []

    def _handle(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        if "/tables/" in self.path:
            body, kind = (
                b'{"error": "this node cannot serve the pull source now: it knows no leader"}',
                "application/json",
            )
        else:
            body = b"not leader: node n3 is not the leader: it knows no leader right now\n"
            kind = "text/plain; charset=utf-8"
        self.reply(503, body, {"Content-Type": kind, "X-RQLITE-VERSION": "litecdc/0.1.0"})


def test_a_node_that_cannot_serve_now_is_passed_over(node: Node, people: str) -> None:
    """Pipeline QA: only a refused connection moved a request on; a node that answered
    503 (cut off from etcd, no leader known) was asked again and again while the next
    listed node was fine — and its plain-text answer was called not a litecdc node's."""
    _CannotServe.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CannotServe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stuck = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with SourceClient([stuck, node.url]) as c:
            assert c.table_spec(people).name == "people"  # a GET moves on
            assert c.urls[c._current] == node.url
            c._current = 0
            assert c.register("passed-over").cid >= 1  # an idempotent POST too
            c._current = 0
            with pytest.raises(SourceError, match=r"it knows no leader right now"):
                c.unsubscribe("passed-over")  # not one that may have been applied
        with SourceClient([node.url]) as c:
            c.unsubscribe("passed-over")
        with SourceClient([stuck]) as c:
            with pytest.raises(SourceError) as info:
                c.subscriptions()
            assert str(info.value) == (
                f"source {stuck}: GET /cdc/subscriptions: not leader: node n3 is not the "
                "leader: it knows no leader right now (HTTP 503)"
            )
            with pytest.raises(SourceError, match=r"cannot serve the pull source now.*HTTP 503"):
                c.table_info(people)
        with SourceClient([stuck, stuck + "/"]) as c:  # review: each one's reason is named
            with pytest.raises(SourceError) as info:
                c.table_info(people)
            assert str(info.value).count("cannot serve the pull source now") == 2
    finally:
        server.shutdown()
        server.server_close()
    assert "GET /cdc/tables/people" in _CannotServe.requests


class _OlderNode(_StandIn):
    """A node from before min_cid (2026-11-27): it refused every query parameter it did
    not know, 400. Stands in for one: the request is forwarded to the real node, after
    that check (an older version of litecdc is not installable here)."""

    target: ClassVar[str] = ""
    refused: ClassVar[int] = 0

    def _handle(self) -> None:
        path, _, query = self.path.partition("?")
        names = sorted({part.split("=")[0] for part in query.split("&") if part})
        if path.startswith("/cdc/tables/") and "min_cid" in names:
            self.refuse(f"unknown query parameter(s) min_cid for {path}; allowed: after, limit")
        else:
            self.forward(self.body())

    def body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def refuse(self, error: str) -> None:
        """Answer 400 with ``error``, as the node of its time did."""
        type(self).refused += 1
        self.reply(400, json.dumps({"error": error}).encode(), {"Content-Type": "application/json"})

    def forward(self, body: bytes) -> None:
        """Answer as the real node does."""
        answer = httpx.request(
            self.command, type(self).target + self.path, content=body or None,
            headers={"Content-Type": self.headers.get("Content-Type", "")},
        )  # fmt: skip
        framing = ("content-length", "transfer-encoding", "connection", "content-encoding")
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in framing}
        self.reply(answer.status_code, answer.content, headers)


def test_a_node_older_than_min_cid_is_read_without_it(
    node: Node, people: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgrade QA: a pipeline upgraded before its nodes sent min_cid, which they refused
    (400 "unknown query parameter(s) min_cid"): every subscription failed until the nodes
    were upgraded. Such a node is read as the pipelines of its time read it, with a
    warning; what min_cid guards on a page is still checked by the client."""
    _OlderNode.target, _OlderNode.refused = node.url, 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OlderNode)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    older = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with SourceClient([older]) as c:
            head = c.table_info(people, min_cid=1).last_cid
            assert "older than this pipeline (it takes no min_cid)" in caplog.text
            assert c.rows(people, limit=5, min_cid=head).table.num_rows == 5
            assert c.position(people, after=head, max_events=1, min_cid=head).last_cid >= head
            assert _OlderNode.refused == 1  # once: the node is then asked without it
            with pytest.raises(SourceError, match=r"was read at cid \d+, before cid"):
                c.rows(people, limit=5, min_cid=head + 100)
        # known to the process, not the client: Spark's tasks make clients of their own
        with SourceClient([older]) as c:
            assert c.table_info(people, min_cid=1).last_cid == head
        assert _OlderNode.refused == 1
        assert caplog.text.count("older than this pipeline") == 1
    finally:
        server.shutdown()
        server.server_close()


class _NodeWithoutHoldAtCid(_OlderNode):
    """A node from before holds could be placed at a cid (2026-11-28): it refused a
    ``cid`` in the registration's body, 400; everything else is forwarded, as _OlderNode."""

    def _handle(self) -> None:
        body = self.body()
        if self.path == "/cdc/subscriptions" and "cid" in json.loads(body or b"{}"):
            self.refuse(
                "unknown field(s) cid in the body of POST /cdc/subscriptions; allowed: name"
            )
        else:
            self.forward(body)


def test_a_node_that_cannot_place_a_hold_at_a_cid_registers_at_its_head(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """Register QA: a stream's starting_cid with a subscription failed against a node
    from before (400 "unknown field(s) cid"); it registers there as it did then, with a
    warning."""
    _NodeWithoutHoldAtCid.target, _NodeWithoutHoldAtCid.refused = node.url, 0
    with serving(_NodeWithoutHoldAtCid) as older, SourceClient([older]) as c:
        head = c.subscriptions().last_cid
        registered = c.register("older-node-stream", 1)
        assert _NodeWithoutHoldAtCid.refused == 1
        assert registered.cid > head  # at the head, as before
        assert "cannot place a hold at cid 1 (an older version)" in caplog.text
        c.unsubscribe("older-node-stream")


class _Slow(_OlderNode):
    """Forwards to the real node, as _OlderNode, after ``delay`` seconds: a node busy
    building a very large answer (or hung, for a request that asks less of it)."""

    delay: ClassVar[float] = 0.0

    def _handle(self) -> None:
        time.sleep(type(self).delay)
        super()._handle()


def test_a_data_read_waits_longer_than_a_request_and_a_slow_node_is_not_called_unreachable(
    node: Node,
) -> None:
    """Scale QA: a batch holding one 1.5M-row transaction took the node over 60 s to
    answer with three subscriptions reading it at once; every read timed out ("source …:
    unreachable"), was sent again, and the batch was never applied."""
    with node.client() as h:
        node.execute(h, ["CREATE TABLE slow_t(id INTEGER PRIMARY KEY)"])
        node.execute(h, ["INSERT INTO slow_t VALUES(1)", "INSERT INTO slow_t VALUES(2)"])
    with SourceClient([node.url]) as direct:
        pruned = direct.subscriptions().pruned_cid  # (the module's node prunes its log)
    _Slow.target, _Slow.refused, _Slow.delay = node.url, 0, 1.5
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with SourceClient([slow], timeout=0.5) as c:
            assert c.changes("slow_t", after=pruned, limit=10).table.num_rows == 2
            assert c.rows("slow_t", limit=5).table.num_rows == 2
            with pytest.raises(SourceError) as late:
                c.table_info("slow_t")
        assert f"source {slow}: no answer within 0.5 s" in str(late.value)
        assert "overloaded or hung" in str(late.value)
        assert "unreachable" not in str(late.value)
    finally:
        time.sleep(_Slow.delay)  # (the request given up on is still being answered)
        server.shutdown()
        server.server_close()
