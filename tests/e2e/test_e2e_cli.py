"""``litecdc serve`` configuration errors: one line on stderr, exit status 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from litecdc_node import Node, serve_cli


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return serve_cli(*args, env={"PATH": "/usr/bin:/bin"})  # no LITECDC_* from outside


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "error: --data-dir is required (or set LITECDC_DATA_DIR)"),
        (
            ("--data-dir", "{d}", "--http-addr", "nohost"),
            "error: --http-addr: address must look like host:port, got 'nohost'",
        ),
        (
            ("--data-dir", "{d}", "--http-addr", "127.0.0.1:99999"),
            "error: --http-addr: port must be between 0 and 65535, got 99999",
        ),
        (
            ("--data-dir", "{d}", "--etcd", "foo"),
            "error: --etcd: address must look like host:port, got 'foo'",
        ),
        (
            ("--data-dir", "{d}", "--etcd", "127.0.0.1:99999"),
            "error: --etcd: port must be between 0 and 65535, got 99999",
        ),
        # an empty --etcd (say --etcd "$ETCD" with ETCD unset) started a cluster member
        # standalone, and its data forked (cluster QA)
        (
            ("--data-dir", "{d}", "--etcd", ""),
            "error: --etcd '' names an empty endpoint: give host:port[,host:port…], or leave "
            "--etcd out to run standalone",
        ),
        (
            ("--data-dir", "{d}", "--etcd", ","),
            "error: --etcd ',' names an empty endpoint: give host:port[,host:port…], or leave "
            "--etcd out to run standalone",
        ),
        (
            ("--data-dir", "{d}", "--synchronous", "sometimes"),
            "error: --synchronous must be one of off, normal, full, extra, got 'sometimes'",
        ),
        (
            ("--data-dir", "{d}", "--http-cert", "{d}/c.pem"),
            "error: --http-cert and --http-key must be given together",
        ),
        (
            ("--data-dir", "{d}", "--auth", "{d}/missing.json"),
            "error: --auth: file '{d}/missing.json' does not exist",
        ),
        (
            ("--data-dir", "{d}", "--max-body-bytes", "lots"),
            "error: --max-body-bytes must be an integer, got 'lots'",
        ),
        (
            ("--data-dir", "{d}", "--etcd", "127.0.0.1:1", "--advertise-url", "notaurl"),
            "error: --advertise-url must be an http:// or https:// URL with a host, such as "
            "http://10.0.0.5:4001; got 'notaurl'",
        ),
        # QA: cluster options without --etcd started a lone node without a word
        (
            ("--data-dir", "{d}", "--cluster", "demo"),
            "error: --cluster is for cluster mode, which needs --etcd (or LITECDC_ETCD): give "
            "the etcd endpoints, or leave it out to run standalone",
        ),
        (
            (
                "--data-dir",
                "{d}",
                "--node-id",
                "n1",
                "--advertise-url",
                "http://x:1",
                "--compact-interval",
                "5",
            ),
            "error: --advertise-url, --compact-interval are for cluster mode, which needs "
            "--etcd (or LITECDC_ETCD): give the etcd endpoints, or leave them out to run "
            "standalone",
        ),
    ],
)
def test_config_errors(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    d = str(tmp_path)
    proc = _serve(*(a.format(d=d) for a in args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == message.format(d=d) + "\n"
    assert proc.stdout == ""


def test_an_error_in_an_option_set_by_its_variable_names_the_variable(tmp_path: Path) -> None:
    proc = serve_cli(
        "--data-dir", str(tmp_path / "d"),
        env={"PATH": "/usr/bin:/bin", "LITECDC_HTTP_ADDR": "foo"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "error: LITECDC_HTTP_ADDR: --http-addr: address must look like host:port, got 'foo'\n"
    )


def test_a_cluster_variable_without_etcd_is_refused_naming_the_variable(tmp_path: Path) -> None:
    """LITECDC_CLUSTER set and LITECDC_ETCD forgotten ran a lone node (QA)."""
    proc = serve_cli(
        "--data-dir", str(tmp_path / "d"),
        env={"PATH": "/usr/bin:/bin", "LITECDC_CLUSTER": "shop", "LITECDC_ETCD": ""},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: LITECDC_CLUSTER is for cluster mode, which needs")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--etcd", "127.0.0.1:2379", "--etcd-user", "u"),
            "error: --etcd-user and --etcd-password must be given together",
        ),
        (
            ("--etcd", "127.0.0.1:2379", "--node-user", "u"),
            "error: --node-user and --node-password must be given together",
        ),
        (
            ("--auth", "{t}/auth.json"),
            "error: --auth: {t}/auth.json, entry 1 (a): unknown permission(s) nope; known: "
            "all, backup, execute, join, join-read-only, leader-ops, load, query, ready, "
            "remove, snapshot, status, ui",
        ),
    ],
)
def test_refused_starts_leave_no_data_directory_behind(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    """Refused starts created DATA_DIR/db.sqlite and litecdc.lock before they were
    refused (cluster QA): what needs no data is checked first."""
    t = str(tmp_path)
    (tmp_path / "auth.json").write_text('[{"username": "a", "password": "b", "perms": ["nope"]}]')
    data_dir = tmp_path / "data"
    proc = _serve("--data-dir", str(data_dir), *(a.format(t=t) for a in args))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == message.format(t=t) + "\n"
    assert not data_dir.exists()


def test_help_documents_serve() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "litecdc", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    for option in (
        "--data-dir",
        "--http-addr",
        "--node-id",
        "--auth",
        "--http-cert",
        "--http-key",
        "--synchronous",
        "--max-body-bytes",
        "--retention-cids",
        "--journal-retention-cids",
    ):
        assert option in proc.stdout
    # QA: every option said TEXT and no LITECDC_* variable was named
    text = " ".join(proc.stdout.split())
    assert "--lease-ttl SECONDS" in text and "--retention-cids N" in text
    assert "[env var: LITECDC_DATA_DIR]" in text and "env var: LITECDC_CDC_CONFIG" in text


def test_a_second_node_on_a_data_directory_in_use_is_refused(fresh_node: Node) -> None:
    """Two processes writing one database would number commits from the same journal:
    the second one must not start (before this, it did and broke the first)."""
    assert fresh_node.proc is not None
    with fresh_node.client() as client:
        fresh_node.execute(client, ["CREATE TABLE t(x)", "INSERT INTO t VALUES(1)"])
        proc = _serve("--data-dir", str(fresh_node.data_dir), "--http-addr", "127.0.0.1:0")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"error: data directory {fresh_node.data_dir} is in use by another litecdc node "
            f"(pid {fresh_node.proc.pid}); each node needs a data directory of its own\n"
        )
        out = fresh_node.execute(client, ["INSERT INTO t VALUES(2)"])
        assert "error" not in out["results"][0]


def test_an_os_chosen_port_is_the_one_logged_and_reported(tmp_path: Path) -> None:
    """With --http-addr HOST:0 the system picks the port: the 'serving' line, /status and
    /nodes must name that port, the only way a user learns where the node is."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "litecdc", "serve", "--data-dir", str(tmp_path / "d"),
         "--http-addr", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"litecdc node (\S+) serving (http://127\.0\.0\.1:(\d+))$", line.strip())
        assert match is not None, line
        node_id, url, port = match.groups()
        assert port != "0" and node_id == f"127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30.0) as client:
            status = client.get("/status").json()
            assert status["http"]["bind_addr"] == f"127.0.0.1:{port}"
            (node,) = client.get("/nodes", params={"ver": "2"}).json()["nodes"]
            assert node["api_addr"] == url and node["id"] == node_id
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0


def test_a_data_directory_litecdc_cannot_use_is_refused_in_one_line(tmp_path: Path) -> None:
    """A damaged or foreign database file: one line naming the file and what is wrong (it
    was a Python traceback), exit status 2, the file untouched."""
    garbage = b"not an SQLite file " * 1000
    (tmp_path / "db.sqlite").write_bytes(garbage)
    proc = _serve("--data-dir", str(tmp_path), "--http-addr", "127.0.0.1:0")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: cannot use the node's database {tmp_path}/db.sqlite: it is not an SQLite "
        "database; restore it from a backup (GET /db/backup) or start the node on another "
        "--data-dir\n"
    )
    assert (tmp_path / "db.sqlite").read_bytes() == garbage
    (tmp_path / "afile").write_text("x")
    proc = _serve("--data-dir", str(tmp_path / "afile"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: data directory {tmp_path}/afile is a file, not a directory\n"


def test_bad_values_found_by_qa_are_refused_before_the_data_dir_is_made(tmp_path: Path) -> None:
    """CLI QA: each of these started (or crashed with a traceback, or left a new data
    directory behind) instead of a one-line error naming the option."""
    from fakes.certs import make_certs

    certs = make_certs(tmp_path / "tls")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    d = tmp_path / "new"
    etcd = ("--etcd", "127.0.0.1:1")
    cases: list[tuple[tuple[str, ...], str]] = [
        # str.isdigit() took "²" (then int() raised) and other scripts' digits
        (("--http-addr", "127.0.0.1:²"), "error: --http-addr: address must look like host:port"),
        (("--http-addr", "127.0.0.1:٢٥٠٠١"), "error: --http-addr: address must look like"),
        ((*etcd[:1], "127.0.0.1:²"), "error: --etcd: address must look like host:port"),
        # any scheme was stripped, and the node waited for etcd forever
        (("--etcd", "ftp://127.0.0.1:2379"), "error: --etcd: an endpoint is host:port, http://"),
        # credentials in an endpoint: taken for a host name, waited forever, logged (review)
        (
            ("--etcd", "http://root:SECRET@127.0.0.1:2379"),
            "error: --etcd: an endpoint takes no user:password@ (give --etcd-user and "
            "--etcd-password); got 'http://127.0.0.1:2379'",
        ),
        (
            ("--etcd", "root:SECRET@127.0.0.1:2379"),
            "error: --etcd: an endpoint takes no user:password@",
        ),
        (
            (*etcd, "--advertise-url", "http://me:SECRET@127.0.0.1:4001"),
            "error: --advertise-url takes no user:password@",
        ),
        ((*etcd, "--compact-interval", "nan"), "error: --compact-interval must be a number"),
        ((*etcd, "--compact-interval", "inf"), "error: --compact-interval must be a number"),
        # config QA: a wait too long for the clock ended the compactor thread
        ((*etcd, "--compact-interval", "1e10"), "error: --compact-interval must be a number"),
        # config QA re-test: 0.001 kept the node and etcd busy at ~30 % CPU
        ((*etcd, "--compact-interval", "0.001"), "error: --compact-interval must be a number"),
        # config QA re-test: the advice gave the HTTP example's port
        (("--etcd", "::1:2379"), "error: --etcd: an IPv6 address goes in brackets, as [::1]:2379"),
        # config QA: etcd refused the lease on every election, the node never led
        (
            (*etcd, "--lease-ttl", "9000000001"),
            "error: --lease-ttl must be from 2 to 9000000000 seconds (etcd's limits), got",
        ),
        # config QA: advertised as http://::1:4001, which other nodes could not reach
        (
            ("--http-addr", "::1:4001"),
            "error: --http-addr: an IPv6 address goes in brackets, as [::1]:4001; got '::1:4001'",
        ),
        (("--http-addr", "[::1:4001"), "error: --http-addr: an IPv6 address goes in brackets"),
        (("--http-addr", "[]:4001"), "error: --http-addr: address must look like host:port"),
        # bytes that are not UTF-8 made /status answer 500 and CDC deliver nothing
        (("--node-id", "n\udcff"), "error: --node-id must be UTF-8 text, got 'n\\\\udcff'"),
        # a directory or a pipe was said not to exist
        (("--auth", str(tmp_path)), f"error: --auth: '{tmp_path}' is a directory; give a PEM"),
        (("--auth", "/dev/zero"), "error: --auth: '/dev/zero' is not a regular file"),
        # certificates: loaded before anything starts, naming the option
        ((*etcd, "--node-ca-cert", str(junk)), f"error: --node-ca-cert '{junk}' holds no PEM CA"),
        ((*etcd, "--etcd-ca-cert", str(junk)), f"error: --etcd-ca-cert '{junk}' holds no PEM CA"),
        (
            (*etcd, "--etcd-cert", str(certs.client_cert), "--etcd-key", str(certs.server_key)),
            f"error: the private key in --etcd-key '{certs.server_key}' is not the certificate's",
        ),
    ]
    for args, message in cases:
        proc = _serve("--data-dir", str(d), *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith(message), (args, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        assert not d.exists(), args
        assert "SECRET" not in proc.stderr
    # the good files pass these checks (the node then waits for etcd: not started here)
    from litecdc.config import NodeConfig

    NodeConfig(
        data_dir=d,
        etcd_endpoints=("https://127.0.0.1:1",),
        etcd_ca_cert=certs.ca_cert,
        etcd_cert=certs.client_cert,
        etcd_key=certs.client_key,
        node_ca_cert=certs.ca_cert,
    )


def test_a_directory_or_dangling_link_where_the_database_goes_is_named(tmp_path: Path) -> None:
    """CLI QA: a directory or a dangling symbolic link at db.sqlite crashed with apsw's
    traceback ("not an error"); a directory at db.sqlite-wal was called a damaged
    database ("restore it from a backup") and an empty db.sqlite was made next to it."""
    cases = [
        ("dir", "db.sqlite", "a directory"),
        ("wal", "db.sqlite-wal", "a directory"),
        ("link", "db.sqlite", "a symbolic link to '/no/such/file', which does not exist"),
    ]
    for where, name, what in cases:
        d = tmp_path / where
        d.mkdir()
        target = d / name
        if where == "link":
            target.symlink_to("/no/such/file")
        else:
            target.mkdir()
        proc = _serve("--data-dir", str(d), "--http-addr", "127.0.0.1:0")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"error: cannot use the node's database {d}/db.sqlite: {target} is {what}, where "
            "SQLite keeps a file; move it away or start the node on another --data-dir\n"
        )
        assert sorted(p.name for p in d.iterdir()) == sorted([target.name, "litecdc.lock"])
