"""The Starlette app in-process, on a real Store: error mapping and the handler path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from litecdc.config import NodeConfig
from litecdc.errors import ModeError
from litecdc.http import create_app
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
    monkeypatch.setattr(store, "changes", refuse)
    r = http.get("/cdc/changes")
    assert (r.status_code, r.json()) == (
        409,
        {"error": "plain writes are not allowed in FOLLOWER mode"},
    )


def test_unexpected_errors_are_500_with_the_reason(
    http: TestClient, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "status", broken)
    r = http.get("/status")
    assert (r.status_code, r.text) == (500, "internal error: RuntimeError: disk on fire\n")


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
