"""HTTPS with a trustme certificate, and a restart that keeps the data."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pyrqlite.dbapi2 as dbapi2
import pytest
import trustme
from litecdc_node import Node


def test_https_with_generated_certificate(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.create_default_context(cafile=str(ca_file))
    n = Node(
        tmp_path / "data",
        "--http-cert",
        str(cert_file),
        "--http-key",
        str(key_file),
        https=True,
        verify=ctx,
    ).start()
    try:
        with n.client() as c:
            n.execute(c, ["CREATE TABLE s (v TEXT)", "INSERT INTO s VALUES('tls')"])
            assert n.query(c, "SELECT v FROM s")["results"][0]["values"] == [["tls"]]
            status = c.get("/status").json()
            assert status["http"]["tls"] == {"enabled": "true"}
            assert c.get("/nodes").json()[f"127.0.0.1:{n.port}"]["api_addr"].startswith("https://")
        with pytest.raises(httpx.ConnectError):  # an untrusted client refuses the certificate
            httpx.get(f"{n.url}/readyz")
        with pytest.raises(httpx.TransportError):  # plain HTTP to the HTTPS port
            httpx.get(f"http://127.0.0.1:{n.port}/readyz")
        conn = dbapi2.connect(scheme="https", host="127.0.0.1", port=n.port, ssl_context=ctx)
        try:
            cur = conn.cursor()
            cur.execute("SELECT v FROM s")
            assert [tuple(r) for r in cur.fetchall()] == [("tls",)]
        finally:
            conn.close()
    finally:
        n.stop()


@pytest.mark.slow
def test_restart_keeps_data_and_journal(tmp_path: Path) -> None:
    port_node = Node(tmp_path / "data")
    n = port_node.start()
    try:
        with n.client() as c:
            n.execute(c, ["CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT)"])
            n.execute(c, [["INSERT INTO r(v) VALUES(?)", f"row{i}"] for i in range(20)])
            journal_before = c.get("/journal").json()
            changes_before = c.get("/cdc/changes", params={"limit": 10000}).json()
    finally:
        code = n.stop()
    # SIGTERM is a clean shutdown: exit 0, the store closed (SQLite removes the WAL files)
    assert code == 0, n.log()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["db.sqlite", "litecdc.lock"]
    n2 = Node(tmp_path / "data", port=port_node.port).start()
    try:
        with n2.client() as c:
            assert n2.query(c, "SELECT COUNT(*) FROM r")["results"][0]["values"] == [[20]]
            assert c.get("/journal").json() == journal_before
            assert c.get("/cdc/changes", params={"limit": 10000}).json() == changes_before
            last = journal_before["entries"][-1]["cid"]
            body = n2.execute(c, ["INSERT INTO r(v) VALUES('after')"], raft_index="")
            assert body["raft_index"] == last + 1
    finally:
        n2.stop()
