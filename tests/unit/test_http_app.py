"""The Starlette app in-process, on a real Store: error mapping and the handler path."""

from __future__ import annotations

import gzip
import logging
import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from starlette.testclient import TestClient

from litecdc.config import NodeConfig
from litecdc.db import source
from litecdc.db.datafile import SQLITE_HEADER
from litecdc.errors import ConfigError, ModeError
from litecdc.http import app as app_module
from litecdc.http import create_app
from litecdc.http.app import VERSION
from litecdc.results import Statement as S
from litecdc.store import Store


@pytest.fixture
def http(store: Store) -> Iterator[TestClient]:
    with TestClient(create_app(store, store.config), raise_server_exceptions=False) as c:
        yield c


def test_execute_then_query(http: TestClient) -> None:
    r = http.post(
        "/db/execute", json=["CREATE TABLE t (a INTEGER)", ["INSERT INTO t VALUES(?)", 5]]
    )
    assert r.json() == {"results": [{}, {"last_insert_id": 1, "rows_affected": 1}]}
    r = http.get("/db/query", params={"q": "SELECT a FROM t"})
    assert r.json() == {"results": [{"columns": ["a"], "types": ["integer"], "values": [[5]]}]}


def test_store_errors_map_to_their_status(
    http: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise ModeError("plain writes are not allowed in FOLLOWER mode")

    monkeypatch.setattr(store, "execute", refuse)
    r = http.post("/db/execute", json=["CREATE TABLE u (a)"])
    assert (r.status_code, r.text) == (409, "plain writes are not allowed in FOLLOWER mode\n")
    monkeypatch.setattr(store, "changes_page", refuse)
    r = http.get("/cdc/changes")
    assert (r.status_code, r.json()) == (
        409,
        {"error": "plain writes are not allowed in FOLLOWER mode"},
    )


def test_changes_pruned_past_the_asked_cid_are_410_not_an_empty_page(tmp_path: Path) -> None:
    """Before, /cdc/changes?after=0 on a node whose change log was pruned (the CDC service
    delivered it, subscribers read it, or the retention cap) answered what was left, or
    an empty page, as if that were every change there was."""
    store = Store(NodeConfig(data_dir=tmp_path / "node", retention_cids=3))
    try:
        with TestClient(create_app(store, store.config)) as http:
            http.post("/db/execute", json=["CREATE TABLE p (a)"])
            for i in range(6):
                http.post("/db/execute", json=[f"INSERT INTO p VALUES({i})"])
            assert len(http.get("/cdc/changes", params={"limit": 100}).json()["changes"]) == 6
            store.prune_changes()
            pruned = store.subscribers().pruned_cid
            assert pruned > 3
            for after in (0, pruned - 1):
                r = http.get("/cdc/changes", params={"after": after, "limit": 100})
                assert r.status_code == 410, r.text
                assert r.json()["error"] == (
                    f"changes after cid {after} are no longer available: the change log was "
                    f"pruned through cid {pruned} (changes the CDC service delivered, or every "
                    "pull subscriber has read, or beyond --retention-cids); read on from "
                    f"after={pruned}"
                )
            r = http.get("/cdc/changes", params={"after": pruned, "limit": 100})
            assert r.status_code == 200
            kept = [c["after"]["a"] for c in r.json()["changes"]]
            assert kept and kept == list(range(6))[-len(kept) :]
    finally:
        store.close()


def test_unexpected_errors_are_500_with_the_reason_logged_once(
    store: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "status", broken)
    # a client that raises what the app raises on: the error must end with the 500 (it
    # went on to uvicorn, which logged its traceback a second time)
    with TestClient(create_app(store, store.config)) as http, caplog.at_level(logging.ERROR):
        r = http.get("/status")
    assert (r.status_code, r.text) == (500, "internal error: RuntimeError: disk on fire\n")
    logged = [rec for rec in caplog.records if rec.exc_info]
    assert [rec.getMessage() for rec in logged] == ["GET /status failed"]


def test_bad_auth_file_fails_app_creation(store: Store, tmp_path: object) -> None:
    from pathlib import Path

    from litecdc.errors import ConfigError

    bad = Path(str(tmp_path)) / "auth.json"
    bad.write_text("[{}]")
    config = NodeConfig(data_dir=store.config.data_dir, auth_file=bad)
    with pytest.raises(ConfigError, match="needs a non-empty string username"):
        create_app(store, config)


def _last_cid(http: TestClient) -> int:
    return int(http.get("/status").json()["store"]["last_cid"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[\"INSERT INTO foo(name) VALUES('\xff')\"]", "the body is not UTF-8 text"),
        (b"[" * 100_000 + b"]" * 100_000, "arrays or objects are nested too deeply"),
        (b"[\"INSERT INTO foo(name) VALUES('\\ud800')\"]", "a string holds an unpaired surrogate"),
    ],
)
def test_json_bodies_that_do_not_decode_are_400_on_every_json_endpoint(
    http: TestClient, body: bytes, message: str
) -> None:
    """Not UTF-8, nested past the decoder's recursion limit, a lone surrogate: 400 with
    the reason (was 500 UnicodeDecodeError / RecursionError / "Input data was truncated")."""
    http.post("/db/execute", json=["CREATE TABLE IF NOT EXISTS foo (name TEXT)"])
    before = _last_cid(http)
    headers = {"Content-Type": "application/json"}
    for path in ("/db/execute", "/db/query", "/db/request"):
        r = http.post(path, content=body, headers=headers)
        assert r.status_code == 400, (path, r.text)
        assert r.text.startswith(f"invalid JSON body: {message}"), (path, r.text)
    doc = body.replace(b'["INSERT', b'{"name": ["INSERT').replace(b')"]', b')"]}')
    for path in ("/cdc/subscriptions", "/cdc/subscriptions/s1/progress"):
        r = http.post(path, content=doc, headers=headers)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["error"].startswith(f"request body is not valid JSON: {message}")
    assert _last_cid(http) == before


def test_changes_page_inside_a_transaction_resumes_with_next(http: TestClient) -> None:
    """A transaction with more changes than ``limit``: each full page says where to resume
    (after=cid&after_seq=seq); following ``next`` sees every change exactly once."""
    http.post("/db/execute", json=["CREATE TABLE m (a INTEGER)"])
    http.post("/db/execute", json=["INSERT INTO m VALUES(1),(2),(3),(4),(5),(6),(7)"])
    http.post("/db/execute", json=["INSERT INTO m VALUES(8)", "INSERT INTO m VALUES(9)"])
    params: dict[str, int] = {"limit": 3}
    seen: list[tuple[int, int]] = []
    pages = 0
    while True:
        doc = http.get("/cdc/changes", params=params).json()
        pages += 1
        seen += [(c["cid"], c["seq"]) for c in doc["changes"]]
        if "next" not in doc:
            assert len(doc["changes"]) < 3
            break
        last = doc["changes"][-1]
        assert doc["next"] == {"after": last["cid"], "after_seq": last["seq"]}
        params = {"limit": 3, **doc["next"]}
    values = [
        c["after"]["a"] for c in http.get("/cdc/changes", params={"limit": 100}).json()["changes"]
    ]
    assert values == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert len(seen) == len(set(seen)) == 9
    assert seen == sorted(seen)
    assert pages == 4  # 3 + 3 + 3 + an empty last page (the third was full)
    # the old way, after=cid of the last change, skips the rest of that transaction
    first = http.get("/cdc/changes", params={"limit": 3}).json()
    assert first["next"]["after_seq"] == 3
    skipped = http.get("/cdc/changes", params={"after": first["next"]["after"], "limit": 3})
    assert skipped.json()["changes"][0]["after"]["a"] == 8


def test_pages_end_at_their_size_bound_and_next_reads_on(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page is held in memory while the node answers it, and limit=10000 of big rows
    or bulk writes' entries was gigabytes: /cdc/changes and /journal pages end once past
    PAGE_BYTES (after their first item, however big), with ``next`` to read on from."""
    from litecdc import store as store_module

    monkeypatch.setattr(store_module, "PAGE_BYTES", 5000)
    http.post("/db/execute", json=["CREATE TABLE big (id INTEGER PRIMARY KEY, v TEXT)"])
    sizes = [1500, 1500, 1500, 1500, 9000, 100, 100]
    http.post(
        "/db/execute",
        json=[["INSERT INTO big VALUES(?, ?)", i, "x" * n] for i, n in enumerate(sizes)],
        params={"transaction": ""},
    )
    for n in (2000, 2000, 2000):
        http.post("/db/execute", json=[["INSERT INTO big(v) VALUES(?)", "y" * n]])
    params: dict[str, int] = {"limit": 1000}
    pages: list[list[int]] = []
    while True:
        doc = http.get("/cdc/changes", params=params).json()
        if doc["changes"]:
            pages.append([len(c["after"]["v"]) for c in doc["changes"] if c["table"] == "big"])
        if "next" not in doc:
            break
        last = doc["changes"][-1]
        assert doc["next"] == {"after": last["cid"], "after_seq": last["seq"]}
        params = {"limit": 1000, **doc["next"]}
    assert [n for page in pages for n in page] == [*sizes, 2000, 2000, 2000]
    assert pages == [[1500, 1500, 1500], [1500], [9000], [100, 100, 2000, 2000], [2000]]

    journal_pages: list[list[int]] = []
    after = 0
    while True:
        doc = http.get("/journal", params={"after": after, "limit": 1000}).json()
        journal_pages.append([len(e["query"] or "") for e in doc["entries"]])
        if "next" not in doc:
            break
        assert doc["next"] == {"after": doc["entries"][-1]["cid"]}
        after = doc["next"]["after"]
    # the initial record and the CREATE; the bulk write's entry (its SQL text alone over
    # the bound) as a page of its own; two of the 2000-character inserts, then the third
    assert [len(page) for page in journal_pages] == [2, 1, 2, 1], journal_pages
    assert journal_pages[1][0] > 15_000 and max(journal_pages[2] + journal_pages[3]) < 2100


def test_load_of_failing_sql_text_is_an_sql_error_and_changes_nothing(http: TestClient) -> None:
    """As rqlite: SQL text that fails is ``{"results": [{"error": ...}]}`` with HTTP 200,
    and the load is all or nothing."""
    http.post("/db/execute", json=["CREATE TABLE keep (x)", "INSERT INTO keep VALUES(1)"])
    before = _last_cid(http)
    changes = http.get("/cdc/changes", params={"limit": 100}).json()["changes"]
    for content_type in ("text/plain", "application/octet-stream"):
        r = http.post(
            "/db/load",
            content=b"CREATE TABLE a(x); INSERT INTO nosuch VALUES(2);",
            headers={"Content-Type": content_type},
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        (result,) = r.json()["results"]
        assert set(result) == {"error"} and "no such table: nosuch" in result["error"]
    r = http.post("/db/load", content=b"SELEC 1")
    assert r.status_code == 200 and "syntax error" in r.json()["results"][0]["error"]
    r = http.post("/db/load", content=b"CREATE TABLE b(x); INSERT INTO b VALUES('\xff')")
    assert r.status_code == 400
    assert r.text.startswith("load: the body is neither a SQLite database file nor UTF-8 SQL")
    # a NUL before a ';' (fuzz QA: a 500 from splitting the text)
    r = http.post("/db/load", content=b"INSERT INTO keep VALUES(2); \0 DELETE FROM keep;")
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["error"] == "load: the SQL text failed: null character in query"
    assert _last_cid(http) == before
    assert http.get("/cdc/changes", params={"limit": 100}).json()["changes"] == changes
    r = http.get("/db/query", params={"q": "SELECT x FROM keep"})
    assert r.json()["results"][0]["values"] == [[1]]
    r = http.get("/db/query", params={"q": "SELECT * FROM a"})
    assert r.json()["results"][0]["error"] == "no such table: a"


class _StuckFollower:
    """Stands in for a cluster node (a real one needs etcd and peers, see tests/system):
    a follower whose log was compacted past it and that could not install a snapshot."""

    def is_leader(self) -> bool:
        return False

    def leader(self) -> tuple[str, str] | None:
        return ("n1", "http://127.0.0.1:4001")

    def status(self) -> dict[str, object]:
        return {"needs_snapshot": True, "last_error": "snapshot from n1: HTTP 401"}

    def members(self) -> list[object]:
        return []


def test_readyz_is_503_while_a_follower_needs_a_snapshot(store: Store) -> None:
    app = create_app(store, store.config, cluster=_StuckFollower())  # type: ignore[arg-type]
    with TestClient(app) as c:
        r = c.get("/readyz")
        assert (r.status_code, r.text) == (503, "[+]node ok\n[+]leader ok\n[-]store not ok")
        assert c.get("/readyz?noleader").status_code == 200


class _DeposedLeader(_StuckFollower):
    """A node the leader key still names after it stopped leading (its lease lost while
    etcd was out of reach, the key not yet gone), or while it takes over."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def leader(self) -> tuple[str, str] | None:
        return (self.node_id, "http://127.0.0.1:4001")

    def status(self) -> dict[str, object]:
        return {}


def test_readyz_is_503_on_a_node_named_leader_that_does_not_lead(store: Store) -> None:
    """Cluster QA: it answered "[+]leader ok" while it refused every write as not the
    leader (about 3.5 s after etcd came back from an outage)."""
    cluster = _DeposedLeader(store.config.node_id)
    app = create_app(store, store.config, cluster=cluster)  # type: ignore[arg-type]
    with TestClient(app) as c:
        r = c.get("/readyz")
        assert r.status_code == 503, r.text
        assert r.text.startswith(
            "[+]node ok\n[-]leader not ok: the leader key names this node, which does not lead"
        ), r.text
        assert r.text.endswith("\n[+]store ok"), r.text


def test_remove_on_a_standalone_node_is_a_clear_400(http: TestClient) -> None:
    """rqlite's ``DELETE /remove`` forgets a cluster member; a standalone node has none."""
    r = http.request("DELETE", "/remove", json={"id": "n2"})
    assert (r.status_code, r.text) == (
        400,
        "this node is standalone: it has no cluster members to remove\n",
    )
    r = http.request("DELETE", "/remove", json={"id": ["n2"]})
    assert r.status_code == 400
    assert r.text.startswith('the body of DELETE /remove must be {"id": "NODE_ID"}')
    assert http.get("/remove").status_code == 405


# -- rqlite's ServeHTTP: queued writes, headers, path matching, /boot, backup formats,
#    /debug/vars (http/service.go at 9e2a7269) ----------------------------------------


def _sqlite_file(path: Path, *statements: str) -> bytes:
    with sqlite3.connect(path) as db:
        for sql in statements:
            db.execute(sql)
    db.close()
    return path.read_bytes()


def test_queued_writes_always_answer_with_a_sequence_number(
    http: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """rqlite's queuedExecute answers with the queue's sequence number whatever the SQL does
    later: a failing statement, a read, a failing transaction."""
    http.post("/db/execute", json=["CREATE TABLE q (id INTEGER PRIMARY KEY)"])
    numbers = []
    with caplog.at_level(logging.WARNING, logger="litecdc.http"):
        for params, body in [
            ("queue", ["INSERT INTO q VALUES(1)"]),
            ("queue", ["INSERT INTO nosuch VALUES(1)"]),
            ("queue", ["SELECT 1"]),
            ("queue&transaction", ["INSERT INTO q VALUES(2)", "INSERT INTO nosuch VALUES(2)"]),
            ("queue&wait", ["INSERT INTO q VALUES(3)"]),
        ]:
            r = http.post(f"/db/execute?{params}", json=body)
            assert r.status_code == 200, (params, body, r.text)
            doc = r.json()
            assert set(doc) == {"results", "sequence_number"}, (params, body, doc)
            assert doc["results"] == []
            numbers.append(doc["sequence_number"])
    assert numbers == sorted(set(numbers))  # strictly increasing
    # the failed statements are logged with their request's number (rqlite drops them)
    failures = [rec.getMessage() for rec in caplog.records if "queued write" in rec.getMessage()]
    assert failures == [
        f"queued write {numbers[1]}: statement 1 failed: no such table: nosuch",
        f"queued write {numbers[3]}: statement 2 failed: no such table: nosuch "
        "(the transaction was rolled back: nothing was written)",
    ]
    r = http.get("/db/query", params={"q": "SELECT id FROM q ORDER BY id"})
    assert r.json()["results"][0]["values"] == [[1], [3]]  # the failed transaction left nothing
    status = http.get("/status").json()
    assert status["http"]["queue"]["_default"]["sequence_number"] == numbers[-1]


def test_an_empty_queued_batch_is_a_checkpoint_with_wait_only(http: TestClient) -> None:
    """rqlite: ``?queue&wait`` with ``[]`` is a flush checkpoint; without ``wait`` 400."""
    before = _last_cid(http)
    r = http.post("/db/execute?queue&wait", json=[])
    assert r.status_code == 200, r.text
    number = r.json()["sequence_number"]
    assert r.json() == {"results": [], "sequence_number": number}
    r = http.post("/db/execute?queue", json=[])
    assert r.status_code == 400 and r.text.startswith("no statements")
    r = http.post("/db/execute?queue&wait", content=b"[1, 2")
    assert r.status_code == 400 and r.text.startswith("invalid JSON body")
    assert _last_cid(http) == before
    assert http.get("/status").json()["http"]["queue"]["_default"]["sequence_number"] == number


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/status"),
        ("GET", "/nosuch"),
        ("GET", "/db/execute"),
        ("GET", "/journal"),
        ("GET", "/journal?after=x"),
        ("POST", "/db/query"),
        ("OPTIONS", "/nosuch/at/all"),
    ],
)
def test_every_response_has_the_version_and_cors_headers(
    http: TestClient, method: str, path: str
) -> None:
    """rqlite's ServeHTTP: addBuildVersion and addAllowHeaders before anything else."""
    r = http.request(method, path)
    assert r.headers["x-rqlite-version"] == f"litecdc/{VERSION}"
    assert r.headers["access-control-allow-methods"] == "OPTIONS, GET, POST"
    assert r.headers["access-control-allow-headers"] == "Content-Type"
    assert "access-control-allow-credentials" not in r.headers
    assert "access-control-allow-origin" not in r.headers
    if method == "OPTIONS":
        assert (r.status_code, r.content) == (200, b"")


def test_cors_headers_with_auth_and_an_allowed_origin(store: Store, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text('[{"username": "admin", "password": "pw", "perms": ["all"]}]')
    config = NodeConfig(
        data_dir=store.config.data_dir, auth_file=auth, http_allow_origin="https://app.example"
    )
    with TestClient(create_app(store, config), raise_server_exceptions=False) as c:
        for r in (c.get("/status"), c.options("/db/execute"), c.get("/boom")):
            assert r.status_code in (401, 200, 404)
            assert r.headers["access-control-allow-origin"] == "https://app.example"
            assert r.headers["access-control-allow-headers"] == "Content-Type, Authorization"
            assert r.headers["access-control-allow-credentials"] == "true"
            assert r.headers["x-rqlite-version"] == f"litecdc/{VERSION}"
        assert c.options("/db/execute").status_code == 200  # no credentials needed


def test_rqlite_endpoints_match_by_prefix_without_redirects(http: TestClient) -> None:
    """rqlite routes with strings.HasPrefix: a trailing slash or anything after the name
    reaches the endpoint (pyrqlite follows only 301, and a 307 lost the body)."""
    r = http.post("/db/execute/", json=["CREATE TABLE pre (x)"], follow_redirects=False)
    assert r.status_code == 200 and r.json() == {"results": [{}]}
    r = http.post(
        "/db/execute/queue/_default?queue", json=["INSERT INTO pre VALUES(1)"],
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 200 and "sequence_number" in r.json()
    r = http.get("/db/query/", params={"q": "SELECT x FROM pre"}, follow_redirects=False)
    assert r.json()["results"][0]["values"] == [[1]]
    r = http.post("/db/request/x", json=["SELECT 2"], follow_redirects=False)
    assert r.json()["results"][0]["values"] == [[2]]
    for path in ("/statusfoo", "/status/"):
        r = http.get(path, follow_redirects=False)
        assert r.status_code == 200 and "store" in r.json(), path
    assert http.get("/readyz/", follow_redirects=False).text.startswith("[+]node ok")
    assert http.get("/nodes/", follow_redirects=False).status_code == 200
    assert http.get("/db/backup/", follow_redirects=False).content.startswith(SQLITE_HEADER)
    r = http.get("/", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (302, "/status")
    # exact paths stay exact, and nothing else redirects
    for path in ("/boot/", "/debug/vars/", "/debug/varsx", "/journal/", "/db/nothing"):
        r = http.get(path, follow_redirects=False)
        assert r.status_code == 404, (path, r.status_code)
        assert r.text == f"not found: litecdc has no endpoint {path}\n"


def test_no_litecdc_route_is_shadowed_by_an_rqlite_prefix() -> None:
    """litecdc's own endpoints must not start with a path rqlite matches by prefix, or
    rqlite's routing would take them."""
    from litecdc.http.app import OWN_ROUTE_PATHS, RQLITE_ENDPOINTS

    assert {"/journal", "/cdc/changes", "/metrics"} <= set(OWN_ROUTE_PATHS)
    prefixes = [path for path, exact in RQLITE_ENDPOINTS if not exact]
    for own in OWN_ROUTE_PATHS:
        assert not any(own.startswith(prefix) for prefix in prefixes), own


class _Members:
    """Stands in for a cluster node for /boot: ``count`` members, leading or not."""

    def __init__(self, count: int, leading: bool) -> None:
        self.count, self.leading = count, leading

    def is_leader(self) -> bool:
        return self.leading

    def leader(self) -> tuple[str, str] | None:
        return ("n1", "http://127.0.0.1:4001")

    def status(self) -> dict[str, object]:
        return {}

    def known_members(self) -> list[object]:
        return [object()] * self.count

    def remove_member(self, node_id: str) -> None:
        raise AssertionError("not called")


def test_boot_loads_a_sqlite_file_into_a_standalone_node(http: TestClient, tmp_path: Path) -> None:
    """rqlite v8's /boot: POST, ``load`` permission, a SQLite file replaces the data."""
    http.post("/db/execute", json=["CREATE TABLE gone (x)", "INSERT INTO gone VALUES(1)"])
    data = _sqlite_file(
        tmp_path / "boot.sqlite", "CREATE TABLE booted (v TEXT)", "INSERT INTO booted VALUES('b')"
    )
    r = http.post("/boot", content=data)
    assert (r.status_code, r.content) == (200, b"")
    r = http.get("/db/query", params={"q": "SELECT v FROM booted"})
    assert r.json()["results"][0]["values"] == [["b"]]
    r = http.get("/db/query", params={"q": "SELECT x FROM gone"})
    assert r.json()["results"][0]["error"] == "no such table: gone"
    before = _last_cid(http)
    for body in (b"CREATE TABLE t (x); INSERT INTO t VALUES(1);", b"", b"SQLite"):
        r = http.post("/boot", content=body)
        assert r.status_code == 400, body
        assert r.text.startswith("invalid SQLite data: /boot takes a SQLite database file")
    assert _last_cid(http) == before
    r = http.get("/boot")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("members", "leading", "message"),
    [(3, True, "not single-node"), (1, False, "not leader"), (2, False, "not leader")],
)
def test_boot_refuses_a_node_that_is_not_a_single_node_leader(
    store: Store, tmp_path: Path, members: int, leading: bool, message: str
) -> None:
    """rqlite's Store.ReadFrom: ErrNotLeader, then ErrNotSingleNode; handleBoot answers 503."""
    data = _sqlite_file(tmp_path / "b.sqlite", "CREATE TABLE b (x)")
    app = create_app(store, store.config, cluster=_Members(members, leading))  # type: ignore[arg-type]
    with TestClient(app) as c:
        r = c.post("/boot", content=data)
        assert r.status_code == 503
        assert r.text.startswith(message)
    assert store.status().tables == 0


@pytest.mark.parametrize(
    ("fmt", "kind"),
    [
        ("", "wal"), ("binary", "wal"), ("BINARY", "wal"), ("bogus", "wal"),
        ("sql", "sql"), ("SQL", "sql"), ("Sql", "sql"),
        ("delete", "delete"), ("DELETE", "delete"),
    ],
)  # fmt: skip
def test_backup_formats_as_rqlite_reads_them(
    http: TestClient, tmp_path: Path, fmt: str, kind: str
) -> None:
    """rqlite's BackupFormatFromString: lower-cased; binary, sql, delete; anything else is
    binary. ``delete`` is the SQLite file in DELETE (rollback journal) mode."""
    http.post("/db/execute", json=["CREATE TABLE bf (v)", "INSERT INTO bf VALUES('x')"])
    r = http.get("/db/backup", params={"fmt": fmt} if fmt else None)
    assert r.status_code == 200, r.text
    if kind == "sql":
        assert r.headers["content-type"].startswith("application/sql")
        assert "CREATE TABLE bf" in r.text
        return
    assert r.headers["content-type"] == "application/octet-stream"
    data = r.content
    assert data.startswith(SQLITE_HEADER)
    assert data[18:20] == (b"\x02\x02" if kind == "wal" else b"\x01\x01")
    path = tmp_path / "copy.sqlite"
    path.write_bytes(data)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("SELECT v FROM bf").fetchall() == [("x",)]
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    db.close()
    assert mode == ("wal" if kind == "wal" else "delete")


def test_backup_delete_format_compressed(http: TestClient) -> None:
    http.post("/db/execute", json=["CREATE TABLE bz (v)"])
    r = http.get("/db/backup", params={"fmt": "delete", "compress": ""})
    data = gzip.decompress(r.content)
    assert data.startswith(SQLITE_HEADER) and data[18:20] == b"\x01\x01"


def test_debug_vars_is_a_small_honest_expvar(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rqlite serves Go's expvar at /debug/vars (the shell's .expvar prints it): litecdc
    serves the command line, the process's memory and its HTTP counters."""
    monkeypatch.setattr(
        sys, "orig_argv",
        ["python", "-m", "litecdc", "serve", "--etcd-password", "s3cret", "--node-password=pw2",
         "--cdc-config", "https://admin:s3cret@hooks.example.com/h?x=1",
         "--cdc-config=http:u:p@example.com", "--advertise-url", "https://me:pw@n1:4001",
         "--cdc-config", "/etc/litecdc/cdc@1.json", "--node-id", "a@b"],
    )  # fmt: skip
    http.post("/db/execute", json=["CREATE TABLE dv (x)"])
    http.post("/db/execute/", json=["INSERT INTO dv VALUES(1)"])
    r = http.get("/debug/vars")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    doc = r.json()
    assert {"cmdline", "memory", "http"} <= set(doc)
    assert doc["cmdline"] == [
        "python", "-m", "litecdc", "serve", "--etcd-password", "[redacted]",
        "--node-password=[redacted]",
        # a webhook's credentials are never shown (docs/cdc.md); a file path stays as it is
        "--cdc-config", "https://hooks.example.com/h?x=…",
        "--cdc-config=…@example.com", "--advertise-url", "https://n1:4001",
        "--cdc-config", "/etc/litecdc/cdc@1.json", "--node-id", "a@b",
    ]  # fmt: skip
    assert doc["memory"]["max_rss_bytes"] > 0
    assert doc["http"]["executions"] == 2
    assert doc["http"]["execute_stmts_rx"] == 2
    assert http.get("/debug/vars", params={"key": "http"}).json() == {
        "http": http.get("/debug/vars").json()["http"]
    }
    assert http.get("/debug/vars", params={"key": "nosuch"}).json() == {}


def test_debug_vars_needs_the_status_permission(store: Store, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text(
        '[{"username": "ops", "password": "pw", "perms": ["status"]},'
        ' {"username": "loader", "password": "pw", "perms": ["load"]}]'
    )
    config = NodeConfig(data_dir=store.config.data_dir, auth_file=auth)
    with TestClient(create_app(store, config)) as c:
        assert c.get("/debug/vars").status_code == 401
        assert c.get("/debug/vars", auth=("loader", "pw")).status_code == 401
        assert c.get("/debug/vars", auth=("ops", "pw")).status_code == 200
        assert c.post("/boot", content=b"x", auth=("ops", "pw")).status_code == 401
        assert c.post("/boot", content=b"x", auth=("loader", "pw")).status_code == 400


def test_bcrypt_checks_run_off_the_event_loop(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Security QA: each bcrypt check (tens of ms) ran on the event loop, so four clients
    guessing passwords slowed every other request 200-fold."""
    import asyncio

    import bcrypt

    from litecdc.http import auth as auth_module

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    auth = tmp_path / "auth.json"
    auth.write_text(f'[{{"username": "u", "password": "{hashed}", "perms": ["status"]}}]')
    on_the_loop: list[bool] = []
    real = auth_module._password_matches

    def recording(stored: str, given: str) -> bool:
        try:
            asyncio.get_running_loop()
            on_the_loop.append(True)
        except RuntimeError:
            on_the_loop.append(False)
        return real(stored, given)

    monkeypatch.setattr(auth_module, "_password_matches", recording)
    config = NodeConfig(data_dir=store.config.data_dir, auth_file=auth)
    with TestClient(create_app(store, config)) as c:
        assert c.get("/status", auth=("u", "wrong")).status_code == 401
        assert c.get("/status", auth=("u", "s3cret")).status_code == 200
        assert c.get("/status", auth=("u", "s3cret")).status_code == 200  # remembered
    assert on_the_loop == [False, False]


def test_wrong_guesses_do_not_flush_remembered_passwords() -> None:
    import bcrypt

    from litecdc.http.auth import CredentialStore

    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    creds = CredentialStore.from_json(
        f'[{{"username": "u", "password": "{hashed}", "perms": ["query"]}}]'.encode()
    )
    assert creds.needs_hashing("u", "s3cret") and creds.allows("u", "s3cret", "query")
    assert not creds.needs_hashing("u", "s3cret")
    for guess in range(1100):  # more than the cache holds
        creds._check_password("u", f"guess-{guess}")
    assert not creds.needs_hashing("u", "s3cret")
    assert creds.needs_hashing("u", "guess-1")  # a wrong one costs bcrypt every time
    assert not creds.needs_hashing("nobody", "x")


def test_allow_origin_must_be_one_header_value(store: Store) -> None:
    with pytest.raises(ConfigError, match="--http-allow-origin must be one header value"):
        NodeConfig(data_dir=store.config.data_dir, http_allow_origin="https://a\r\nX-Evil: 1")


def test_the_first_value_of_a_repeated_parameter_is_the_one_used(http: TestClient) -> None:
    """QA: the last was (Starlette's), not the first (Go's, rqlite's, and what the docs say):
    ``q=SELECT 1&q=SELECT 2`` ran the second."""
    http.post("/db/execute", json=["CREATE TABLE t(x)", "INSERT INTO t VALUES(1)"])
    r = http.get("/db/query?q=SELECT+1&q=SELECT+2&associative&associative=false")
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["rows"] == [{"1": 1}]
    r = http.get("/journal?after=1&after=0&limit=5")
    assert r.status_code == 200, r.text
    assert [e["cid"] for e in r.json()["entries"]] == [2]
    r = http.get("/db/query", params=[("q", "SELECT x FROM t"), ("level", "none"), ("q", "")])
    assert r.status_code == 200, r.text  # (the empty second q is not the one checked)
    assert r.json()["results"][0]["values"] == [[1]]


def test_first_values_only_keeps_the_parts_as_sent() -> None:
    from litecdc.http.rqlite import first_values_only

    assert first_values_only(b"q=a%20b&x&q=c&x=1&y=%2B") == b"q=a%20b&x&y=%2B"
    assert first_values_only(b"a=1&b=2") == b"a=1&b=2"
    assert first_values_only(b"a+b=1&a%20b=2&&") == b"a+b=1"


def test_uptime_is_written_as_go_writes_a_duration() -> None:
    """rqlite's node.uptime is time.Duration.String(); Go clients parse it back."""
    from litecdc.durations import format_go_duration as go_duration

    assert go_duration(0) == "0s"
    assert go_duration(0.5) == "500ms"
    assert go_duration(0.0015) == "1.5ms"
    assert go_duration(1.5e-6) == "1.5µs"
    assert go_duration(2e-9) == "2ns"
    assert go_duration(1.5) == "1.5s"
    assert go_duration(60) == "1m0s"
    assert go_duration(86.709266) == "1m26.709266s"
    assert go_duration(3723.5) == "1h2m3.5s"
    assert go_duration(90061) == "25h1m1s"


def test_a_min_cid_wait_ends_once_its_client_is_gone(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read waiting for a cid this node has not applied (min_cid) held its read thread
    for the whole wait after its client had left. The wait now asks, twice a second,
    whether the client is still there (the wait is made an hour here, so only that ends
    it; the client's going is faked, as the test client cannot hang up mid-request)."""
    gone = threading.Event()
    waited: list[bool] = []
    waiter = threading.Thread(
        target=lambda: waited.append(store.wait_for_cid(10**9, 3600, gone.is_set)), daemon=True
    )
    waiter.start()
    gone.set()
    waiter.join(30)  # (a hang guard: it returns within half a second)
    assert waited == [False]

    monkeypatch.setattr(app_module, "MIN_CID_WAIT", 3600)
    monkeypatch.setattr(app_module, "_client_gone", lambda request: lambda: True)
    answers: list[int] = []

    def read_waiting_for_a_cid() -> None:
        with TestClient(create_app(store, store.config)) as c:
            r = c.get("/db/query", params={"q": "SELECT 1", "min_cid": "999999999"})
            answers.append(r.status_code)

    reader = threading.Thread(target=read_waiting_for_a_cid, daemon=True)
    reader.start()
    reader.join(30)
    assert answers == [499]  # (nobody reads it; 503 once the wait runs out otherwise)


class _FollowerView(_StuckFollower):
    """A cluster follower, in touch with its cluster or not, as ``status`` says (a real
    one cut off from etcd takes a three-member etcd and a SIGSTOP: tests/system)."""

    def __init__(self, status: dict[str, object], leader: tuple[str, str] | None) -> None:
        self._status, self._leader = status, leader

    def leader(self) -> tuple[str, str] | None:
        return self._leader

    def status(self) -> dict[str, object]:
        return {"leader": self._leader, **self._status}

    def known_members(self) -> list[object]:
        return []  # (etcd out of reach: no member records read)


SOURCE_READS = (
    "/cdc/subscriptions",
    "/cdc/tables",
    "/cdc/tables/src",
    "/cdc/tables/src/splits",
    "/cdc/tables/src/rows",
    "/cdc/tables/src/changes",
    "/cdc/tables/src/position",
)


def test_the_pull_source_is_refused_by_a_node_out_of_touch_with_its_cluster(
    store: Store,
) -> None:
    """Pipeline QA: a node cut off from etcd served its stale head; `pipeline run
    --until-caught-up` said every subscription had caught up (and verify compared with
    the stale data) while the writes went on elsewhere. It answers 503, and the pipeline
    asks the next node it was given."""
    store.execute([S("CREATE TABLE src(id INTEGER PRIMARY KEY, v)")])
    leader = ("n1", "http://127.0.0.1:4001")
    cases = [
        ({"etcd_error": "etcd at 127.0.0.1:2379 has not answered for 13 s"}, leader,
         "etcd at 127.0.0.1:2379 has not answered for 13 s"),
        ({}, None, "it knows no leader right now"),
        ({"needs_snapshot": True}, leader, "it waits for a snapshot of the cluster's data"),
        ({"apply_error": "diverged at cid 7"}, leader, "diverged at cid 7"),
    ]  # fmt: skip
    for status, known_leader, why in cases:
        view = _FollowerView(status, known_leader)
        with TestClient(create_app(store, store.config, cluster=view)) as c:  # type: ignore[arg-type]
            for path in SOURCE_READS:
                r = c.get(path)
                assert r.status_code == 503, (path, r.text)
                assert r.json()["error"] == (
                    f"this node cannot serve the pull source now: {why}; its data may be "
                    "behind the cluster's (a pipeline given several nodes tries the next)"
                ), path
    healthy = _FollowerView({}, leader)
    with TestClient(create_app(store, store.config, cluster=healthy)) as c:  # type: ignore[arg-type]
        for path in SOURCE_READS:
            assert c.get(path).status_code == 200, path


def test_metrics_show_a_cluster_nodes_health(store: Store) -> None:
    """Ops QA: /metrics had no cluster figures — nothing to alert on for a node without
    a leader, cut off from etcd, or whose apply loop stopped. (A healthy 3-node cluster's
    figures: tests/system/test_cluster_serve.py.)"""
    status = {
        "is_leader": False,
        "etcd_error": "etcd at 127.0.0.1:2379 has not answered for 13 s",
        "apply_error": "diverged at cid 7",
        "needs_snapshot": True,
        "applied_revision": 41,
        "log": {"entries_applied": 5, "snapshots_installed": 2, "compacted_revision": None},
    }
    with TestClient(create_app(store, store.config, cluster=_FollowerView(status, None))) as c:  # type: ignore[arg-type]
        text = c.get("/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[:1] != "#")
    assert {k: float(v) for k, v in samples.items() if k.startswith("litecdc_cluster_")} == {
        "litecdc_cluster_is_leader": 0,
        "litecdc_cluster_leader_known": 0,
        "litecdc_cluster_etcd_reachable": 0,
        "litecdc_cluster_applying": 0,
        "litecdc_cluster_needs_snapshot": 1,
        "litecdc_cluster_applied_revision": 41,
        "litecdc_cluster_compacted_revision": 0,
        "litecdc_cluster_entries_applied_total": 5,
        "litecdc_cluster_entries_skipped_total": 0,
        "litecdc_cluster_append_txns_total": 0,
        "litecdc_cluster_entries_appended_total": 0,
        "litecdc_cluster_appends_fenced_total": 0,
        "litecdc_cluster_catch_up_log_reads_total": 0,
        "litecdc_cluster_snapshots_installed_total": 2,
        "litecdc_cluster_compactions_total": 0,
        "litecdc_cluster_keys_compacted_total": 0,
        "litecdc_cluster_etcd_defragmentations_total": 0,
    }
    with TestClient(create_app(store, store.config)) as c:  # (standalone: none of these)
        assert "litecdc_cluster_" not in c.get("/metrics").text


def test_leader_without_one_is_503(store: Store) -> None:
    follower = _FollowerView({"etcd_error": "etcd has not answered for 13 s"}, None)
    with TestClient(create_app(store, store.config, cluster=follower)) as c:  # type: ignore[arg-type]
        r = c.get("/leader")
    assert (r.status_code, r.text) == (
        503,
        "no leader: the cluster has none at the moment (an election under way, or etcd out "
        "of reach: see /readyz)\n",
    )


def test_pull_source_reads_wait_for_min_cid(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pipeline QA: a snapshot page read on a cluster node behind the subscription's
    registration was older than it, and the finished snapshot swept its rows away
    (rows missing at the sink, lag 0). Each source read takes the cid it must be read
    at or after: the node waits for it (10 s; shortened here), else answers 503."""
    store.execute([S("CREATE TABLE src(id INTEGER PRIMARY KEY, v)")])
    store.execute([S("INSERT INTO src VALUES(1, 'a')")])
    head = store.journal.last_cid()
    monkeypatch.setattr(app_module, "MIN_CID_WAIT", 0.2)
    follower = _FollowerView({}, ("n1", "http://127.0.0.1:4001"))  # (behind: it waits)
    with TestClient(create_app(store, store.config, cluster=follower)) as c:  # type: ignore[arg-type]
        for path in SOURCE_READS:
            r = c.get(path, params={"min_cid": head})
            assert r.status_code == 200, (path, r.text)
            r = c.get(path, params={"min_cid": head + 5})
            assert (r.status_code, r.json()["error"]) == (
                503,
                f"this node has not applied cid {head + 5} within 0.2 s (it has {head}); "
                "retry, or read from another node",
            ), path
            r = c.get(path, params={"min_cid": "x"})
            assert r.status_code == 400, path
        r = c.get("/cdc/tables/src/rows", params={"min_cid": head, "format": "json"})
        assert r.json()["cid"] >= head and r.json()["rows"] == [[1, "a", 3]]  # (_litecdc_cid)


def test_a_min_cid_beyond_a_standalone_nodes_history_is_another_historys(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """QA: a standalone source restored from an older backup under a running pipeline
    held every read 10 s and answered 503 "retry". A standalone node writes its history
    alone: a cid beyond its head was read from another history, and no wait brings it —
    409 at once (after a short grace for a commit being published), saying so."""
    store.execute([S("CREATE TABLE src(id INTEGER PRIMARY KEY, v)")])
    head = store.journal.last_cid()
    monkeypatch.setattr(app_module, "MIN_CID_WAIT", 2.0)  # (a standalone node never uses it)
    with TestClient(create_app(store, store.config)) as c:
        for path in (*SOURCE_READS, "/db/query"):
            q = {"q": "SELECT 1"} if path == "/db/query" else {}
            assert c.get(path, params={**q, "min_cid": head}).status_code == 200, path
            r = c.get(path, params={**q, "min_cid": head + 1})
            said = r.text.strip() if q else r.json()["error"]  # (rqlite's endpoints: text)
            assert (r.status_code, said) == (
                409,
                f"min_cid {head + 1} is beyond this node's history, which ends at cid {head}: "
                "the node writes its history alone, so that cid was read from another "
                "history of the database (before a restore of an older backup, from "
                "another data directory or node)",
            ), path


def test_readyz_sync_on_a_standalone_node_is_always_in_sync(http: TestClient) -> None:
    """rqlite's ``/readyz?sync``: a standalone node's log is its own (a cluster follower
    behind its log is tested in tests/system/test_cluster_source.py)."""
    r = http.get("/readyz", params={"sync": "", "timeout": "1s"})
    assert (r.status_code, r.text) == (200, "[+]node ok\n[+]leader ok\n[+]store ok\n[+]sync ok")
    assert http.get("/readyz", params={"sync": "", "timeout": "x"}).status_code == 400


class _EtcdSilentLeader(_FollowerView):
    """A leader whose read of the log's head fails (etcd not answering it): a real one
    takes a three-member etcd and a SIGSTOP (tests/system)."""

    def is_leader(self) -> bool:
        return True

    def log_head_cid(self, timeout: float | None = None) -> int:
        assert timeout is not None and timeout <= 60  # (bounded by the request's timeout)
        from litecdc.cluster.etcd import EtcdUnavailableError

        raise EtcdUnavailableError("etcd at 127.0.0.1:2379 has not answered for 6 s")


def test_readyz_sync_says_when_the_logs_head_cannot_be_read(store: Store) -> None:
    """Review: the etcd error escaped as a bare 503, logged at ERROR on every probe."""
    view = _EtcdSilentLeader({}, (store.config.node_id, "http://127.0.0.1:4001"))
    with TestClient(create_app(store, store.config, cluster=view)) as c:  # type: ignore[arg-type]
        r = c.get("/readyz", params={"sync": "", "timeout": "1h"})
    assert (r.status_code, r.text) == (
        503,
        "[+]node ok\n[+]leader ok\n[+]store ok\n[-]sync not ok: cannot read the log's head: "
        "etcd at 127.0.0.1:2379 has not answered for 6 s",
    )


def test_a_big_transaction_is_served_a_batch_at_a_time(
    http: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change page holds whole transactions: one of 1.5M rows was built as Python values
    at once and copied whole into one response (1.2 GB per reader, scale QA). Its events
    are now made and sent a few thousand at a time — here 3 — and read the same, key
    changes (a delete then an upsert) and misfits across the batches included."""
    monkeypatch.setattr(source, "CHANGE_BATCH_ROWS", 3)
    # and the memory a big page took is handed back once it is sent (Arrow's allocator
    # kept it: ~115 MB after each 1.5M-event page); here "big" is 10 events
    monkeypatch.setattr(app_module, "RELEASE_MEMORY_AFTER_EVENTS", 10)
    released: list[str] = []
    monkeypatch.setattr(app_module, "release_unused_memory", lambda: released.append("page"))
    http.post("/db/execute", json=["CREATE TABLE big (k TEXT PRIMARY KEY, n INTEGER)"])
    start = _last_cid(http)
    http.post(
        "/db/execute",
        json=[
            *(f"INSERT INTO big VALUES('k{i}', {i})" for i in range(8)),
            "UPDATE big SET k = k || 'x' WHERE n % 2 = 0",  # key changes: two events each
            "UPDATE big SET n = 'not a number' WHERE k = 'k3'",  # a misfit, fixed below
            "DELETE FROM big WHERE n = 5",
        ],
        params={"transaction": ""},
    )
    http.post("/db/execute", json=["UPDATE big SET n = 3 WHERE k = 'k3'"])
    r = http.get("/cdc/tables/big/changes", params={"after": start, "format": "arrow"})
    assert r.status_code == 200, r.text
    assert "content-length" not in r.headers  # streamed
    reader = pa.ipc.open_stream(r.content)
    batches = list(reader)
    assert len(batches) > 3
    got = pa.Table.from_batches(batches, schema=reader.schema)
    events = list(zip(*(got.column(c).to_pylist() for c in ("_litecdc_op", "k", "n")), strict=True))
    inserts = [("upsert", f"k{i}", i) for i in range(8)]
    moves = [e for i in range(0, 8, 2) for e in (("delete", f"k{i}", i), ("upsert", f"k{i}x", i))]
    # k3's misfit version is left out: the source holds a version that fits since
    assert events == [*inserts, *moves, ("delete", "k5", 5), ("upsert", "k3", 3)]
    assert got.schema.metadata[b"litecdc.last_cid"] == str(_last_cid(http)).encode()
    assert released == ["page"]
    small = http.get("/cdc/tables/big/changes", params={"after": start + 1, "format": "arrow"})
    assert pa.ipc.open_stream(small.content).read_all().num_rows == 1
    assert released == ["page"]  # not after a small one
    as_json = http.get("/cdc/tables/big/changes", params={"after": start}).json()
    assert [tuple(row[2:]) for row in as_json["rows"]] == events
    assert released == ["page", "page"]  # (the JSON form too)


def test_an_sql_dump_of_chosen_tables_holds_them_and_nothing_else(http: TestClient) -> None:
    """rqlite QA: ``/db/backup?fmt=sql&tables=users,customers`` (rqlite's backup guide)
    dumped every table — another table's rows included. The chosen tables come with their
    indexes, triggers and AUTOINCREMENT mark, and the dump loads into an empty database."""
    r = http.post(
        "/db/execute",
        json=[
            "CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)",
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, users_id INTEGER)",
            "CREATE TABLE secret (id INTEGER PRIMARY KEY AUTOINCREMENT, pin TEXT)",
            "CREATE INDEX users_name ON users(name)",
            "CREATE INDEX secret_pin ON secret(pin)",
            "CREATE TRIGGER customers_seen AFTER INSERT ON customers BEGIN "
            "UPDATE users SET name = name WHERE id = NEW.users_id; END",
            "CREATE TRIGGER secret_kept AFTER DELETE ON secret BEGIN SELECT 1; END",
            "CREATE VIEW pins AS SELECT pin FROM secret",
            "INSERT INTO users(name) VALUES('ann'), ('bo')",
            "DELETE FROM users WHERE name = 'bo'",
            "INSERT INTO customers VALUES(7, 1)",
            "INSERT INTO secret(pin) VALUES('4711')",
        ],
    )
    assert all("error" not in result for result in r.json()["results"]), r.text
    before = _last_cid(http)
    r = http.get("/db/backup", params={"fmt": "sql", "tables": " users, Customers "})
    assert r.status_code == 200, r.text
    dump = r.text
    assert "secret" not in dump and "4711" not in dump and "pins" not in dump
    db = sqlite3.connect(":memory:")
    db.executescript(dump)
    assert db.execute("SELECT * FROM users").fetchall() == [(1, "ann")]
    assert db.execute("SELECT * FROM customers").fetchall() == [(7, 1)]
    assert db.execute("SELECT name, seq FROM sqlite_sequence").fetchall() == [("users", 2)]
    assert db.execute(
        "SELECT type, name FROM sqlite_schema WHERE type IN ('index', 'trigger') ORDER BY name"
    ).fetchall() == [("trigger", "customers_seen"), ("index", "users_name")]
    db.close()
    # a view is dumped when named; an empty list is every table
    assert "CREATE VIEW pins" in http.get("/db/backup?fmt=sql&tables=secret,pins").text
    assert "4711" in http.get("/db/backup?fmt=sql&tables=").text
    # a name that is no table, or a backup file (which holds every table): refused
    r = http.get("/db/backup", params={"fmt": "sql", "tables": "users,nosuch,_litecdc_journal"})
    assert (r.status_code, r.text) == (
        400,
        "tables: no such table: nosuch, _litecdc_journal (a dump of chosen tables names "
        "tables or views of the database, separated by commas)\n",
    )
    r = http.get("/db/backup", params={"tables": "users"})
    assert (r.status_code, r.text) == (
        400,
        "tables limits an SQL dump (fmt=sql); a backup file holds every table\n",
    )
    assert _last_cid(http) == before


def test_a_position_counts_a_big_transactions_rest_in_sql_alike(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale QA: a position behind a 1.5M-row transaction read every row of it out (2.5 s
    a call; `pipeline status`, one call per subscription, called the node unreachable).
    Past its first rows (here 3) a transaction's rest is counted by SQLite: the same end,
    events (a key change counts two) and first cid as reading every row."""
    for table in ("r(id INTEGER PRIMARY KEY, v)", "k(id TEXT PRIMARY KEY, v)", "n(id, v)"):
        store.execute([S(f"CREATE TABLE {table}")])  # (n: keyed by its rowid)
    start = store.last_cid()
    for name, key in (("r", "{i}"), ("k", "'k{i}'"), ("n", "{i}")):
        store.execute([S(f"INSERT INTO {name} VALUES({key.format(i=i)}, {i})") for i in range(2)])
        store.execute(
            [S(f"INSERT INTO {name} VALUES({key.format(i=i)}, {i})") for i in range(2, 22)]
            + [S(f"UPDATE {name} SET v = -v WHERE v < 5")]
            + [S(f"DELETE FROM {name} WHERE v = 7")],
            transaction=True,
        )
        moved = {"r": "id = id + 100", "k": "id = id || 'x'", "n": "rowid = rowid + 100"}[name]
        store.execute([S(f"UPDATE {name} SET {moved} WHERE v % 2 = 0")], transaction=True)
        store.execute([S(f"INSERT INTO {name} VALUES({key.format(i=99)}, 99)")])

    def positions() -> list[tuple[int, int, int | None]]:
        found = []
        for name in ("r", "k", "n"):
            for after in range(start, store.last_cid() + 1):
                for most in (1, 2, 5, 25, 30, 1000):
                    p = store.source_position(name, after, most)
                    found.append((p.end_cid, p.events, p.first_cid))
        return found

    monkeypatch.setattr(source, "COUNT_IN_SQL_AFTER", 10**9)  # every row read out
    read_out = positions()
    monkeypatch.setattr(source, "COUNT_IN_SQL_AFTER", 3)
    assert positions() == read_out
    # table r: its big transaction (20 inserts, 5 updates, 1 delete) is cid start + 2, the
    # one changing 11 keys (two events each) start + 3
    first = read_out[:6]  # after = start
    assert first[0] == (start + 1, 2, start + 1)
    assert first[2] == (start + 2, 28, start + 1)
    assert (start + 3, 22, start + 3) in read_out[12:18]  # after = start + 2
