"""litecdc's own endpoints: /journal and /cdc/changes."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
from litecdc_node import Node


def test_journal_and_changes_pages(fresh_node: Node) -> None:
    with fresh_node.client() as c:
        first = c.get("/journal").json()
        initial = first["entries"][0]
        assert (initial["cid"], initial["query"], initial["snapshot"]) == (1, "", 0)
        assert first["available_snapshot"] == first["entries"][-1]["cid"]
        start = first["entries"][-1]["cid"]

        fresh_node.execute(
            c,
            [
                "CREATE TABLE j (id INTEGER PRIMARY KEY, name TEXT, b BLOB)",
                ["INSERT INTO j(name, b) VALUES(?, ?)", "fiona", [1, 2, 3]],
            ],
        )
        fresh_node.execute(c, ["UPDATE j SET name = 'declan' WHERE id = 1"])
        fresh_node.execute(c, ["DELETE FROM j WHERE id = 1"])

        page = c.get("/journal", params={"after": start}).json()
        assert set(page) == {"entries", "available_snapshot", "oldest_cid"}
        assert page["oldest_cid"] == 1
        entries = page["entries"]
        assert [e["cid"] for e in entries] == [start + 1, start + 2, start + 3]
        assert page["available_snapshot"] == start + 3
        for e in entries:
            assert set(e) == {"cid", "query", "snapshot", "timestamp_ms", "seed", "internal"}
            assert e["internal"] is False
            assert isinstance(e["query"], str) and e["timestamp_ms"] > 0
        assert "UPDATE j" in entries[1]["query"]
        one = c.get("/journal", params={"after": start, "limit": 1}).json()["entries"]
        assert [e["cid"] for e in one] == [start + 1]

        changes = c.get("/cdc/changes", params={"after": start}).json()
        assert set(changes) == {"changes"}
        ops = [(ch["cid"], ch["seq"], ch["table"], ch["op"]) for ch in changes["changes"]]
        assert [op[2:] for op in ops] == [("j", "insert"), ("j", "update"), ("j", "delete")]
        insert, update, delete = changes["changes"]
        blob = base64.b64encode(b"\x01\x02\x03").decode()
        assert insert["before"] is None
        assert insert["after"] == {"id": 1, "name": "fiona", "b": blob}
        assert insert["pk"] == {"id": 1}
        assert update["before"]["name"] == "fiona" and update["after"]["name"] == "declan"
        assert delete["after"] is None and delete["before"]["name"] == "declan"
        for key in ("cid", "seq", "table", "op", "old_rowid", "new_rowid", "pk", "before", "after"):
            assert key in insert
        last = c.get("/cdc/changes", params={"after": delete["cid"]}).json()
        assert last == {"changes": []}


@pytest.mark.parametrize(
    ("path", "query", "message"),
    [
        ("/journal", "after=abc", "after must be an integer, got 'abc'"),
        ("/journal", "limit=1.5", "limit must be an integer, got '1.5'"),
        ("/journal", "after=-1", "after must be at least 0, got -1"),
        ("/journal", "limit=0", "limit must be at least 1, got 0"),
        ("/journal", "limit=10001", "limit must be between 1 and 10000, got 10001"),
        (
            "/cdc/changes",
            "since=3",
            "unknown query parameter(s) since for /cdc/changes; "
            "allowed: after, after_seq, limit, pretty",
        ),
        ("/cdc/changes", "after=", "after must be an integer, got ''"),
        # int() took these (HTTP QA); Go's Atoi and litecdc's other parameters do not
        ("/journal", "after=1_0", "after must be an integer, got '1_0'"),
        ("/journal", "after=%D9%A3", "after must be an integer, got '\u0663'"),
        ("/cdc/changes", "limit=%EF%BC%95", "limit must be an integer, got '\uff15'"),
        ("/cdc/changes", "after_seq=%207", "after_seq must be an integer, got ' 7'"),
    ],
)
def test_bad_page_parameters(node: Node, path: str, query: str, message: str) -> None:
    with node.client() as c:
        r = c.get(f"{path}?{query}")
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json; charset=utf-8"
        assert r.json() == {"error": message}


def test_huge_positions_are_bad_requests(client: Any) -> None:
    for path, params in (
        ("/cdc/changes", {"after": 2**40}),
        ("/journal", {"after": 2**64}),
        ("/cdc/changes", {"after": 1, "after_seq": 2**24}),
    ):
        r = client.get(path, params=params)
        assert r.status_code == 400, r.text
        assert "must be at most" in r.json()["error"]


def test_the_journal_is_trimmed_to_its_retention(tmp_path: Path) -> None:
    """--journal-retention-cids N: each node keeps its newest N entries (the journal grew
    with every write, forever); /journal says which is the oldest left."""
    node = Node(tmp_path / "n", "--journal-retention-cids", "3").start()
    try:
        with node.client() as c:
            node.execute(c, ["CREATE TABLE t(x)"])
            for i in range(10):
                node.execute(c, [["INSERT INTO t VALUES(?)", i]])
            last = c.get("/journal", params={"after": 0, "limit": 1000}).json()["entries"][-1]
            deadline = time.monotonic() + 30  # the node checks every 5 s

            def page() -> Any:
                return c.get("/journal", params={"after": 0}).json()

            while page()["oldest_cid"] != last["cid"] - 2:
                assert time.monotonic() < deadline, page()
                time.sleep(0.2)
            assert [e["cid"] for e in page()["entries"]] == [
                last["cid"] - 2,
                last["cid"] - 1,
                last["cid"],
            ]
            assert node.query(c, "SELECT count(*) FROM t")["results"][0]["values"] == [[10]]
    finally:
        assert node.stop() == 0
