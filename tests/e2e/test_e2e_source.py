"""The node's pull-source API (what the pipeline reads), against a real ``litecdc serve``.

Subscriptions (retention holds), table descriptions, snapshot chunks as Arrow IPC with
keyset paging, splits, typed change ranges and positions, retention (410 once pruned),
and the 4xx answers to bad requests.

Tests that read changes register their own subscriber first and read after its cid:
registering prunes what no hold needs, so a test never relies on changes older than
its own hold.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.ipc
import pytest
from litecdc_node import Node, free_port

ARROW_STREAM = "application/vnd.apache.arrow.stream"
ROWID = "_litecdc_rowid"
META = ["_litecdc_cid", "_litecdc_seq", "_litecdc_op"]


# -- helpers ---------------------------------------------------------------------------
def arrow(r: httpx.Response) -> pa.Table:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(ARROW_STREAM)
    return pyarrow.ipc.open_stream(r.content).read_all()


def meta(table: pa.Table) -> dict[str, str]:
    raw = table.schema.metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items()}


def head(c: httpx.Client) -> int:
    r = c.get("/cdc/subscriptions")
    assert r.status_code == 200, r.text
    return int(r.json()["last_cid"])


def commit_all(node: Node, c: httpx.Client, *sql: str, transaction: bool = False) -> int:
    """Run ``sql`` as one request (every statement must succeed); the head after it."""
    body = node.execute(c, list(sql), **({"transaction": ""} if transaction else {}))
    assert not [r["error"] for r in body["results"] if "error" in r], body
    return head(c)


def described(c: httpx.Client, table: str, field: str) -> int:
    """A cid field of the table's description (``reshaped_cid``, ``unlogged_cid``)."""
    r = c.get(f"/cdc/tables/{table}")
    assert r.status_code == 200, r.text
    return int(r.json()[field])


def holds(c: httpx.Client) -> dict[str, dict[str, Any]]:
    r = c.get("/cdc/subscriptions")
    assert r.status_code == 200, r.text
    return {h["name"]: h for h in r.json()["subscriptions"]}


def register(c: httpx.Client, name: str) -> int:
    r = c.post("/cdc/subscriptions", json={"name": name})
    assert r.status_code == 200, r.text
    assert r.json()["name"] == name
    return int(r.json()["cid"])


def release(c: httpx.Client, name: str) -> None:
    r = c.delete(f"/cdc/subscriptions/{name}")
    assert r.status_code == 200, r.text
    assert r.json() == {"name": name, "released": True}


@contextmanager
def subscriber(c: httpx.Client, name: str) -> Iterator[int]:
    """A hold for the test's duration; yields the register cid."""
    cid = register(c, name)
    try:
        yield cid
    finally:
        release(c, name)


def changes(c: httpx.Client, table: str, **params: Any) -> pa.Table:
    return arrow(c.get(f"/cdc/tables/{table}/changes", params={"format": "arrow", **params}))


def events(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in table.to_pylist()]


def all_rows(
    c: httpx.Client, table: str, limit: int, **params: Any
) -> tuple[list[dict[str, Any]], int]:
    """Every row by keyset paging through ``litecdc.last_key``; (rows, pages)."""
    rows: list[dict[str, Any]] = []
    after: str | None = None
    pages = 0
    while True:
        q = {"format": "arrow", "limit": limit, **params}
        if after is not None:
            q["after_key"] = after
        page = arrow(c.get(f"/cdc/tables/{table}/rows", params=q))
        pages += 1
        m = meta(page)
        rows.extend(page.to_pylist())
        assert page.num_rows <= limit
        if m["litecdc.done"] == "true":
            assert page.num_rows < limit
            return rows, pages
        assert page.num_rows == limit
        after = m["litecdc.last_key"]
        assert pages < 100_000


def bits(x: float | None) -> str | None:
    return None if x is None else struct.pack(">d", x).hex()


def error_of(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    message = r.json()["error"]
    assert isinstance(message, str)
    return message


# -- subscriptions ---------------------------------------------------------------------
def test_register_list_progress_release_round_trip(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(c, ["CREATE TABLE rt (id INTEGER PRIMARY KEY, v TEXT)"])
    before = head(c)
    cid = register(c, "rt-a")
    assert cid > before  # the registration is a commit of its own
    listed = c.get("/cdc/subscriptions").json()
    assert listed["last_cid"] >= cid
    assert listed["retention_cids"] == 1_000_000
    hold = {h["name"]: h for h in listed["subscriptions"]}["rt-a"]
    assert hold["expired"] is False
    # the hold is at the head the registration saw: every change after ``cid`` is kept
    assert cid - 1 <= hold["cid"] <= cid
    assert listed["pruned_cid"] <= hold["cid"]

    for i in range(3):
        node.execute(c, [["INSERT INTO rt VALUES(?, ?)", i, f"v{i}"]])
    target = head(c)
    r = c.post("/cdc/subscriptions/rt-a/progress", json={"cid": target})
    assert r.status_code == 200, r.text
    assert r.json() == {"name": "rt-a", "cid": target}
    assert holds(c)["rt-a"]["cid"] == target
    # progress never moves a hold back
    r = c.post("/cdc/subscriptions/rt-a/progress", json={"cid": cid})
    assert r.status_code == 200, r.text
    assert r.json()["cid"] == target
    assert holds(c)["rt-a"]["cid"] == target

    # re-registering restarts the hold at the (new) head
    node.execute(c, [["INSERT INTO rt VALUES(?, ?)", 10, "x"]])
    again = register(c, "rt-a")
    assert again > target
    assert again - 1 <= holds(c)["rt-a"]["cid"] <= again

    # a second subscriber is listed beside it, sorted by name
    register(c, "rt-0")
    names = [h["name"] for h in c.get("/cdc/subscriptions").json()["subscriptions"]]
    assert names.index("rt-0") < names.index("rt-a")

    release(c, "rt-a")
    release(c, "rt-0")
    assert "rt-a" not in holds(c) and "rt-0" not in holds(c)
    assert "no subscriber 'rt-a'" in error_of(c.delete("/cdc/subscriptions/rt-a"), 404)
    r = c.post("/cdc/subscriptions/rt-a/progress", json={"cid": target})
    assert "rt-a" in error_of(r, 404)


def test_hold_keeps_changes_after_its_cid_and_older_ones_give_410(
    node: Node, client: httpx.Client
) -> None:
    c = client
    node.execute(c, ["CREATE TABLE hk (id INTEGER PRIMARY KEY, v TEXT)"])
    for i in range(5):  # history from before the registration
        node.execute(c, [["INSERT INTO hk VALUES(?, ?)", i, "old"]])
    with subscriber(c, "hk-sub") as cid:
        written = []
        for i in range(100, 120):
            node.execute(c, [["INSERT INTO hk VALUES(?, ?)", i, "new"]])
            written.append(i)
        got = changes(c, "hk", after=cid)
        assert got.column("id").to_pylist() == written
        assert set(got.column("_litecdc_op").to_pylist()) == {"upsert"}
        assert meta(got)["litecdc.end_cid"] == str(head(c))

        # what came before the hold was pruned: a clear 410, for rows-of-changes and position
        pruned = c.get("/cdc/subscriptions").json()["pruned_cid"]
        assert cid - 1 <= pruned <= cid
        for path in ("changes", "position"):
            r = c.get(f"/cdc/tables/hk/{path}", params={"after": pruned - 1})
            assert "no longer available" in error_of(r, 410)
            assert c.get(f"/cdc/tables/hk/{path}", params={"after": pruned}).status_code == 200
        assert "no longer available" in error_of(c.get("/cdc/tables/hk/changes"), 410)

        # progress lets the change log go up to the new position, not further
        middle = int(got.column("_litecdc_cid")[9].as_py())
        r = c.post("/cdc/subscriptions/hk-sub/progress", json={"cid": middle})
        assert r.status_code == 200, r.text
        assert c.get("/cdc/subscriptions").json()["pruned_cid"] == middle
        rest = changes(c, "hk", after=middle)
        assert rest.column("id").to_pylist() == written[10:]
        error_of(c.get("/cdc/tables/hk/changes", params={"after": cid}), 410)


def test_register_at_a_cid_keeps_the_changes_after_it(node: Node, client: httpx.Client) -> None:
    """A reader starting after a known cid (a stream's starting_cid) registers its hold
    there: registered at the head, the hold let the node prune what it was to read (docs
    QA). Bad input changes nothing; a cid pruned past is a clear 410."""
    c = client
    node.execute(c, ["CREATE TABLE ra (id INTEGER PRIMARY KEY)"])
    with subscriber(c, "ra-keeper"):
        start = head(c)
        for i in range(3):
            node.execute(c, [["INSERT INTO ra VALUES(?)", i]])
        r = c.post("/cdc/subscriptions", json={"name": "ra-sub", "cid": start})
        assert r.status_code == 200, r.text
        assert r.json() == {"name": "ra-sub", "cid": start}
    assert holds(c)["ra-sub"]["cid"] == start  # the keeper gone, it holds the rest
    assert c.get("/cdc/subscriptions").json()["pruned_cid"] <= start
    assert changes(c, "ra", after=start).column("id").to_pylist() == [0, 1, 2]

    listed = c.get("/cdc/subscriptions").json()
    for bad, said in (
        ("5", "cid must be an integer, got '5'"),
        (True, "cid must be an integer, got True"),
        (1.5, "cid must be an integer, got 1.5"),
        (-1, "cid must be between 0 and"),
        (head(c) + 100, "is beyond the head of this node's journal"),
    ):
        r = c.post("/cdc/subscriptions", json={"name": "ra-bad", "cid": bad})
        assert said in error_of(r, 400)
    assert c.get("/cdc/subscriptions").json() == listed  # nothing written

    release(c, "ra-sub")
    with subscriber(c, "ra-keeper"):  # the only hold, at the head: the node prunes to it
        pruned = c.get("/cdc/subscriptions").json()["pruned_cid"]
        assert pruned > start
        r = c.post("/cdc/subscriptions", json={"name": "ra-late", "cid": start})
        message = error_of(r, 410)
        assert f"cannot place the hold of subscriber 'ra-late' at cid {start}" in message
        assert f"pruned through cid {pruned}" in message
        assert "ra-late" not in holds(c)


@pytest.fixture(scope="module")
def small_cap_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node keeping at most 20 commits of changes (needs ``serve --retention-cids``)."""
    n = Node(tmp_path_factory.mktemp("cap") / "data", "--retention-cids", "20").start()
    yield n
    n.stop()


def _wait_for(check: Any, what: str, timeout: float = 20.0) -> Any:
    """Poll ``check()`` until truthy (the RetentionKeeper runs every 5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_hold_that_would_expire_at_once_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Register QA: a cid not pruned yet but more than --retention-cids behind the head
    was written over a live hold of the name, expired at once by the same commit's
    pruning (the hold destroyed), and answered "pruned through cid 0"."""
    unreachable_hook = f"http://127.0.0.1:{free_port()}/hook"  # its watermark pins pruning
    pinned = Node(
        tmp_path / "pinned", "--retention-cids", "20", "--cdc-config", unreachable_hook
    ).start()
    try:
        with pinned.client() as c:
            pinned.execute(c, ["CREATE TABLE t (id INTEGER PRIMARY KEY)"])
            for i in range(30):
                pinned.execute(c, [["INSERT INTO t VALUES(?)", i]])
            live = register(c, "s")
            listed = c.get("/cdc/subscriptions").json()
            assert listed["pruned_cid"] == 0 and holds(c)["s"]["expired"] is False
            r = c.post("/cdc/subscriptions", json={"name": "s", "cid": 5})
            message = error_of(r, 410)
            assert "cannot place the hold of subscriber 's' at cid 5: it is more than " in message
            assert "--retention-cids (20) commits behind the head" in message
            assert c.get("/cdc/subscriptions").json() == listed  # no commit, the hold as it was
            # within the cap it is placed, moved back from the head
            back = head(c) - 20
            r = c.post("/cdc/subscriptions", json={"name": "s", "cid": back})
            assert r.status_code == 200, r.text
            assert holds(c)["s"] == {"name": "s", "cid": back, "expired": False}
            assert back < live
    finally:
        pinned.stop()


def test_retention_cap_without_holds_keeps_the_newest_commits(small_cap_node: Node) -> None:
    with small_cap_node.client() as c:
        small_cap_node.execute(c, ["CREATE TABLE cap (id INTEGER PRIMARY KEY)"])
        for i in range(40):
            small_cap_node.execute(c, [["INSERT INTO cap VALUES(?)", i]])
        last_write = head(c)
        assert c.get("/cdc/subscriptions").json()["retention_cids"] == 20
        # nothing prunes but the leader's RetentionKeeper: wait for it
        doc = _wait_for(
            lambda: (d := c.get("/cdc/subscriptions").json())["pruned_cid"] > 0 and d,
            "the retention keeper to prune",
        )
        last, pruned = doc["last_cid"], doc["pruned_cid"]
        # the keeper's own entry is one commit: it pruned to (head before it) - 20
        assert last - 21 <= pruned <= last - 20
        kept = changes(c, "cap", after=pruned)
        assert kept.column("_litecdc_cid").to_pylist() == list(range(pruned + 1, last_write + 1))
        msg = error_of(c.get("/cdc/tables/cap/changes", params={"after": pruned - 1}), 410)
        assert "no longer available" in msg and f"through cid {pruned}" in msg


def test_hold_past_the_cap_expires_and_must_reregister(small_cap_node: Node) -> None:
    with small_cap_node.client() as c:
        small_cap_node.execute(c, ["CREATE TABLE exp (id INTEGER PRIMARY KEY)"])
        cid = register(c, "slow")
        for i in range(30):
            small_cap_node.execute(c, [["INSERT INTO exp VALUES(?)", i]])
        _wait_for(lambda: holds(c)["slow"]["expired"], "the hold to expire")
        msg = error_of(c.post("/cdc/subscriptions/slow/progress", json={"cid": cid + 1}), 410)
        assert "register again" in msg
        assert holds(c)["slow"]["expired"] is True  # still listed, as expired
        error_of(c.get("/cdc/tables/exp/changes", params={"after": cid}), 410)
        # re-registering revives it at the head
        again = register(c, "slow")
        assert holds(c)["slow"]["expired"] is False
        small_cap_node.execute(c, [["INSERT INTO exp VALUES(?)", 999]])
        assert changes(c, "exp", after=again).column("id").to_pylist() == [999]
        r = c.post("/cdc/subscriptions/slow/progress", json={"cid": again})
        assert r.status_code == 200, r.text
        release(c, "slow")


# -- table descriptions ----------------------------------------------------------------
def test_table_descriptions(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE d_ipk (id INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "n REAL DEFAULT 1.5, s TEXT DEFAULT 'it''s')",
            "CREATE TABLE d_comp (region TEXT, n INT, payload BLOB, PRIMARY KEY (region, n))"
            " WITHOUT ROWID",
            "CREATE TABLE d_nokey (a, b TEXT)",
            "CREATE TABLE d_types (id INTEGER PRIMARY KEY AUTOINCREMENT, r REAL, "
            "d DOUBLE PRECISION, f FLOAT, num NUMERIC, dec DECIMAL(10,2), b BOOLEAN, dt DATE, "
            "ts DATETIME, vc VARCHAR(20), cl CLOB, bl BLOB, u, bi BIGINT)",
            "CREATE VIEW d_view AS SELECT * FROM d_ipk",
            "INSERT INTO d_nokey VALUES (1, 'x'), (2, 'y')",
        ],
    )
    tables = c.get("/cdc/tables").json()["tables"]
    assert {"d_ipk", "d_comp", "d_nokey", "d_types"} <= set(tables)
    assert tables == sorted(tables)
    assert "d_view" not in tables
    assert not [t for t in tables if t.startswith(("_litecdc_", "sqlite_"))]

    def describe(t: str) -> dict[str, Any]:
        assert "rows" not in c.get(f"/cdc/tables/{t}").json()  # counting only when asked
        r = c.get(f"/cdc/tables/{t}", params={"count": "true"})
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        assert doc["table"] == t
        assert doc["last_cid"] == head(c)
        return doc

    def arrows(doc: dict[str, Any]) -> dict[str, str]:
        return {col["name"]: col["arrow"] for col in doc["columns"]}

    def columns(doc: dict[str, Any]) -> list[dict[str, Any]]:
        """What the description says of each column (fields added later are not checked)."""
        fields = ("name", "declared_type", "arrow", "not_null", "default")
        return [{f: col[f] for f in fields} for col in doc["columns"]]

    ipk = describe("d_ipk")
    assert ipk["key"] == ["id"]
    assert ipk["rows"] == 0
    assert columns(ipk) == [
        {
            "name": "id",
            "declared_type": "INTEGER",
            "arrow": "int64",
            "not_null": False,
            "default": None,
        },
        {
            "name": "name",
            "declared_type": "TEXT",
            "arrow": "string",
            "not_null": True,
            "default": None,
        },
        {
            "name": "n",
            "declared_type": "REAL",
            "arrow": "float64",
            "not_null": False,
            "default": "1.5",
        },
        {
            "name": "s",
            "declared_type": "TEXT",
            "arrow": "string",
            "not_null": False,
            "default": "'it''s'",
        },
    ]

    comp = describe("d_comp")
    assert comp["key"] == ["region", "n"]
    assert arrows(comp) == {"region": "string", "n": "int64", "payload": "binary"}

    nokey = describe("d_nokey")
    assert nokey["key"] == [ROWID]
    assert nokey["rows"] == 2
    assert columns(nokey)[0] == {
        "name": ROWID,
        "declared_type": "INTEGER",
        "arrow": "int64",
        "not_null": True,
        "default": None,
    }
    assert arrows(nokey) == {ROWID: "int64", "a": "string", "b": "string"}

    types = describe("d_types")
    assert types["key"] == ["id"]
    assert arrows(types) == {
        "id": "int64",
        "r": "float64",
        "d": "float64",
        "f": "float64",
        "num": "float64",
        "dec": "float64",
        "b": "int64",
        "dt": "string",
        "ts": "string",
        "vc": "string",
        "cl": "string",
        "bl": "binary",
        "u": "string",
        "bi": "int64",
    }
    assert {col["name"]: col["declared_type"] for col in types["columns"]}["dec"] == "DECIMAL(10,2)"
    # a view, litecdc's and SQLite's own tables are not sources
    for t in (
        "d_view",
        "_litecdc_journal",
        "_litecdc_changes",
        "_litecdc_reshapes",
        "_litecdc_unlogged",
        "sqlite_sequence",
        "sqlite_schema",
    ):
        assert "no table" in error_of(c.get(f"/cdc/tables/{t}"), 404), t


def test_description_says_when_the_table_was_last_reshaped(
    node: Node, client: httpx.Client
) -> None:
    """``reshaped_cid``: the commit that created the table (again), or last changed it other
    than by adding a column. A copy of the table from before it misses what that did —
    DROP TABLE and DROP COLUMN fire no row changes — so the pipeline copies it again."""
    c = client

    def commit(*sql: str, transaction: bool = False) -> int:
        return commit_all(node, c, *sql, transaction=transaction)

    def reshaped(table: str) -> int:
        return described(c, table, "reshaped_cid")

    created = commit("CREATE TABLE rs_t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)")
    assert reshaped("rs_t") == created
    # what keeps every row as it was: writes, ADD COLUMN (a column at the end), other DDL
    for sql in (
        "INSERT INTO rs_t VALUES(1, 'one', 1), (2, 'two', 2)",
        "UPDATE rs_t SET a = 'uno' WHERE id = 1",
        "ALTER TABLE rs_t ADD COLUMN c REAL DEFAULT 1.5",
        "CREATE INDEX rs_t_a ON rs_t(a)",
        "CREATE TABLE IF NOT EXISTS rs_t(x)",  # exists: creates nothing
        "CREATE VIEW rs_v AS SELECT * FROM rs_t",
        "CREATE TRIGGER rs_tr AFTER INSERT ON rs_t BEGIN SELECT 1; END",
        "CREATE TABLE rs_other(x)",
        "DROP INDEX rs_t_a",
        "DROP VIEW rs_v",
    ):
        commit(sql)
        assert reshaped("rs_t") == created, sql
    # what does not
    for sql in (
        "ALTER TABLE rs_t DROP COLUMN c",
        "ALTER TABLE rs_t RENAME COLUMN b TO bb",
        "ALTER TABLE rs_t RENAME COLUMN bb TO b",
    ):
        cid = commit(sql)
        assert reshaped("rs_t") == cid, sql
    # dropped and created again with the same columns, in one request: the same description
    before = c.get("/cdc/tables/rs_t").json()
    again = commit(
        "DROP TABLE rs_t", "CREATE TABLE rs_t(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"
    )
    after = c.get("/cdc/tables/rs_t").json()
    assert after["columns"] == before["columns"] and after["reshaped_cid"] == again
    # the last column dropped and added again with its type, in one transaction
    dropped_added = commit(
        "ALTER TABLE rs_t DROP COLUMN b", "ALTER TABLE rs_t ADD COLUMN b INTEGER", transaction=True
    )
    assert c.get("/cdc/tables/rs_t").json()["columns"] == before["columns"]
    assert reshaped("rs_t") == dropped_added
    # renamed: the name it takes is reshaped (its rows came without row changes), the old
    # one is gone; a table renamed into a dropped table's name too
    renamed = commit("ALTER TABLE rs_other RENAME TO rs_moved")
    assert reshaped("rs_moved") == renamed
    assert "no table" in error_of(c.get("/cdc/tables/rs_other"), 404)
    swapped = commit("DROP TABLE rs_t", "ALTER TABLE rs_moved RENAME TO rs_t")
    assert reshaped("rs_t") == swapped
    # a name's case does not make another table (SQLite's names ignore ASCII case)
    cased = commit("DROP TABLE rs_t", "CREATE TABLE RS_T(x)")
    assert reshaped("rs_t") == reshaped("RS_T") == cased
    # a statement that failed reshaped nothing
    r = c.post("/db/execute", json=["DROP TABLE RS_T", "INSERT INTO nope VALUES(1)"],
               params={"transaction": ""})  # fmt: skip
    assert "error" in r.json()["results"][-1]
    assert reshaped("RS_T") == cased
    # litecdc's record of it is internal: clients cannot write it
    refused = node.execute(c, ["DELETE FROM _litecdc_reshapes"])["results"][0]
    assert "internal to litecdc" in refused["error"]


def test_changes_from_before_a_reshape_are_refused_not_shown_in_todays_columns(
    node: Node, client: httpx.Client
) -> None:
    """Schema QA: a table's changes were served under its columns of today, by name: after
    a RENAME COLUMN the renamed column came back NULL in older events, after a DROP and ADD
    of a column the old values stood in the new one, a re-created table's events were the
    old table's. Changes that reach back before the table's last reshape are refused,
    saying from where they can be read."""
    c = client
    node.execute(c, ["CREATE TABLE q7r(id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"])
    start = head(c)
    node.execute(c, ["INSERT INTO q7r VALUES(1, 'x', 1)", "UPDATE q7r SET a = 'y'"])
    node.execute(c, ["ALTER TABLE q7r RENAME COLUMN a TO aa"])
    reshaped = head(c)
    node.execute(c, ["UPDATE q7r SET aa = 'z'"])
    r = c.get("/cdc/tables/q7r/changes", params={"after": start, "format": "json"})
    assert r.status_code == 409, r.text
    assert r.json()["error"] == (
        f"table q7r was reshaped at cid {reshaped} (created again, renamed to its name, or "
        f"changed other than by adding a column): its changes before that, from cid "
        f"{start + 1} on, have another shape than its description; read its changes after "
        f"cid {reshaped}, from a copy of the table made since"
    )
    # (the RENAME COLUMN itself changed the rows without events: after it, not before)
    r = c.get("/cdc/tables/q7r/changes", params={"after": reshaped, "format": "json"})
    assert r.status_code == 200, r.text
    assert [row[3:] for row in r.json()["rows"]] == [[1, "z", 1]]
    # the events before it, as they were, stay in the raw change log
    raw = c.get("/cdc/changes", params={"after": start, "limit": 2}).json()["changes"]
    assert [ch["after"] for ch in raw] == [{"id": 1, "a": "x", "b": 1}, {"id": 1, "a": "y", "b": 1}]


def test_changes_across_rows_changed_without_events_are_refused(
    node: Node, client: httpx.Client
) -> None:
    """Data-source QA: a changes read across a DROP TABLE and CREATE of the same name, with
    no events of the table between, served only the new table's inserts — the old rows
    were never deleted. Likewise CREATE … AS SELECT and RENAME TO (rows came without
    events) and ADD COLUMN … DEFAULT (every row gained a value). The node records the last
    such commit per name (``unlogged_cid``, kept for a dropped name) and refuses a changes
    read across it; DDL that leaves the rows as the events tell them is not one."""
    c = client

    def commit(*sql: str) -> int:
        return commit_all(node, c, *sql)

    def unlogged(table: str) -> int:
        return described(c, table, "unlogged_cid")

    def changes(table: str, after: int, until: int | None = None) -> httpx.Response:
        params = {"after": after, "format": "json"} | ({"until": until} if until else {})
        return c.get(f"/cdc/tables/{table}/changes", params=params)

    def refusal(table: str, at: int, after: int) -> str:
        # (nothing to read before it when after is at - 1: QA, it said "up to cid after")
        before = f"read them up to cid {at - 1} at most, and " if after < at - 1 else ""
        return (
            f"table {table}: commit {at} changed the rows under this name without change "
            "events (the table dropped or renamed, created from a query or renamed to this "
            "name, a column dropped or renamed, or a column with a DEFAULT added: its "
            f"journal entry, GET /journal?after={at - 1}&limit=1, says which): its changes "
            f"after cid {after} cannot bring a copy past it; {before}take a new copy of the "
            f"table (a snapshot) at cid {at} or later"
        )

    # what leaves every row as its events tell: DDL on an empty table, ADD COLUMN without
    # a default (or DEFAULT NULL), indexes, CREATE TABLE IF NOT EXISTS of one that is there
    created = commit("CREATE TABLE uq(id INTEGER PRIMARY KEY, a TEXT)")
    commit("ALTER TABLE uq ADD COLUMN early TEXT DEFAULT 'e'")  # (no rows yet)
    commit("INSERT INTO uq(id, a) VALUES(1, 'one'), (2, 'two')")
    for sql in (
        "ALTER TABLE uq ADD COLUMN b INTEGER",
        "ALTER TABLE uq ADD COLUMN c TEXT DEFAULT NULL",
        "ALTER TABLE uq ADD COLUMN c2 TEXT DEFAULT ((null))",
        "CREATE INDEX uq_a ON uq(a)",
        "CREATE TABLE IF NOT EXISTS uq(x)",
        "UPDATE uq SET b = 5 WHERE id = 2",
    ):
        commit(sql)
        assert unlogged("uq") == 0, sql
    assert changes("uq", created - 1).status_code == 200
    start = head(c)

    # dropped with its rows and created again (two commits): no event between tells of it
    dropped = commit("DROP TABLE uq")
    assert error_of(c.get("/cdc/tables/UQ"), 404) == (
        f"no table 'UQ' in this database (a table of that name was dropped or renamed at cid "
        f"{dropped})"
    )
    recreated = commit("CREATE TABLE uq(id INTEGER PRIMARY KEY, a TEXT)")
    inserted = commit("INSERT INTO uq VALUES(7, 'seven')")
    assert unlogged("uq") == dropped  # (the dropped name's record was kept)
    for until in (None, dropped, inserted):
        assert error_of(changes("uq", start, until), 409) == refusal("uq", dropped, start)
    r = c.get("/cdc/tables/uq/position", params={"after": start})
    assert r.status_code == 200 and r.json()["unlogged_cid"] == dropped, r.text
    assert changes("uq", start, dropped - 1).status_code == 200  # up to it: fine
    r = changes("uq", dropped)
    assert r.status_code == 200 and [row[3:] for row in r.json()["rows"]] == [[7, "seven"]]
    assert recreated > dropped

    # ADD COLUMN with a default on a table with rows; CREATE … AS SELECT; RENAME TO (the
    # name it left and the one it took)
    defaulted = commit("ALTER TABLE uq ADD COLUMN d TEXT DEFAULT 'dflt'")
    assert unlogged("uq") == defaulted
    assert error_of(changes("uq", inserted), 409) == refusal("uq", defaulted, inserted)
    selected = commit("CREATE TABLE uq_copy AS SELECT * FROM uq")
    assert unlogged("uq_copy") == selected
    for after in (selected - 1, selected - 2):
        assert error_of(changes("uq_copy", after), 409) == refusal("uq_copy", selected, after)
    renamed = commit("ALTER TABLE uq_copy RENAME TO uq_moved")
    assert unlogged("uq_moved") == renamed
    commit("CREATE TABLE uq_copy(x)")
    assert unlogged("uq_copy") == renamed
    assert changes("uq_moved", renamed).status_code == 200
    # every such commit is kept, not only the last (pipeline QA: a read across the first
    # of two was served); the position gives the first after its cid, to end a batch before
    more = commit("INSERT INTO uq_moved(id, a) VALUES(8, 'eight')")
    again = commit("ALTER TABLE uq_moved ADD COLUMN e TEXT DEFAULT 'e'")
    assert unlogged("uq_moved") == again
    assert error_of(changes("uq_moved", renamed - 1, more), 409) == refusal(
        "uq_moved", renamed, renamed - 1
    )
    for after, first in ((renamed - 1, renamed), (renamed, again), (again, 0)):
        r = c.get("/cdc/tables/uq_moved/position", params={"after": after})
        assert r.status_code == 200 and r.json()["unlogged_cid"] == first, (after, r.text)
    assert changes("uq_moved", renamed, more).status_code == 200
    # a failed statement records nothing; the record is internal, clients cannot write it
    r = c.post("/db/execute", json=["DROP TABLE uq", "INSERT INTO nope VALUES(1)"],
               params={"transaction": ""})  # fmt: skip
    assert "error" in r.json()["results"][-1]
    assert unlogged("uq") == defaulted
    refused = node.execute(c, ["DELETE FROM _litecdc_unlogged"])["results"][0]
    assert "internal to litecdc" in refused["error"]


# -- snapshot rows ---------------------------------------------------------------------
SUBNORMAL = 5e-324
VALUES: list[list[Any]] = [
    # id, r REAL, i INTEGER, t TEXT, b BLOB, u (untyped), n NUMERIC, flag BOOLEAN, day DATE
    [1, -0.0, 2**62, "héllo 😀 中文", b"\x00\xff\x00", -0.0, 1.5, 1, "2024-02-29"],
    [2, 1e308, -(2**63), "", b"", 1e308, 2, 0, None],
    [3, SUBNORMAL, 2**63 - 1, "a\x00b", bytes(range(256)), 2**62, None, None, "2024-01-01"],
    [4, None, None, None, None, None, -2.5e-10, 1, None],
    [5, 0.1, -1, "'; DROP TABLE x; --", b"'", "text", 7, 0, "1999-12-31 23:59:59"],
]


def test_rows_as_arrow_keep_values_exactly(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE vals (id INTEGER PRIMARY KEY, r REAL, i INTEGER, t TEXT, b BLOB, u, "
            "n NUMERIC, flag BOOLEAN, day DATE)",
            *[
                [
                    "INSERT INTO vals VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    *[list(v) if isinstance(v, bytes) else v for v in row],
                ]
                for row in VALUES
            ],
        ],
    )
    # blobs went in as arrays of byte values: check the database holds real blobs
    stored = node.query(c, "SELECT typeof(b), length(b) FROM vals ORDER BY id")
    assert stored["results"][0]["values"][2] == ["blob", 256], stored
    table = arrow(c.get("/cdc/tables/vals/rows", params={"format": "arrow"}))
    at = head(c)
    assert table.schema.names == ["id", "r", "i", "t", "b", "u", "n", "flag", "day", "_litecdc_cid"]
    assert [str(f.type) for f in table.schema] == [
        "int64", "double", "int64", "string", "binary", "string", "double", "int64", "string",
        "int64",
    ]  # fmt: skip
    m = meta(table)
    assert m == {"litecdc.cid": str(at), "litecdc.last_key": "[5]", "litecdc.done": "true"}
    assert table.column("_litecdc_cid").to_pylist() == [at] * 5
    got = table.to_pylist()

    # REAL: bit-exact, as SQLite stores them (SQLite itself keeps a REAL column's -0.0 as 0.0:
    # the mirror must agree with the database, bit for bit)
    db = node.query(c, "SELECT r FROM vals ORDER BY id")["results"][0]["values"]
    assert [bits(g["r"]) for g in got] == [bits(v[0]) for v in db]
    assert [bits(g["r"]) for g in got][1:] == [bits(1e308), bits(SUBNORMAL), None, bits(0.1)]
    assert got[2]["r"] == SUBNORMAL and got[2]["r"] != 0.0
    assert [g["i"] for g in got] == [2**62, -(2**63), 2**63 - 1, None, -1]
    assert [g["t"] for g in got] == [row[3] for row in VALUES]
    assert [g["b"] for g in got] == [row[4] for row in VALUES]
    # untyped: any value, as text (numbers written out exactly, -0.0 keeps its sign)
    assert [g["u"] for g in got] == ["-0.0", "1e+308", str(2**62), None, "text"]
    assert float(got[0]["u"]) == 0.0 and str(float(got[0]["u"])) == "-0.0"
    # NUMERIC → float64 (integers become floats), BOOLEAN → int64, DATE → text
    assert [bits(g["n"]) for g in got] == [bits(1.5), bits(2.0), None, bits(-2.5e-10), bits(7.0)]
    assert [g["flag"] for g in got] == [1, 0, None, 1, 0]
    assert [g["day"] for g in got] == [row[8] for row in VALUES]

    # the JSON format carries the same rows (blobs as base64)
    doc = c.get("/cdc/tables/vals/rows").json()
    assert doc["cid"] == at and doc["last_key"] == [5] and doc["done"] is True
    assert doc["columns"] == table.schema.names
    assert [r[0] for r in doc["rows"]] == [1, 2, 3, 4, 5]
    assert doc["rows"][2][4] == base64.b64encode(bytes(range(256))).decode()
    assert doc["rows"][0][2] == 2**62


def test_keyset_paging_covers_10k_rows_exactly_once(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE big (id INTEGER PRIMARY KEY, v TEXT)",
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10000) "
            "INSERT INTO big SELECT x * 7 - (x % 3), 'v' || x FROM n",
        ],
    )
    expected = node.query(c, "SELECT id, v FROM big ORDER BY id")["results"][0]["values"]
    assert len(expected) == 10_000
    rows, pages = all_rows(c, "big", 1000)
    assert pages == 11  # 10 full pages, then an empty one that says done
    assert [[r["id"], r["v"]] for r in rows] == expected

    # the last (empty) page: done, no last key
    last_id = expected[-1][0]
    page = arrow(
        c.get(
            "/cdc/tables/big/rows", params={"format": "arrow", "after_key": json.dumps([last_id])}
        )
    )
    assert page.num_rows == 0
    assert meta(page)["litecdc.last_key"] == "null"
    assert meta(page)["litecdc.done"] == "true"

    # until_key bounds a range: after_key < key <= until_key
    lo, hi = expected[100][0], expected[250][0]
    r = c.get("/cdc/tables/big/rows", params={"after_key": f"[{lo}]", "until_key": f"[{hi}]"})
    assert r.status_code == 200, r.text
    assert [row[0] for row in r.json()["rows"]] == [e[0] for e in expected[101:251]]


def test_blob_and_composite_keys_round_trip_through_last_key(
    node: Node, client: httpx.Client
) -> None:
    c = client
    keys = [b"", b"\x00", b"\x00\x00", b"\x00\x01", b"\x7f", b"\x80", b"\xff", b"\xff\xff", b"a"]
    node.execute(
        c,
        [
            "CREATE TABLE bk (k BLOB PRIMARY KEY, v INTEGER) WITHOUT ROWID",
            *[["INSERT INTO bk VALUES(?, ?)", list(k), i] for i, k in enumerate(keys)],
            "CREATE TABLE ck (region TEXT, n INT, v TEXT, PRIMARY KEY (region, n)) WITHOUT ROWID",
            "INSERT INTO ck VALUES ('b', 2, 'x'), ('a', 10, 'y'), ('a', 9, 'z'), ('é', -1, 'w'),"
            " ('a', -5, 'q'), ('', 0, 'e')",
        ],
    )
    rows, _ = all_rows(c, "bk", 1)
    assert [r["k"] for r in rows] == sorted(keys)  # memcmp order, each exactly once
    first = arrow(c.get("/cdc/tables/bk/rows", params={"format": "arrow", "limit": 2}))
    assert json.loads(meta(first)["litecdc.last_key"]) == [
        {"base64": base64.b64encode(b"\x00").decode()}
    ]

    rows, _ = all_rows(c, "ck", 1)
    assert [(r["region"], r["n"]) for r in rows] == [
        ("", 0), ("a", -5), ("a", 9), ("a", 10), ("b", 2), ("é", -1)
    ]  # fmt: skip
    r = c.get("/cdc/tables/ck/rows", params={"after_key": '["a", 9]', "until_key": '["b", 2]'})
    assert [row[:2] for row in r.json()["rows"]] == [["a", 10], ["b", 2]]


def test_splits_partition_the_table(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE sp (id INTEGER PRIMARY KEY, v)",
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 4001) "
            "INSERT INTO sp SELECT x * x, x FROM n",
            "CREATE TABLE sp_small (a TEXT, b INT, PRIMARY KEY (a, b)) WITHOUT ROWID",
            "INSERT INTO sp_small VALUES ('x', 1), ('x', 2), ('y', 0)",
            "CREATE TABLE sp_empty (id INTEGER PRIMARY KEY)",
        ],
    )

    def ranges(table: str, partitions: int) -> list[list[Any]]:
        r = c.get(f"/cdc/tables/{table}/splits", params={"partitions": partitions})
        assert r.status_code == 200, r.text
        assert r.json()["cid"] == head(c)
        cuts: list[Any] = r.json()["splits"]
        bounds: list[Any] = [None, *cuts, None]
        out = []
        for lo, hi in itertools.pairwise(bounds):
            params: dict[str, Any] = {"limit": 1_000_000}
            if lo is not None:
                params["after_key"] = json.dumps(lo)
            if hi is not None:
                params["until_key"] = json.dumps(hi)
            page = c.get(f"/cdc/tables/{table}/rows", params=params)
            assert page.status_code == 200, page.text
            out.append(page.json()["rows"])
        return out

    parts = ranges("sp", 4)
    assert len(parts) == 4
    ids = [row[0] for part in parts for row in part]
    assert ids == [x * x for x in range(1, 4002)]  # every row once, in order
    assert all(900 <= len(p) <= 1100 for p in parts), [len(p) for p in parts]

    small = ranges("sp_small", 10)  # more partitions than rows: still a partition
    assert [tuple(row[:2]) for part in small for row in part] == [("x", 1), ("x", 2), ("y", 0)]
    assert c.get("/cdc/tables/sp/splits", params={"partitions": 1}).json()["splits"] == []
    assert c.get("/cdc/tables/sp_empty/splits", params={"partitions": 4}).json()["splits"] == []
    assert c.get("/cdc/tables/sp/splits").json()["splits"]  # default: 2 partitions


def _pages_and_splits(
    c: httpx.Client, table: str, order_by: str, columns: str, key: list[str]
) -> None:
    """Paging (several page sizes, Arrow and JSON) and split ranges give every row of
    ``table`` exactly once, in SQLite's ``ORDER BY order_by``; no page ends inside a run of
    rows sharing a key (NULLs), so paging by last key skips none of them."""
    r = c.get("/db/query", params={"q": f"SELECT {columns} FROM {table} ORDER BY {order_by}"})
    assert r.status_code == 200, r.text
    expected = [tuple(v) for v in r.json()["results"][0].get("values", [])]
    names = [n.strip() for n in columns.split(",")]

    def read(lo: Any, hi: Any, limit: int, fmt: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        after = lo
        for _ in range(10_000):
            params: dict[str, Any] = {"limit": limit, "format": fmt}
            if after is not None:
                params["after_key"] = json.dumps(after)
            if hi is not None:
                params["until_key"] = json.dumps(hi)
            got = c.get(f"/cdc/tables/{table}/rows", params=params)
            if fmt == "arrow":
                page = arrow(got)
                batch = [tuple(row[n] for n in names) for row in page.to_pylist()]
                done, last = meta(page)["litecdc.done"] == "true", meta(page)["litecdc.last_key"]
                last = json.loads(last)
            else:
                assert got.status_code == 200, got.text
                doc = got.json()
                index = [doc["columns"].index(n) for n in names]
                batch = [tuple(row[i] for i in index) for row in doc["rows"]]
                done, last = doc["done"], doc["last_key"]
            if batch:  # the last key is the last row's, as stored
                assert last == [batch[-1][names.index(k)] for k in key], (last, batch[-1])
            rows += batch
            if done:
                return rows
            after = last
        raise AssertionError("paging did not end")

    for fmt in ("arrow", "json"):
        for limit in (1, 2, 3, 1000):
            assert read(None, None, limit, fmt) == expected, (fmt, limit)
    for partitions in (2, 3, 5):
        doc = c.get(f"/cdc/tables/{table}/splits", params={"partitions": partitions}).json()
        bounds = [None, *doc["splits"], None]
        got = [row for lo, hi in itertools.pairwise(bounds) for row in read(lo, hi, 2, "arrow")]
        assert got == expected, (partitions, doc["splits"])


def test_keys_follow_sqlite_order_collations_and_types(node: Node, client: httpx.Client) -> None:
    """The node compares keys, as SQLite does: a NOCASE or RTRIM key, an untyped key with
    integers, reals and text (mirrored as text, but paged by the values stored: in
    SQLite every number sorts before any text), a composite key with a collation."""
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE k_ci (k TEXT COLLATE NOCASE PRIMARY KEY, v INTEGER)",
            *[["INSERT INTO k_ci VALUES(?, ?)", k, i] for i, k in enumerate("abcDefgHiJ")],
            "CREATE TABLE k_rt (k TEXT COLLATE RTRIM PRIMARY KEY, v INTEGER) WITHOUT ROWID",
            *[["INSERT INTO k_rt VALUES(?, ?)", k, i]
              for i, k in enumerate(["b  ", "a", "a b", "B", "c ", "ab"])],
            "CREATE TABLE k_mixed (k PRIMARY KEY, v TEXT)",
            *[["INSERT INTO k_mixed VALUES(?, 'x')", k]
              for k in [1, 2, 10, 3, 2.5, -7, 1e300, "a", "B", "10x", "", "Z"]],
            "CREATE TABLE k_comp (a TEXT COLLATE NOCASE, b INTEGER, v INTEGER, PRIMARY KEY (a, b))"
            " WITHOUT ROWID",
            *[["INSERT INTO k_comp VALUES(?, ?, ?)", a, b, i]
              for i, (a, b) in enumerate([("x", 2), ("X", 3), ("y", 1), ("Y", 0), ("a", 10),
                                          ("B", -1)])],
        ],
    )  # fmt: skip
    _pages_and_splits(c, "k_ci", "k", "k, v", ["k"])
    _pages_and_splits(c, "k_rt", "k", "k, v", ["k"])
    _pages_and_splits(c, "k_comp", "a, b", "a, b, v", ["a", "b"])
    # an untyped column is mirrored as text: compare the keys the node sends
    order = [-7, 1, 2, 2.5, 3, 10, 1e300, "", "10x", "B", "Z", "a"]  # numbers, then text
    for fmt in ("arrow", "json"):
        keys, after = [], None
        for _ in order:
            params: dict[str, Any] = {"limit": 1, "format": fmt}
            if after is not None:
                params["after_key"] = json.dumps(after)
            r = c.get("/cdc/tables/k_mixed/rows", params=params)
            after = json.loads(meta(arrow(r))["litecdc.last_key"]) if fmt == "arrow" else (
                r.json()["last_key"]
            )  # fmt: skip
            keys += after
        assert keys == order, (fmt, keys)
    doc = c.get("/cdc/tables/k_mixed/splits", params={"partitions": 4}).json()
    assert doc["splits"] == [[2], [10], ["10x"]], doc
    rows = c.get("/cdc/tables/k_mixed/rows", params={"after_key": "[2]", "until_key": "[10]"})
    assert [row[0] for row in rows.json()["rows"]] == ["2.5", "3", "10"]  # mirrored as text


def test_null_keys_are_paged_and_split_first_each_row_once(
    node: Node, client: httpx.Client
) -> None:
    """SQLite lets a rowid table's PRIMARY KEY other than INTEGER PRIMARY KEY hold NULLs,
    several rows of them: they sort first, and ranges and pages keep every row (before,
    the split key [null] made ranges that matched nothing, and paging after a NULL key
    skipped the other rows of it)."""
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE n_one (k TEXT PRIMARY KEY, v TEXT)",
            "INSERT INTO n_one VALUES (NULL, 'a'), (NULL, 'b'), ('x', 'c'), (NULL, 'd'),"
            " ('y', 'e'), ('w', 'f')",
            "CREATE TABLE n_two (a TEXT, b INTEGER, v INTEGER, PRIMARY KEY (a, b))",
            *[
                ["INSERT INTO n_two VALUES(?, ?, ?)", a, b, i]
                for i, (a, b) in enumerate(
                    [(None, None), ("x", None), (None, 1), ("x", 1), (None, None), ("x", None),
                     ("y", 2), (None, 1), ("x", 2), ("y", None), (None, 3), ("X", None)]
                )
            ],
        ],
    )  # fmt: skip
    _pages_and_splits(c, "n_one", "k, rowid", "k, v", ["k"])
    _pages_and_splits(c, "n_two", "a, b, rowid", "a, b, v", ["a", "b"])
    # the three rows of key [null] are on one page, whatever the limit
    page = c.get("/cdc/tables/n_one/rows", params={"limit": 1}).json()
    assert [row[1] for row in page["rows"]] == ["a", "b", "d"], page
    assert page["last_key"] == [None] and page["done"] is False
    page = c.get("/cdc/tables/n_one/rows", params={"after_key": "[null]"}).json()
    assert [row[0] for row in page["rows"]] == ["w", "x", "y"], page
    splits = c.get("/cdc/tables/n_one/splits", params={"partitions": 3}).json()["splits"]
    assert splits[0] == [None], splits


# -- changes ---------------------------------------------------------------------------
def test_changes_insert_update_delete_and_key_change(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE chg (id INTEGER PRIMARY KEY, v TEXT, f REAL)",
            "CREATE TABLE chg_nokey (a TEXT)",
            "CREATE TABLE chg_comp (r TEXT, n INT, v, PRIMARY KEY (r, n)) WITHOUT ROWID",
        ],
    )
    with subscriber(c, "chg-sub") as after:
        cids = []
        for stmts in (
            [["INSERT INTO chg VALUES(1, 'a', ?)", -0.5], "INSERT INTO chg VALUES(2, 'b', NULL)"],
            ["UPDATE chg SET v = 'a2' WHERE id = 1"],
            ["DELETE FROM chg WHERE id = 2"],
            ["UPDATE chg SET id = 5 WHERE id = 1"],
        ):
            node.execute(c, stmts)
            cids.append(head(c))
        got = changes(c, "chg", after=after)
        assert got.schema.names == [*META, "id", "v", "f"]
        assert events(got) == [
            (cids[0], 1, "upsert", 1, "a", -0.5),
            (cids[0], 2, "upsert", 2, "b", None),
            (cids[1], 1, "upsert", 1, "a2", -0.5),
            (cids[2], 1, "delete", 2, "b", None),  # a delete carries the row before
            (cids[3], 1, "delete", 1, "a2", -0.5),  # a key change: delete the old key…
            (cids[3], 1, "upsert", 5, "a2", -0.5),  # …then upsert the new one, same cid/seq
        ]
        assert meta(got) == {"litecdc.end_cid": str(cids[3]), "litecdc.last_cid": str(cids[3])}
        doc = c.get("/cdc/tables/chg/changes", params={"after": after}).json()
        assert doc["columns"] == got.schema.names
        assert [tuple(r) for r in doc["rows"]] == events(got)
        assert doc["end_cid"] == doc["last_cid"] == cids[3]

        # a rowid table without a key: the rowid is the key; changing it moves the row
        node.execute(c, ["INSERT INTO chg_nokey(rowid, a) VALUES (7, 'x')"])
        node.execute(c, ["UPDATE chg_nokey SET rowid = 8 WHERE rowid = 7"])
        node.execute(c, ["UPDATE chg_nokey SET a = 'y'"])
        got = changes(c, "chg_nokey", after=after)
        assert got.schema.names == [*META, ROWID, "a"]
        assert [row[2:] for row in events(got)] == [
            ("upsert", 7, "x"), ("delete", 7, "x"), ("upsert", 8, "x"), ("upsert", 8, "y")
        ]  # fmt: skip

        # a composite key: changing one part is a key change, changing a value is not
        node.execute(c, ["INSERT INTO chg_comp VALUES ('r', 1, 10)"])
        node.execute(c, ["UPDATE chg_comp SET n = 2"])
        node.execute(c, ["UPDATE chg_comp SET v = 'text'"])
        got = changes(c, "chg_comp", after=after)
        assert [row[2:] for row in events(got)] == [
            ("upsert", "r", 1, "10"), ("delete", "r", 1, "10"), ("upsert", "r", 2, "10"),
            ("upsert", "r", 2, "text"),
        ]  # fmt: skip


def test_changes_keep_transactions_whole_and_respect_until_and_table(
    node: Node, client: httpx.Client
) -> None:
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE tx (id INTEGER PRIMARY KEY)",
            "CREATE TABLE tx_other (id INTEGER PRIMARY KEY)",
        ],
    )
    with subscriber(c, "tx-sub") as after:
        sizes = [5, 3, 2, 4]  # each at least the limit of 2 below
        cids = []
        n = 0
        for size in sizes:
            stmts: list[Any] = []
            for _ in range(size):
                n += 1
                stmts.append(["INSERT INTO tx VALUES(?)", n])
                stmts.append(["INSERT INTO tx_other VALUES(?)", n])  # interleaved, filtered out
            node.execute(c, stmts)
            cids.append(head(c))
            node.execute(c, [["INSERT INTO tx_other VALUES(?)", 1000 + n]])  # other table only
        last = head(c)

        def page(after_cid: int, **params: Any) -> pa.Table:
            return changes(c, "tx", after=after_cid, **params)

        # limit 2: each page is one whole transaction (never split, even past the limit)
        pos, seen = after, []
        for size, cid in zip(sizes, cids, strict=True):
            p = page(pos, limit=2)
            assert p.num_rows == size
            assert set(p.column("_litecdc_cid").to_pylist()) == {cid}
            assert p.column("_litecdc_seq").to_pylist() == list(range(1, 2 * size, 2))
            # ends at its transaction, or at the head once nothing is left to read
            assert meta(p)["litecdc.end_cid"] == str(cid if cid != cids[-1] else last)
            assert meta(p)["litecdc.last_cid"] == str(last)
            seen += p.column("id").to_pylist()
            pos = cid
        assert seen == list(range(1, n + 1))
        tail = page(pos, limit=2)  # nothing more for this table: end at the head
        assert tail.num_rows == 0 and meta(tail)["litecdc.end_cid"] == str(last)

        # limit 6: 5 < 6 so the second transaction is added whole (8 events), then stop
        p = page(after, limit=6)
        assert p.num_rows == 8 and meta(p)["litecdc.end_cid"] == str(cids[1])
        # until: only transactions with cid <= until, whatever the limit
        p = page(after, until=cids[2])
        assert p.num_rows == 10 and meta(p)["litecdc.end_cid"] == str(cids[2])
        p = page(cids[0], until=cids[2] - 1)
        assert p.column("_litecdc_cid").to_pylist() == [cids[1]] * 3  # cids[2] - 1 wrote tx_other
        assert meta(p)["litecdc.end_cid"] == str(cids[2] - 1)
        p = page(after, until=last + 1000)  # until past the head: up to the head
        assert p.num_rows == sum(sizes) and meta(p)["litecdc.end_cid"] == str(last)
        p = page(cids[2], until=cids[1])  # until before after: empty, end stays at after
        assert p.num_rows == 0 and meta(p)["litecdc.end_cid"] == str(cids[2])
        # the other table's events are its own
        other = changes(c, "tx_other", after=after)
        assert other.num_rows == sum(sizes) + len(sizes)
        assert set(other.column("id").to_pylist()) == set(range(1, n + 1)) | {
            1000 + i for i in (5, 8, 10, 14)
        }

        # position agrees with changes, and marks the commits it starts after and ends at
        # with the leader's clock and seed (a restored older history's commits of those
        # cids have others: pipeline.server._check_same_history)
        def mark(cid: int) -> str | None:
            entries = c.get("/journal", params={"after": cid - 1, "limit": 1}).json()["entries"]
            found = [e for e in entries if e["cid"] == cid]
            return f"{found[0]['timestamp_ms']}:{found[0]['seed']}" if found else None

        for start in (after, cids[0], cids[1], cids[3], last):
            for max_events in (1, 2, 6, 100):
                r = c.get(
                    "/cdc/tables/tx/position", params={"after": start, "max_events": max_events}
                )
                assert r.status_code == 200, r.text
                p = page(start, limit=max_events)
                end = int(meta(p)["litecdc.end_cid"])
                assert r.json() == {
                    "end_cid": end,
                    "events": p.num_rows,
                    "last_cid": last,
                    "first_cid": p.column("_litecdc_cid")[0].as_py() if p.num_rows else None,
                    "after_mark": mark(start),
                    "end_mark": mark(end),
                    "reshaped_cid": c.get("/cdc/tables/tx").json()["reshaped_cid"],
                    "unlogged_cid": 0,
                }, (start, max_events)


def test_position_counts_key_changes_as_served(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(c, ["CREATE TABLE pk_move (id INTEGER PRIMARY KEY, v TEXT)"])
    with subscriber(c, "pk-move-sub") as after:
        node.execute(c, ["INSERT INTO pk_move VALUES (1, 'a')"])
        node.execute(c, ["UPDATE pk_move SET id = 2"])
        served = changes(c, "pk_move", after=after)
        assert served.num_rows == 3
        r = c.get("/cdc/tables/pk_move/position", params={"after": after})
        assert r.json()["events"] == served.num_rows


def test_a_key_change_python_calls_equal_is_served_as_a_key_change(
    node: Node, client: httpx.Client
) -> None:
    """QA: 1 -> 1.0 and 0.0 -> -0.0 in an untyped key column (mirrored as the text "1",
    "1.0", …) were compared with Python's ==, which calls them equal: served as a plain
    upsert of the new key, the old row stayed at the sink, even after a DELETE."""
    c = client
    node.execute(c, ["CREATE TABLE upk (k PRIMARY KEY, v TEXT)"])
    with subscriber(c, "upk-sub") as after:
        node.execute(c, ["INSERT INTO upk VALUES (1, 'a'), (0.0, 'b')"])
        start = head(c)
        node.execute(c, ["UPDATE upk SET k = 1.0 WHERE k = 1"])
        node.execute(c, ["UPDATE upk SET k = -0.0 WHERE v = 'b'"])
        served = changes(c, "upk", after=start)
        ops, keys = served["_litecdc_op"].to_pylist(), served["k"].to_pylist()
        assert list(zip(ops, keys, strict=True)) == [
            ("delete", "1"),
            ("upsert", "1.0"),
            ("delete", "0.0"),
            ("upsert", "-0.0"),
        ]
        r = c.get("/cdc/tables/upk/position", params={"after": after})
        assert r.json()["events"] == changes(c, "upk", after=after).num_rows == 6


def test_value_not_fitting_its_column_type_is_422(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(c, ["CREATE TABLE bad_type (id INTEGER PRIMARY KEY, n INTEGER, ok TEXT)"])
    with subscriber(c, "bad-type-sub") as after:
        node.execute(c, ["INSERT INTO bad_type VALUES (1, 5, 'x'), (2, 'not a number', 'y')"])
        for path, params in (("rows", {}), ("changes", {"after": after})):
            for fmt in ("arrow", "json"):
                r = c.get(f"/cdc/tables/bad_type/{path}", params={**params, "format": fmt})
                msg = error_of(r, 422)
                assert "table bad_type column n" in msg and "TEXT" in msg and "[2]" in msg, msg
        # the rows before it are still readable
        r = c.get("/cdc/tables/bad_type/rows", params={"limit": 1})
        assert r.status_code == 200 and r.json()["rows"] == [[1, 5, "x", head(c)]]


def test_a_real_in_an_integer_or_boolean_column_is_422_not_cut(
    node: Node, client: httpx.Client
) -> None:
    """QA: SQLite keeps 2.5 as REAL in an INTEGER column (and 0.5 in a BOOLEAN one);
    pyarrow cut it to 2 without a word, in snapshots and changes alike, and keys 1 and
    1.5 of an INT primary key both became 1 (rows lost at the sink). `verify` read the
    source the same way and saw nothing."""
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE cut (id INTEGER PRIMARY KEY, n INTEGER, b BOOLEAN)",
            "CREATE TABLE cutkey (k INT PRIMARY KEY, v) WITHOUT ROWID",
        ],
    )
    with subscriber(c, "cut-sub") as after:
        node.execute(
            c,
            [
                "INSERT INTO cut VALUES (1, 10, 1), (2, 2.5, 0), (3, 3, 0.5)",
                "INSERT INTO cutkey VALUES (1, 'a'), (1.5, 'b')",
            ],
        )
        expected = [
            ("cut", "column n: a REAL value at key [2]", "int64 (declared 'INTEGER')"),
            ("cutkey", "column k: a REAL value at key [1.5]", "int64 (declared 'INT')"),
        ]
        for table, what, mirrored in expected:
            for path, params in (("rows", {}), ("changes", {"after": after})):
                for fmt in ("arrow", "json"):
                    r = c.get(f"/cdc/tables/{table}/{path}", params={**params, "format": fmt})
                    msg = error_of(r, 422)
                    assert f"table {table} {what} does not fit" in msg and mirrored in msg, msg
        node.execute(c, ["UPDATE cut SET n = 2 WHERE id = 2"])
        msg = error_of(c.get("/cdc/tables/cut/rows"), 422)
        assert "table cut column b: a REAL value at key [3]" in msg and "'BOOLEAN'" in msg, msg
        node.execute(c, ["UPDATE cut SET b = 1 WHERE id = 3", "DELETE FROM cutkey WHERE k = 1.5"])
        assert c.get("/cdc/tables/cut/rows").json()["rows"] == [
            [1, 10, 1, head(c)],
            [2, 2, 0, head(c)],
            [3, 3, 1, head(c)],
        ]
        assert c.get("/cdc/tables/cutkey/rows").json()["rows"] == [[1, "a", head(c)]]


def test_changes_go_on_once_a_value_that_does_not_fit_is_fixed_at_the_source(
    node: Node, client: httpx.Client
) -> None:
    """QA: the change log kept the version with the misfit, so its batch was refused on
    every retry after the row was fixed as the error advises: the subscription stayed
    stopped for good. A version the source no longer has is left out now; a delete
    carries null for a misfit (its key is what counts); a delete of a key that never fit
    is left out."""
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE fix (id INTEGER PRIMARY KEY, n INTEGER)",
            "CREATE TABLE fixkey (k INT PRIMARY KEY, v) WITHOUT ROWID",
        ],
    )
    with subscriber(c, "fix-sub") as after:
        node.execute(c, ["INSERT INTO fix VALUES (1, 1), (2, 'abc'), (3, 'def')"])
        node.execute(c, ["INSERT INTO fixkey VALUES (1, 'a'), (1.5, 'b')"])
        for table in ("fix", "fixkey"):
            error_of(c.get(f"/cdc/tables/{table}/changes", params={"after": after}), 422)
        node.execute(c, ["UPDATE fix SET n = 2 WHERE id = 2"])
        msg = error_of(c.get("/cdc/tables/fix/changes", params={"after": after}), 422)
        assert "a TEXT value at key [3]" in msg, msg  # still at the source: still refused
        node.execute(c, ["DELETE FROM fix WHERE id = 3", "DELETE FROM fixkey WHERE k = 1.5"])
        served = changes(c, "fix", after=after)
        got = [served[n].to_pylist() for n in ("_litecdc_op", "id", "n")]
        assert list(zip(*got, strict=True)) == [
            ("upsert", 1, 1),
            ("upsert", 2, 2),
            ("delete", 3, None),
        ]
        served = changes(c, "fixkey", after=after)
        assert served["_litecdc_op"].to_pylist() == ["upsert"]
        assert served["k"].to_pylist() == [1]
        json_page = c.get("/cdc/tables/fix/changes", params={"after": after, "format": "json"})
        assert json_page.status_code == 200, json_page.text


def test_a_strict_tables_any_column_is_mirrored_as_text_like_an_untyped_one(
    node: Node, client: httpx.Client
) -> None:
    """QA: ANY has no affinity in a STRICT table (it keeps 'hello' and 42 as they are) but
    was mirrored as float64, as ANY's NUMERIC affinity in other tables: every sink refused
    the text, and integers would have become floats."""
    c = client
    node.execute(
        c,
        [
            "CREATE TABLE st (id INTEGER PRIMARY KEY, a ANY, n INT) STRICT",
            "CREATE TABLE loose (id INTEGER PRIMARY KEY, a ANY)",
            "INSERT INTO st VALUES (1, 'hello', 1), (2, 42, 2), (3, 1.5, 3)",
            "INSERT INTO loose VALUES (1, 2.5)",
        ],
    )
    kinds = {
        t: {col["name"]: col["arrow"] for col in c.get(f"/cdc/tables/{t}").json()["columns"]}
        for t in ("st", "loose")
    }
    assert kinds == {
        "st": {"id": "int64", "a": "string", "n": "int64"},
        # NUMERIC affinity outside STRICT, but no numeric name: text, as JSON or UUID
        "loose": {"id": "int64", "a": "string"},
    }
    rows = c.get("/cdc/tables/st/rows").json()["rows"]
    assert [row[:3] for row in rows] == [[1, "hello", 1], [2, "42", 2], [3, "1.5", 3]]


def test_blob_in_a_text_column_or_text_in_a_blob_column_is_422(
    node: Node, client: httpx.Client
) -> None:
    """Neither is converted: the bytes of a blob are not text (even when they are UTF-8),
    and text is not its bytes; both sides of `verify` would convert alike, so nothing
    else would notice (before, x'6869' in a TEXT column arrived as "hi")."""
    c = client
    node.execute(c, ["CREATE TABLE bt (id INTEGER PRIMARY KEY, t TEXT, b BLOB, u)"])
    with subscriber(c, "bt-sub"):
        node.execute(c, ["INSERT INTO bt VALUES (1, 'ok', x'00', 'ok')"])
        cases = [
            ("UPDATE bt SET t = x'6869' WHERE id = 1", "column t", "BLOB", "string"),
            ("UPDATE bt SET t = 'ok', b = 'hi' WHERE id = 1", "column b", "TEXT", "binary"),
            ("UPDATE bt SET b = x'00', u = x'6869' WHERE id = 1", "column u", "BLOB", "string"),
        ]
        for sql, column, stored, mirrored in cases:
            before = head(c)
            node.execute(c, [sql])
            for fmt in ("arrow", "json"):
                r = c.get("/cdc/tables/bt/rows", params={"format": fmt})
                msg = error_of(r, 422)
                assert f"table bt {column}:" in msg and f"a {stored} value" in msg, msg
                assert "[1]" in msg and mirrored in msg, msg
            # the change that wrote it, as the last event
            r = c.get("/cdc/tables/bt/changes", params={"after": before, "format": "json"})
            msg = error_of(r, 422)
            assert f"table bt {column}:" in msg, msg
        node.execute(c, ["UPDATE bt SET u = 'ok' WHERE id = 1"])
        assert c.get("/cdc/tables/bt/rows").json()["rows"][0][:4] == [1, "ok", "AA==", "ok"]


# -- bad requests ----------------------------------------------------------------------
BAD_REQUESTS: list[tuple[str, str, dict[str, Any], Any, str]] = [
    # method, path, query params, body (bytes = raw, else JSON; None = no body), message
    ("GET", "/cdc/tables/br/rows", {"bogus": "1"}, None, "unknown query parameter(s) bogus"),
    ("GET", "/cdc/tables", {"x": "1"}, None, "unknown query parameter"),
    ("GET", "/cdc/tables/br", {"limit": "1"}, None, "unknown query parameter"),
    ("GET", "/cdc/subscriptions", {"after": "1"}, None, "unknown query parameter"),
    ("POST", "/cdc/subscriptions", {"name": "x"}, {"name": "x"}, "unknown query parameter"),
    ("POST", "/cdc/subscriptions", {}, b"{", "not valid JSON"),
    ("POST", "/cdc/subscriptions", {}, ["br-sub"], "must be a JSON object"),
    ("POST", "/cdc/subscriptions", {}, "br-sub", "must be a JSON object"),
    ("POST", "/cdc/subscriptions", {}, {}, "missing field(s) name"),
    ("POST", "/cdc/subscriptions", {}, b"", "missing field(s) name"),
    ("POST", "/cdc/subscriptions", {}, {"name": 5}, "name must be a string"),
    ("POST", "/cdc/subscriptions", {}, {"name": None}, "name must be a string"),
    ("POST", "/cdc/subscriptions", {}, {"name": ""}, "subscriber name"),
    ("POST", "/cdc/subscriptions", {}, {"name": "x" * 201}, "subscriber name"),
    ("POST", "/cdc/subscriptions", {}, {"name": "a\nb"}, "subscriber name"),
    ("POST", "/cdc/subscriptions", {}, {"name": "bad name/../x"}, "subscriber name"),
    ("POST", "/cdc/subscriptions", {}, {"name": ".."}, "subscriber name"),
    ("POST", "/cdc/subscriptions", {}, {"name": "x", "at": 1}, "unknown field(s) at"),
    ("POST", "/cdc/subscriptions", {}, {"name": "x", "cid": "1"}, "cid must be an integer"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, {"cid": "5"}, "cid must be an integer"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, {"cid": 5.0}, "cid must be an integer"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, {"cid": True}, "cid must be an integer"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, {"cid": -1}, "cid must be between"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, {}, "missing field(s) cid"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, b"[", "not valid JSON"),
    ("POST", "/cdc/subscriptions/br-sub/progress", {}, [1], "must be a JSON object"),
    ("DELETE", "/cdc/subscriptions/br-sub", {"force": "1"}, None, "unknown query parameter"),
    ("GET", "/cdc/tables/br/rows", {"after_key": "{"}, None, "after_key must be a JSON list"),
    ("GET", "/cdc/tables/br/rows", {"after_key": "5"}, None, "after_key must be a JSON list"),
    ("GET", "/cdc/tables/br/rows", {"until_key": "[[1]]"}, None, "until_key: key values are"),
    ("GET", "/cdc/tables/br/rows", {"after_key": "[1, 2]"}, None, "has 1 value(s) (id), got 2"),
    ("GET", "/cdc/tables/br/rows", {"after_key": "[]"}, None, "has 1 value(s) (id), got 0"),
    ("GET", "/cdc/tables/br/rows", {"after_key": '[{"base64": "!"}]'}, None, "invalid base64"),
    ("GET", "/cdc/tables/br/rows", {"after_key": '[{"b": "AA=="}]'}, None, "a blob key value"),
    ("GET", "/cdc/tables/br/rows", {"limit": "0"}, None, "limit must be at least 1"),
    ("GET", "/cdc/tables/br/rows", {"limit": "ten"}, None, "limit must be an integer"),
    ("GET", "/cdc/tables/br/rows", {"limit": "1000001"}, None, "limit must be between"),
    ("GET", "/cdc/tables/br/rows", {"format": "xml"}, None, "format must be json or arrow"),
    ("GET", "/cdc/tables/br/splits", {"partitions": "0"}, None, "partitions must be at least 1"),
    ("GET", "/cdc/tables/br/splits", {"partitions": "5000"}, None, "partitions must be between"),
    ("GET", "/cdc/tables/br/changes", {"format": "xml"}, None, "format must be json or arrow"),
    ("GET", "/cdc/tables/br/changes", {"after": "-1"}, None, "after must be at least 0"),
    ("GET", "/cdc/tables/br/changes", {"after": "x"}, None, "after must be an integer"),
    ("GET", "/cdc/tables/br/changes", {"until": "x"}, None, "until must be an integer"),
    ("GET", "/cdc/tables/br/changes", {"limit": "0"}, None, "limit must be at least 1"),
    ("GET", "/cdc/tables/br/changes", {"max_events": "5"}, None, "unknown query parameter"),
    ("GET", "/cdc/tables/br/position", {"max_events": "0"}, None, "max_events must be at least"),
    ("GET", "/cdc/tables/br/position", {"limit": "5"}, None, "unknown query parameter"),
    ("GET", "/cdc/tables/br", {"count": "maybe"}, None, "count must be true or false"),
]


@pytest.fixture(scope="module")
def br_hold(node: Node) -> Iterator[None]:
    with node.client() as c:
        node.execute(
            c,
            ["CREATE TABLE br (id INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO br VALUES (1, 'a')"],
        )
        register(c, "br-sub")
        yield
        release(c, "br-sub")


@pytest.mark.parametrize(("method", "path", "params", "body", "message"), BAD_REQUESTS)
def test_bad_input_is_400_and_changes_nothing(
    node: Node,
    client: httpx.Client,
    br_hold: None,
    method: str,
    path: str,
    params: dict[str, Any],
    body: Any,
    message: str,
) -> None:
    c = client
    before = c.get("/cdc/subscriptions").json()
    if isinstance(body, bytes):
        r = c.request(method, path, params=params, content=body)
    elif body is not None:
        r = c.request(method, path, params=params, json=body)
    else:
        r = c.request(method, path, params=params)
    assert message in error_of(r, 400)
    assert c.get("/cdc/subscriptions").json() == before  # no commit, hold unchanged


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/cdc/tables/nope", None),
        ("GET", "/cdc/tables/nope/rows", None),
        ("GET", "/cdc/tables/nope/rows?format=arrow", None),
        ("GET", "/cdc/tables/nope/splits", None),
        ("GET", "/cdc/tables/nope/changes", None),
        ("GET", "/cdc/tables/nope/position", None),
        ("GET", "/cdc/tables/_litecdc_holds/rows", None),
        ("GET", "/cdc/tables/_litecdc_changes/changes", None),
        ("DELETE", "/cdc/subscriptions/nobody", None),
        ("POST", "/cdc/subscriptions/nobody/progress", {"cid": 1}),
    ],
)
def test_unknown_table_or_subscriber_is_404(
    client: httpx.Client, method: str, path: str, body: Any
) -> None:
    before = client.get("/cdc/subscriptions").json()
    r = client.request(method, path, json=body) if body else client.request(method, path)
    msg = error_of(r, 404)
    assert "nope" in msg or "nobody" in msg or "_litecdc_" in msg
    assert client.get("/cdc/subscriptions").json() == before


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/cdc/subscriptions", "GET, POST"),
        ("PUT", "/cdc/subscriptions", "GET, POST"),
        ("GET", "/cdc/subscriptions/x", "DELETE"),
        ("POST", "/cdc/subscriptions/x", "DELETE"),
        ("GET", "/cdc/subscriptions/x/progress", "POST"),
        ("POST", "/cdc/tables", "GET"),
        ("DELETE", "/cdc/tables/br", "GET"),
        ("POST", "/cdc/tables/br/rows", "GET"),
        ("PUT", "/cdc/tables/br/splits", "GET"),
        ("POST", "/cdc/tables/br/changes", "GET"),
        ("POST", "/cdc/tables/br/position", "GET"),
    ],
)
def test_wrong_method_is_405(
    client: httpx.Client, br_hold: None, method: str, path: str, allow: str
) -> None:
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    assert f"method {method} is not allowed" in r.text


# -- auth ------------------------------------------------------------------------------
USERS = [
    {"username": "admin", "password": "pw-admin", "perms": ["all"]},
    {"username": "reader", "password": "pw-reader", "perms": ["query"]},
    {"username": "writer", "password": "pw-writer", "perms": ["execute"]},
]


def test_permissions_reader_reads_but_cannot_register(tmp_path: Path) -> None:
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps(USERS))
    n = Node(tmp_path / "data", "--auth", str(auth_file)).start()
    try:
        with n.client(auth=("admin", "pw-admin")) as admin:
            n.execute(
                admin, ["CREATE TABLE au (id INTEGER PRIMARY KEY)", "INSERT INTO au VALUES (1)"]
            )
            admin_cid = register(admin, "admin-sub")
        with n.client(auth=("reader", "pw-reader")) as reader:
            assert (
                arrow(reader.get("/cdc/tables/au/rows", params={"format": "arrow"})).num_rows == 1
            )
            for path in (
                "/cdc/tables",
                "/cdc/tables/au",
                "/cdc/tables/au/splits",
                "/cdc/subscriptions",
            ):
                assert reader.get(path).status_code == 200, path
            ok = reader.get("/cdc/tables/au/changes", params={"after": admin_cid})
            assert ok.status_code == 200, ok.text
            denied = [
                reader.post("/cdc/subscriptions", json={"name": "r"}),
                reader.post("/cdc/subscriptions/admin-sub/progress", json={"cid": admin_cid}),
                reader.delete("/cdc/subscriptions/admin-sub"),
            ]
            for r in denied:
                assert r.status_code == 401, r.text
                assert r.headers["www-authenticate"] == 'Basic realm="litecdc"'
        with n.client(auth=("writer", "pw-writer")) as writer:
            assert writer.get("/cdc/tables/au/rows").status_code == 401
            assert register(writer, "w-sub") > admin_cid
            release(writer, "w-sub")
        with n.client() as anonymous:
            assert anonymous.get("/cdc/tables").status_code == 401
            assert anonymous.post("/cdc/subscriptions", json={"name": "a"}).status_code == 401
        with n.client(auth=("admin", "pw-admin")) as admin:
            assert set(holds(admin)) == {"admin-sub"}  # the denied requests changed nothing
    finally:
        n.stop()


def test_progress_beyond_the_head_is_refused(node: Node, client: httpx.Client) -> None:
    c = client
    node.execute(c, ["CREATE TABLE far (id INTEGER PRIMARY KEY)"])
    with subscriber(c, "far-sub"):
        before = holds(c)["far-sub"]
        r = c.post("/cdc/subscriptions/far-sub/progress", json={"cid": head(c) + 1000})
        assert "head" in error_of(r, 400)
        assert holds(c)["far-sub"] == before


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not reaped yet


def test_page_workers_exit_when_their_node_is_killed(tmp_path: Path) -> None:
    """kill -9 of a node that served snapshot chunks leaves no worker process behind (they
    blocked forever on the pool's queue, with multiprocessing's resource tracker)."""
    n = Node(tmp_path / "data").start()
    helpers: list[int] = []
    try:
        with n.client() as c:
            n.execute(c, ["CREATE TABLE w (id INTEGER PRIMARY KEY, v TEXT)"])
            n.execute(c, [["INSERT INTO w VALUES (?, ?)", i, f"v{i}"] for i in range(50)])
            assert arrow(c.get("/cdc/tables/w/rows", params={"format": "arrow"})).num_rows == 50
        assert n.proc is not None
        helpers = _children(n.proc.pid)  # the page workers and the resource tracker
        assert len(helpers) >= 2
        n.proc.kill()
        n.proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while not all(map(_gone, helpers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in helpers if not _gone(p)] == []
    finally:
        n.stop()
        for pid in helpers:  # whatever this test's failure would leave behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
