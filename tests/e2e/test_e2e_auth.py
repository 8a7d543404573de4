"""Basic auth with per-user permissions (rqlite's -auth file)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litecdc_node import Node

USERS = [
    {"username": "admin", "password": "secret1", "perms": ["all"]},
    {"username": "reader", "password": "secret2", "perms": ["query"]},
    {"username": "writer", "password": "secret3", "perms": ["execute"]},
    {"username": "*", "perms": ["ready"]},
]


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    base = tmp_path_factory.mktemp("auth")
    auth_file = base / "auth.json"
    auth_file.write_text(json.dumps(USERS))
    n = Node(base / "data", "--auth", str(auth_file)).start()
    with n.client(auth=("admin", "secret1")) as c:
        n.execute(c, ["CREATE TABLE a (id INTEGER PRIMARY KEY)"])
    yield n
    n.stop()


@pytest.mark.parametrize(
    ("auth", "method", "path", "body", "status"),
    [
        (None, "GET", "/readyz", None, 200),  # granted to "*"
        (None, "GET", "/db/query?q=SELECT+1", None, 401),
        (None, "POST", "/db/execute", ["INSERT INTO a VALUES(NULL)"], 401),
        (("reader", "secret2"), "GET", "/db/query?q=SELECT+1", None, 200),
        (("reader", "wrong"), "GET", "/db/query?q=SELECT+1", None, 401),
        (("nobody", "secret2"), "GET", "/db/query?q=SELECT+1", None, 401),
        (("reader", "secret2"), "POST", "/db/execute", ["INSERT INTO a VALUES(NULL)"], 401),
        (("writer", "secret3"), "POST", "/db/execute", ["INSERT INTO a VALUES(NULL)"], 200),
        (("writer", "secret3"), "POST", "/db/request", ["SELECT 1"], 401),  # needs query too
        (("reader", "secret2"), "POST", "/db/request", ["SELECT 1"], 401),
        (("admin", "secret1"), "POST", "/db/request", ["SELECT 1"], 200),
        (("reader", "secret2"), "GET", "/status", None, 401),
        (("admin", "secret1"), "GET", "/status", None, 200),
        (("reader", "secret2"), "GET", "/db/backup", None, 401),
        (("admin", "secret1"), "GET", "/db/backup", None, 200),
        (("writer", "secret3"), "POST", "/db/load", None, 401),
        (("reader", "secret2"), "GET", "/nodes", None, 401),
        (("reader", "secret2"), "GET", "/journal", None, 200),
        (None, "GET", "/cdc/changes", None, 401),
    ],
)
def test_permissions(
    auth_node: Node,
    auth: tuple[str, str] | None,
    method: str,
    path: str,
    body: object,
    status: int,
) -> None:
    with auth_node.client(auth=auth) if auth else auth_node.client() as c:
        r = c.request(method, path, json=body) if body is not None else c.request(method, path)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.headers["www-authenticate"] == 'Basic realm="litecdc"'
        assert r.text.startswith("unauthorized: this request needs the ")


def test_denied_write_changes_nothing(auth_node: Node) -> None:
    with auth_node.client(auth=("admin", "secret1")) as admin:
        before = admin.get("/db/query", params={"q": "SELECT COUNT(*) FROM a"}).json()
        with auth_node.client(auth=("reader", "secret2")) as reader:
            assert reader.post("/db/execute", json=["DELETE FROM a"]).status_code == 401
        after = admin.get("/db/query", params={"q": "SELECT COUNT(*) FROM a"}).json()
        assert after == before
        assert admin.get("/status").json()["http"]["auth"] == "enabled"


def test_bad_auth_file_is_a_config_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "auth.json"
    bad.write_text('[{"username": "x", "password": "y", "perms": ["qurey"]}]')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "litecdc",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--http-addr",
            "127.0.0.1:1",
            "--auth",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: --auth: {bad}, entry 1 (x): unknown permission(s) qurey; known: ")
    )


def test_httpx_basic_auth_header_forms(auth_node: Node) -> None:
    # a malformed Authorization header counts as anonymous, as in Go's BasicAuth
    with httpx.Client(base_url=auth_node.url) as c:
        r = c.get("/db/query", params={"q": "SELECT 1"}, headers={"Authorization": "Basic !!!"})
        assert r.status_code == 401
        assert c.get("/readyz", headers={"Authorization": "Bearer x"}).status_code == 200
