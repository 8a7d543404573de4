"""Bad requests get a clear 4xx, and change nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from litecdc_node import Node


def _last_cid(client: httpx.Client) -> int:
    return int(client.get("/status").json()["store"]["last_cid"])


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"[not json", 400, "invalid JSON body: "),
        (b'{"sql": "SELECT 1"}', 400, "invalid request: the body must be a JSON array"),
        (b"[42]", 400, "invalid request: statement 1 is a number"),
        (b'["CREATE TABLE t1 (a)", null]', 400, "invalid request: statement 2 is null"),
        (b"[[]]", 400, "invalid request: statement 1 is an empty array"),
        (b"[[1, 2]]", 400, "invalid request: statement 1 must start with the SQL string"),
        (b"[]", 400, "no statements: "),
        (b"", 400, "no statements: "),
        (b'[["INSERT INTO t1 VALUES(?)", [1, 300]]]', 400, "unsupported type: statement 1"),
        (b'[["INSERT INTO t1 VALUES(?)", {"a": {"b": 1}}]]', 400, "unsupported type: "),
        (
            b'[["INSERT INTO t1 VALUES(?, :a)", 1, {"a": 2}]]',
            400,
            "invalid request: statement 1 mixes",
        ),
    ],
)
def test_malformed_execute_bodies(
    node: Node, client: httpx.Client, body: bytes, status: int, message: str
) -> None:
    before = _last_cid(client)
    r = client.post("/db/execute", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.text.startswith(message), r.text
    assert r.text.endswith("\n")
    assert _last_cid(client) == before


def test_malformed_query_and_request_bodies(client: httpx.Client) -> None:
    assert client.post("/db/query", content=b"{").status_code == 400
    r = client.post("/db/request", content=b"[1]")
    assert (r.status_code, r.text.split(":")[0]) == (400, "invalid request")
    r = client.get("/db/query")
    assert r.status_code == 400
    assert r.text.startswith("no statements: give the SQL in the q parameter")


def test_invalid_duration_parameter(client: httpx.Client) -> None:
    r = client.get("/db/query", params={"q": "SELECT 1", "freshness": "soon"})
    assert r.status_code == 400
    assert r.text == 'time: invalid duration "soon" (query parameter freshness)\n'
    ok = client.get("/db/query", params={"q": "SELECT 1", "freshness": "1.5s", "timeout": "2m3s"})
    assert ok.status_code == 200


def test_unknown_endpoint_and_wrong_method(client: httpx.Client) -> None:
    r = client.get("/db/nothing")
    assert r.status_code == 404
    assert r.text == "not found: litecdc has no endpoint /db/nothing\n"
    for method, path, allowed in [
        ("GET", "/db/execute", "POST"),
        ("GET", "/db/request", "POST"),
        ("PUT", "/db/query", "GET, POST"),
        ("POST", "/status", "GET"),
        ("DELETE", "/db/backup", "GET"),
        ("GET", "/db/load", "POST"),
        ("POST", "/journal", "GET"),
        ("POST", "/cdc/changes", "GET"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 405, (method, path)
        assert r.headers["allow"] == allowed
        assert f"method {method} is not allowed on {path}" in r.text


def test_options_is_answered_for_cors(client: httpx.Client) -> None:
    r = client.options("/db/execute")
    assert r.status_code == 200
    assert r.headers["access-control-allow-methods"] == "OPTIONS, GET, POST"


def test_oversize_body_is_413_and_changes_nothing(tmp_path: Path) -> None:
    n = Node(tmp_path / "data", "--max-body-bytes", "2048").start()
    try:
        with n.client() as c:
            n.execute(c, ["CREATE TABLE big (v TEXT)"])
            before = _last_cid(c)
            payload = [["INSERT INTO big(v) VALUES(?)", "x" * 4096]]
            r = c.post("/db/execute", json=payload)
            assert r.status_code == 413
            assert r.text.startswith("request body too large: ")
            assert "the limit is 2048 bytes" in r.text

            def chunks() -> object:
                yield b'[["INSERT INTO big(v) VALUES(?)", "'
                for _ in range(10):
                    yield b"y" * 1000
                yield b'"]]'

            r = c.post("/db/execute", content=chunks())  # chunked: no Content-Length
            assert r.status_code == 413
            assert _last_cid(c) == before
            assert n.query(c, "SELECT COUNT(*) FROM big")["results"][0]["values"] == [[0]]
    finally:
        n.stop()
