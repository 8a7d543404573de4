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
