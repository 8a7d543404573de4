"""The rqlite-compatible endpoints of a real ``litecdc serve`` process, driven with httpx."""

from __future__ import annotations

import base64
import re
import sqlite3
from pathlib import Path

import httpx
from litecdc_node import Node


def test_execute_create_and_insert(node: Node, client: httpx.Client) -> None:
    body = node.execute(
        client,
        [
            "CREATE TABLE ex1 (id INTEGER NOT NULL PRIMARY KEY, name TEXT, age INTEGER)",
            'INSERT INTO ex1(name, age) VALUES("fiona", 20)',
        ],
    )
    assert body == {"results": [{}, {"last_insert_id": 1, "rows_affected": 1}]}
    assert node.query(client, "SELECT * FROM ex1") == {
        "results": [
            {
                "columns": ["id", "name", "age"],
                "types": ["integer", "text", "integer"],
                "values": [[1, "fiona", 20]],
            }
        ]
    }


def test_execute_parameters_positional_named_and_types(node: Node, client: httpx.Client) -> None:
    node.execute(
        client, ["CREATE TABLE ex2 (id INTEGER PRIMARY KEY, i INTEGER, r REAL, t TEXT, b BLOB, n)"]
    )
    body = node.execute(
        client,
        [
            [
                "INSERT INTO ex2(i, r, t, b, n) VALUES(?, ?, ?, ?, ?)",
                7,
                1.5,
                "x",
                [0, 1, 255],
                None,
            ],
            ["INSERT INTO ex2(i, t) VALUES(:i, :t)", {"i": True, "t": "named"}],
            ["INSERT INTO ex2(i) VALUES(?)", 99999999999999999999],
        ],
    )
    assert body == {
        "results": [
            {"last_insert_id": 1, "rows_affected": 1},
            {"last_insert_id": 2, "rows_affected": 1},
            {"last_insert_id": 3, "rows_affected": 1},
        ]
    }
    rows = node.query(client, "SELECT i, r, t, b, n, typeof(i) FROM ex2 ORDER BY id")
    assert rows["results"][0]["values"] == [
        [7, 1.5, "x", base64.b64encode(bytes([0, 1, 255])).decode(), None, "integer"],
        [1, None, "named", None, None, "integer"],
        [1e20, None, None, None, None, "real"],
    ]
    arrays = node.query(client, "SELECT b FROM ex2 WHERE id = 1", blob_array="")
    assert arrays["results"][0]["values"] == [[[0, 1, 255]]]


def test_sql_error_is_per_statement_with_http_200(node: Node, client: httpx.Client) -> None:
    node.execute(client, ["CREATE TABLE ex3 (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"])
    r = client.post(
        "/db/execute",
        json=[
            "SELEC 1",
            "INSERT INTO ex3(v) VALUES('a')",
            "INSERT INTO ex3(v) VALUES('a')",
        ],
    )
    assert r.status_code == 200
    assert r.json() == {
        "results": [
            {"error": 'near "SELEC": syntax error'},
            {"last_insert_id": 1, "rows_affected": 1},
            {"error": "UNIQUE constraint failed: ex3.v"},
        ]
    }


def test_transaction_rolls_back_everything(node: Node, client: httpx.Client) -> None:
    node.execute(client, ["CREATE TABLE ex4 (id INTEGER PRIMARY KEY)"])
    body = node.execute(
        client,
        [
            "INSERT INTO ex4(id) VALUES(1)",
            "INSERT INTO ex4(id) VALUES(1)",
            "INSERT INTO ex4(id) VALUES(2)",
        ],
        transaction="",
    )
    assert body["results"][0] == {"last_insert_id": 1, "rows_affected": 1}
    assert body["results"][1] == {"error": "UNIQUE constraint failed: ex4.id"}
    assert len(body["results"]) == 2  # processing stops at the first error
    assert node.query(client, "SELECT COUNT(*) AS n FROM ex4")["results"][0]["values"] == [[0]]


def test_timings_and_pretty(node: Node, client: httpx.Client) -> None:
    r = client.post(
        "/db/execute?timings&pretty", json=["CREATE TABLE ex5 (id INTEGER PRIMARY KEY)"]
    )
    assert r.status_code == 200
    assert r.text.startswith('{\n    "results": [\n        {\n            "time": ')
    body = r.json()
    assert set(body) == {"results", "time"}
    assert isinstance(body["time"], float) and body["time"] > 0
    assert set(body["results"][0]) == {"time"}
    # a flag counts when present, whatever its value (rqlite)
    body = client.get("/db/query", params={"q": "SELECT 1", "timings": "false"}).json()
    assert "time" in body


def test_query_types_and_values(node: Node, client: httpx.Client) -> None:
    node.execute(
        client,
        [
            "CREATE TABLE ex6 (id INTEGER PRIMARY KEY, name VARCHAR(10), flag BOOLEAN, "
            "d DATE, dt DATETIME, ts TIMESTAMP, doc BLOB, note TEXT)",
            [
                "INSERT INTO ex6 VALUES(1, 'fiona', 1, '2026-09-30', '2026-09-30 12:34:56.789', "
                "'2026-09-30T12:34:56.123456789+05:30', ?, ?)",
                [104, 105],
                [104, 105],
            ],
            "INSERT INTO ex6 VALUES(2, NULL, 0, 'nope', 1727699696, NULL, NULL, NULL)",
        ],
    )
    body = node.query(client, "SELECT * FROM ex6 ORDER BY id")
    assert body == {
        "results": [
            {
                "columns": ["id", "name", "flag", "d", "dt", "ts", "doc", "note"],
                "types": [
                    "integer",
                    "varchar(10)",
                    "boolean",
                    "date",
                    "datetime",
                    "timestamp",
                    "blob",
                    "text",
                ],
                "values": [
                    [
                        1,
                        "fiona",
                        True,
                        "2026-09-30T00:00:00Z",
                        "2026-09-30T12:34:56.789Z",
                        "2026-09-30T12:34:56.123456789+05:30",
                        "aGk=",
                        "hi",
                    ],
                    [
                        2,
                        None,
                        False,
                        "0001-01-01T00:00:00Z",
                        "2024-09-30T12:34:56Z",
                        None,
                        None,
                        None,
                    ],
                ],
            }
        ]
    }


def test_query_expression_types_and_empty_result(node: Node, client: httpx.Client) -> None:
    body = node.query(client, "SELECT 1 + 1, 1.5, 'a', NULL, x'0102'")
    assert body == {
        "results": [
            {
                "columns": ["1 + 1", "1.5", "'a'", "NULL", "x'0102'"],
                "types": ["integer", "real", "text", "", "blob"],
                "values": [[2, 1.5, "a", None, "AQI="]],
            }
        ]
    }
    node.execute(client, ["CREATE TABLE ex7 (id INTEGER PRIMARY KEY, v TEXT)"])
    assert node.query(client, "SELECT * FROM ex7") == {
        "results": [{"columns": ["id", "v"], "types": ["integer", "text"]}]
    }


def test_query_post_associative_and_parameters(node: Node, client: httpx.Client) -> None:
    node.execute(
        client,
        [
            "CREATE TABLE ex8 (id INTEGER PRIMARY KEY, name TEXT, age INTEGER)",
            "INSERT INTO ex8(name, age) VALUES('fiona', 20), ('declan', 25)",
        ],
    )
    r = client.post(
        "/db/query?associative",
        json=[["SELECT * FROM ex8 WHERE age > ? ORDER BY id", 1], ["SELECT * FROM ex8 WHERE 0"]],
    )
    assert r.status_code == 200
    assert r.json() == {
        "results": [
            {
                "types": {"age": "integer", "id": "integer", "name": "text"},
                "rows": [
                    {"age": 20, "id": 1, "name": "fiona"},
                    {"age": 25, "id": 2, "name": "declan"},
                ],
            },
            # rqlite 8: "rows" is always there in associative form, [] when none
            {"types": {"age": "integer", "id": "integer", "name": "text"}, "rows": []},
        ]
    }
    assert list(r.json()["results"][0]["rows"][0]) == ["age", "id", "name"]  # sorted keys
    named = client.post("/db/query", json=[["SELECT name FROM ex8 WHERE age = :age", {"age": 25}]])
    assert named.json()["results"][0]["values"] == [["declan"]]
    for level in ("none", "weak", "strong", "linearizable", "auto", "bogus"):
        r = client.get("/db/query", params={"q": "SELECT COUNT(*) FROM ex8", "level": level})
        assert r.json()["results"][0]["values"] == [[2]], level
    # reads only: rqlite 8 answers them as /db/query does, an error that running the read
    # met with "rows": [] (one that fails to prepare is not known to be a read: no rows)
    reads = client.post(
        "/db/request?associative", json=["SELECT 1 AS one", "SELECT abs(-9223372036854775808)"]
    )
    assert reads.json() == {
        "results": [
            {"types": {"one": "integer"}, "rows": [{"one": 1}]},
            {"rows": [], "error": "integer overflow"},
        ]
    }
    unknown = client.post("/db/request?associative", json=["SELECT * FROM nope"])
    assert unknown.json() == {"results": [{"error": "no such table: nope"}]}
    mixed = client.post(
        "/db/request?associative",
        json=[
            "INSERT INTO ex8(name, age) VALUES('ann', 30)",
            "SELECT name FROM ex8 WHERE 0",
            ["INSERT INTO ex8(name, age) VALUES(?, 31) RETURNING id, name", "bob"],
        ],
    )
    assert mixed.json() == {
        "results": [
            {"last_insert_id": 3, "rows_affected": 1, "rows": None},
            {"types": {"name": "text"}, "rows": []},
            {
                "last_insert_id": 4,
                "rows_affected": 1,
                "types": {"id": "integer", "name": "text"},
                "rows": [{"id": 4, "name": "bob"}],
            },
        ]
    }


def test_write_through_query_is_refused_and_changes_nothing(
    node: Node, client: httpx.Client
) -> None:
    node.execute(client, ["CREATE TABLE ex9 (id INTEGER PRIMARY KEY)"])
    r = client.get("/db/query", params={"q": "INSERT INTO ex9(id) VALUES(1)"})
    assert r.status_code == 200
    assert r.json() == {"results": [{"error": "attempt to change database via query operation"}]}
    assert node.query(client, "SELECT COUNT(*) FROM ex9")["results"][0]["values"] == [[0]]


def test_unified_request_endpoint(node: Node, client: httpx.Client) -> None:
    r = client.post(
        "/db/request",
        json=[
            "CREATE TABLE ex10 (id INTEGER NOT NULL PRIMARY KEY, name TEXT, age INTEGER)",
            ["INSERT INTO ex10(name, age) VALUES(?, ?)", "fiona", 20],
            ["SELECT * FROM ex10"],
            ["SELECT * FROM nosuchtable"],
        ],
    )
    assert r.status_code == 200
    assert r.json() == {
        "results": [
            {},
            {"last_insert_id": 1, "rows_affected": 1},
            {
                "columns": ["id", "name", "age"],
                "types": ["integer", "text", "integer"],
                "values": [[1, "fiona", 20]],
            },
            {"error": "no such table: nosuchtable"},
        ]
    }
    reads = client.post("/db/request?associative", json=["SELECT name FROM ex10"])
    assert reads.json() == {"results": [{"types": {"name": "text"}, "rows": [{"name": "fiona"}]}]}


def test_text_plain_body_is_one_statement(node: Node, client: httpx.Client) -> None:
    r = client.post(
        "/db/execute",
        content="CREATE TABLE ex11 (id INTEGER PRIMARY KEY)",
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 200
    assert r.json() == {"results": [{}]}
    r = client.post(
        "/db/query", content="SELECT COUNT(*) FROM ex11", headers={"Content-Type": "text/plain"}
    )
    assert r.json()["results"][0]["values"] == [[0]]


def test_queued_write_returns_sequence_number(node: Node, client: httpx.Client) -> None:
    node.execute(client, ["CREATE TABLE ex12 (id INTEGER PRIMARY KEY)"])
    body = node.execute(client, ["INSERT INTO ex12(id) VALUES(5)"], queue="", wait="")
    assert body["results"] == []
    assert isinstance(body["sequence_number"], int) and body["sequence_number"] > 0
    assert node.query(client, "SELECT id FROM ex12")["results"][0]["values"] == [[5]]


def test_raft_index_is_the_commit_id(node: Node, client: httpx.Client) -> None:
    node.execute(client, ["CREATE TABLE ex13 (id INTEGER PRIMARY KEY)"])
    body = node.execute(client, ["INSERT INTO ex13(id) VALUES(1)"], raft_index="")
    journal = client.get("/journal", params={"after": body["raft_index"] - 1, "limit": 1}).json()
    assert journal["entries"][0]["cid"] == body["raft_index"]


def test_status(node: Node, client: httpx.Client) -> None:
    r = client.get("/status")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    body = r.json()
    assert {"build", "http", "node", "os", "runtime", "store"} <= set(body)
    assert body["node"]["mode"] == "normal" or body["node"]["mode"].lower() == "normal"
    queue = body["http"].pop("queue")
    assert body["http"] == {
        "bind_addr": f"127.0.0.1:{node.port}",
        "auth": "disabled",
        "tls": {"enabled": "false"},
    }
    assert isinstance(queue["_default"]["sequence_number"], int)
    store = body["store"]
    for key in (
        "node_id",
        "mode",
        "db_path",
        "db_size_bytes",
        "last_cid",
        "available_snapshot",
        "journal_min_cid",
        "changes_queued",
        "sqlite_version",
    ):
        assert key in store
    assert store["node_id"] == f"127.0.0.1:{node.port}"
    # rqlite's store.leader: gorqlite's Open() reads leader.node_id and fails without it
    assert store["leader"] == {"node_id": store["node_id"], "addr": f"127.0.0.1:{node.port}"}
    # rqlite's uptime is a Go duration ("1m26.709266s"), which Go clients parse as one
    assert re.fullmatch(r"(\d+h)?(\d+m)?\d+(\.\d+)?(s|ms|µs|ns)", body["node"]["uptime"])
    sub = client.get("/status", params={"key": "http.auth"})
    assert sub.json() == "disabled"
    assert client.get("/status", params={"key": "no.such"}).json() == {}


def test_nodes_readyz_and_root(node: Node, client: httpx.Client) -> None:
    node_id = f"127.0.0.1:{node.port}"
    entry = {
        "id": node_id,
        "api_addr": f"http://{node_id}",
        "addr": node_id,
        "voter": True,
        "reachable": True,
        "leader": True,
    }
    assert client.get("/nodes").json() == {node_id: entry}
    assert client.get("/nodes", params={"ver": "2"}).json() == {"nodes": [entry]}
    # rqlite's GET /leader (rqlite QA: 404); its POST, a leadership transfer, is not served
    assert client.get("/leader?pretty").json() == entry
    r = client.post("/leader")
    assert (r.status_code, r.headers["allow"]) == (405, "GET"), r.text
    r = client.get("/readyz")
    assert (r.status_code, r.text) == (200, "[+]node ok\n[+]leader ok\n[+]store ok")
    r = client.get("/readyz?noleader")
    assert (r.status_code, r.text) == (200, "[+]node ok")
    r = client.get("/")
    assert (r.status_code, r.headers["location"]) == (302, "/status")


def test_backup_binary_and_sql(node: Node, client: httpx.Client, tmp_path: Path) -> None:
    node.execute(
        client,
        [
            "CREATE TABLE bk (id INTEGER PRIMARY KEY, v TEXT)",
            "INSERT INTO bk(v) VALUES('one'), ('two')",
        ],
    )
    r = client.get("/db/backup")
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.content.startswith(b"SQLite format 3\x00")
    path = tmp_path / "backup.sqlite"
    path.write_bytes(r.content)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT v FROM bk ORDER BY id").fetchall() == [("one",), ("two",)]
    r = client.get("/db/backup", params={"fmt": "sql"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/sql")
    assert "CREATE TABLE bk" in r.text
    assert "'two'" in r.text
    # rqlite's BackupFormatFromString: lower-cased, and an unknown format is binary
    r = client.get("/db/backup", params={"fmt": "SQL"})
    assert r.headers["content-type"].startswith("application/sql") and "'two'" in r.text
    r = client.get("/db/backup", params={"fmt": "xml"})
    assert r.status_code == 200 and r.content[:20] == b"SQLite format 3\x00\x10\x00\x02\x02"
    r = client.get("/db/backup", params={"fmt": "delete"})
    assert r.status_code == 200 and r.content[18:20] == b"\x01\x01"  # DELETE journal mode
    path.write_bytes(r.content)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert db.execute("SELECT v FROM bk ORDER BY id").fetchall() == [("one",), ("two",)]
    db.close()


def test_load_sql_text_then_sqlite_file(fresh_node: Node, tmp_path: Path) -> None:
    with fresh_node.client() as c:
        fresh_node.execute(
            c, ["CREATE TABLE old (id INTEGER PRIMARY KEY)", "INSERT INTO old VALUES(1)"]
        )
        dump = (
            "BEGIN TRANSACTION;\n"
            "CREATE TABLE ld (id INTEGER PRIMARY KEY, v TEXT);\n"
            "INSERT INTO ld VALUES(1,'a');\n"
            "INSERT INTO ld VALUES(2,'b');\n"
            "COMMIT;\n"
        )
        r = c.post("/db/load", content=dump, headers={"Content-Type": "text/plain"})
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"results"}
        assert len(r.json()["results"]) == 1 and "error" not in r.json()["results"][0]
        assert fresh_node.query(c, "SELECT v FROM ld ORDER BY id")["results"][0]["values"] == [
            ["a"],
            ["b"],
        ]
        # SQL text runs on the database as it is (rqlite): the other table stays
        kept = fresh_node.query(c, "SELECT * FROM old")
        assert kept["results"][0]["values"] == [[1]]

        path = tmp_path / "src.sqlite"
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE fromfile (id INTEGER PRIMARY KEY, v TEXT)")
            db.execute("INSERT INTO fromfile(v) VALUES('x')")
        db.close()
        r = c.post(
            "/db/load",
            content=path.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"results": []}
        assert fresh_node.query(c, "SELECT v FROM fromfile")["results"][0]["values"] == [["x"]]
        # a SQLite file replaces the database (rqlite)
        gone = fresh_node.query(c, "SELECT * FROM old")
        assert gone == {"results": [{"error": "no such table: old"}]}
        # the load is captured like any write
        changes = c.get("/cdc/changes", params={"limit": 10000}).json()["changes"]
        assert any(ch["table"] == "fromfile" and ch["op"] == "insert" for ch in changes)


def test_min_cid_reads_wait_for_the_write(fresh_node: Node) -> None:
    with fresh_node.client() as c:
        body = fresh_node.execute(
            c, ["CREATE TABLE m(x)", "INSERT INTO m VALUES(1)"], raft_index=""
        )
        cid = body["raft_index"]
        r = c.get("/db/query", params={"q": "SELECT x FROM m", "min_cid": cid, "level": "none"})
        assert r.status_code == 200 and r.json()["results"][0]["values"] == [[1]]
        bad = c.get("/db/query", params={"q": "SELECT 1", "min_cid": "soon"})
        assert bad.status_code == 400 and "min_cid must be" in bad.text


def test_queued_write_of_failing_sql_still_gets_its_sequence_number(
    node: Node, client: httpx.Client
) -> None:
    """rqlite answers a queued write with its sequence number whatever the SQL does; the
    failure is in the node's log, and /status reports the last number processed."""
    r = client.post("/db/execute", params={"queue": ""}, json=["INSERT INTO nosuch VALUES(1)"])
    assert r.status_code == 200, r.text
    number = r.json()["sequence_number"]
    assert r.json() == {"results": [], "sequence_number": number}
    r = client.post("/db/execute", params={"queue": "", "wait": ""}, json=[])
    assert r.status_code == 200 and r.json()["sequence_number"] == number + 1
    status = client.get("/status", params={"key": "http.queue._default.sequence_number"})
    assert status.json() == number + 1
    assert f"queued write {number}: statement 1 failed: no such table: nosuch" in node.log()


def test_a_queued_write_through_a_follower_is_numbered_by_the_follower(
    node: Node, tmp_path: Path
) -> None:
    """The follower forwards the write to the leader and answers with its own queue's
    number, as rqlite's follower queues the write itself; its /status reports it."""
    from collections.abc import Sequence

    from starlette.testclient import TestClient

    from litecdc import NodeConfig, Statement, Store, WriteOutcome
    from litecdc.errors import NotLeaderError
    from litecdc.http.app import create_app

    with node.client() as c:
        node.execute(c, ["CREATE TABLE fq (x)"])
    store = Store(NodeConfig(data_dir=tmp_path / "follower", node_id="follower"))

    def not_here(statements: Sequence[Statement], transaction: bool) -> WriteOutcome:
        raise NotLeaderError("not the leader", leader_id="leader", leader_address=node.url)

    store.route_writes(not_here)
    try:
        with TestClient(create_app(store, store.config)) as follower:
            r = follower.post("/db/execute?queue", json=["INSERT INTO fq VALUES(7)"])
            assert r.status_code == 200, r.text
            number = r.json()["sequence_number"]
            seen = follower.get("/status").json()["http"]["queue"]["_default"]
            assert seen["sequence_number"] == number
            r = follower.post("/db/execute?queue", json=["INSERT INTO nosuch VALUES(7)"])
            assert r.status_code == 200 and r.json()["sequence_number"] == number + 1
    finally:
        store.close()
    with node.client() as c:
        assert node.query(c, "SELECT x FROM fq")["results"][0]["values"] == [[7]]


def test_rqlite_paths_match_by_prefix(node: Node, client: httpx.Client) -> None:
    """rqlite's ServeHTTP matches with strings.HasPrefix; uvicorn must not redirect."""
    r = client.post("/db/execute/", json=["CREATE TABLE pfx (x)"], follow_redirects=False)
    assert (r.status_code, r.json()) == (200, {"results": [{}]})
    r = client.post(
        "/db/execute/queue/_default", params={"queue": ""}, json=["INSERT INTO pfx VALUES(1)"],
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 200 and "sequence_number" in r.json()
    r = client.get("/statusfoo", follow_redirects=False)
    assert r.status_code == 200 and "store" in r.json()
    assert client.get("/journal/", follow_redirects=False).status_code == 404


def test_version_header_and_cors_on_every_response(tmp_path: Path) -> None:
    n = Node(tmp_path / "data", "--http-allow-origin", "https://app.example").start()
    try:
        with n.client() as c:
            for r in (c.get("/status"), c.get("/nosuch"), c.options("/anything/at/all")):
                assert r.headers["x-rqlite-version"].startswith("litecdc/")
                assert r.headers["access-control-allow-origin"] == "https://app.example"
                assert r.headers["access-control-allow-methods"] == "OPTIONS, GET, POST"
                assert r.headers["access-control-allow-headers"] == "Content-Type"
            assert c.options("/anything/at/all").status_code == 200
    finally:
        n.stop()


def test_boot_replaces_a_standalone_node_with_a_sqlite_file(
    fresh_node: Node, tmp_path: Path
) -> None:
    path = tmp_path / "boot.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE booted (v TEXT)")
        db.execute("INSERT INTO booted VALUES('b')")
    db.close()
    with fresh_node.client() as c:
        fresh_node.execute(c, ["CREATE TABLE old (x)"])
        r = c.post("/boot", content=path.read_bytes())
        assert (r.status_code, r.content) == (200, b"")
        assert fresh_node.query(c, "SELECT v FROM booted")["results"][0]["values"] == [["b"]]
        assert fresh_node.query(c, "SELECT x FROM old")["results"][0]["error"] == (
            "no such table: old"
        )
        r = c.post("/boot", content="CREATE TABLE t (x);", headers={"Content-Type": "text/plain"})
        assert r.status_code == 400 and "/boot takes a SQLite database file" in r.text


def test_debug_vars(node: Node, client: httpx.Client) -> None:
    doc = client.get("/debug/vars").json()
    assert "serve" in doc["cmdline"] and str(node.data_dir) in doc["cmdline"]
    assert doc["memory"]["rss_bytes"] > 0
    assert doc["http"]["num_status"] >= 0
