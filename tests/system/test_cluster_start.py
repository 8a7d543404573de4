"""What a `litecdc serve` node checks at start-up before it joins a cluster, with real
processes over a real etcd: the checks wait for etcd rather than being skipped, and a
cluster member's data directory is not run standalone by accident.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.litecdc_node import Node, free_port, serve_cli
from etcd_cluster import EtcdCluster
from serve_cluster import rows as _rows
from serve_cluster import wait as _wait

WAITING = "does not answer"


class _Process:
    """A `litecdc serve` process started in the background, its output in a file."""

    def __init__(self, log_path: Path, *args: str) -> None:
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "litecdc", "serve", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": "/usr/bin:/bin"},  # no LITECDC_* from outside
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self) -> int:
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    """An etcd of this test's own: the test stops and restarts it."""
    with EtcdCluster(tmp_path / "etcd", size=1) as cluster:
        yield cluster


def test_a_first_start_while_etcd_is_down_waits_for_the_checks(
    tmp_path: Path, own_etcd: EtcdCluster
) -> None:
    """Before, a node that could not reach etcd at its first start skipped its checks,
    called itself the founder and tied its directory to the cluster — and the checks never
    ran again: a node with --fk joined a cluster without it (an FK-violating insert became
    an empty entry on it only) and a standalone directory's own data joined (cluster QA).
    Now it waits for etcd, saying so, and is refused once etcd answers; a node that passes
    joins then."""
    endpoint = own_etcd.endpoints[0]
    cluster = ("--etcd", endpoint, "--cluster", "c1")
    founder = Node(tmp_path / "a", *cluster, "--node-id", "a").start()
    try:
        with founder.client() as c:
            cid = founder.execute(
                c,
                [
                    "CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)",
                    "INSERT INTO kv(v) VALUES('a')",
                ],
            )["raft_index"]
    finally:
        assert founder.stop() == 0
    stranger_dir = tmp_path / "c"
    standalone = Node(stranger_dir).start()
    with standalone.client() as c:
        standalone.execute(
            c, ["CREATE TABLE kv(id INTEGER PRIMARY KEY, v TEXT)", "INSERT INTO kv(v) VALUES('c')"]
        )
    assert standalone.stop() == 0

    own_etcd.members[0].stop()
    joining: dict[str, _Process] = {}
    for name, extra in (("b", ("--fk",)), ("c", ()), ("d", ())):
        joining[name] = _Process(
            tmp_path / f"{name}.log", "--data-dir", str(tmp_path / name),
            "--http-addr", f"127.0.0.1:{free_port()}", *cluster, "--node-id", name, *extra,
        )  # fmt: skip
    try:
        for name, process in joining.items():
            _wait(lambda p=process: WAITING in p.log(), f"node {name} to wait for etcd")
            assert process.proc.poll() is None, process.log()
            assert not (tmp_path / name / "cluster").exists()  # not tied to the cluster yet
        log = joining["b"].log()
        assert f"cluster c1: etcd at {endpoint} does not answer" in log, log
        assert "node b checks its node id, the cluster's settings and its data" in log, log

        own_etcd.members[0].start()
        own_etcd.wait_healthy()
        assert joining["b"].wait() == 2, joining["b"].log()
        assert (
            "error: cluster 'c1' runs without --fk; every node must do the same"
            in joining["b"].log()
        )
        assert joining["c"].wait() == 2, joining["c"].log()
        assert (
            f"error: data directory {stranger_dir} already holds data (journal up to cid 2, "
            "1 table(s)) that did not come from cluster 'c1'" in joining["c"].log()
        )
        for name in ("b", "c"):
            assert not (tmp_path / name / "cluster").exists()
        # the node that passes the checks joins: it has the founder's data
        assert joining["d"].proc.poll() is None
        assert (tmp_path / "d" / "cluster").read_text() == "c1\n"
    finally:
        for process in joining.values():
            process.stop()
    member = Node(tmp_path / "d", *cluster, "--node-id", "d")
    member.start()  # the cluster has a leader again
    try:
        assert _rows(member, cid) == [[1, "a"]]
    finally:
        member.stop()


def test_a_node_waiting_for_etcd_at_start_stops_on_sigterm(tmp_path: Path) -> None:
    """A node waits for etcd at start as long as it takes; a SIGTERM meanwhile killed it
    without a word, its WAL left behind (config QA). It stops as a serving node does:
    says so, closes its store and exits 0 — and the new data directory goes, as after a
    refused start."""
    process = _Process(
        tmp_path / "n.log", "--data-dir", str(tmp_path / "n"),
        "--http-addr", f"127.0.0.1:{free_port()}",
        "--etcd", f"127.0.0.1:{free_port()}", "--node-id", "n",  # (no etcd there)
    )  # fmt: skip
    try:
        _wait(lambda: WAITING in process.log(), "the node to wait for etcd")
        process.proc.terminate()
        assert process.wait() == 0, process.log()
    finally:
        process.stop()
    assert "litecdc node n stopped while starting: it served nothing" in process.log()
    assert "Traceback" not in process.log()
    assert not (tmp_path / "n").exists()


def test_a_cluster_members_directory_is_not_run_standalone_by_accident(
    tmp_path: Path, own_etcd: EtcdCluster
) -> None:
    """Started without --etcd, a member's data directory ran standalone, took writes the
    cluster never saw and forked (cluster QA). It is refused; detaching it on purpose is
    deleting DATA_DIR/cluster."""
    data_dir = tmp_path / "n0"
    member = Node(data_dir, "--etcd", own_etcd.endpoints[0], "--cluster", "c1", "--node-id", "n0")
    member.start()
    assert member.stop() == 0
    claim = data_dir / "cluster"
    proc = serve_cli(
        "--data-dir", str(data_dir), "--http-addr", f"127.0.0.1:{free_port()}",
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"error: data directory {data_dir} belongs to cluster 'c1' (see {claim}): start it "
        "with --etcd and --cluster c1; to run it standalone instead, detach it for good by "
        f"deleting {claim} (its data then goes its own way and cannot rejoin the cluster)\n"
    )
    for garbage in (b"\xff\xfe", b"", b"\n"):  # config QA: a traceback, advice naming ''
        claim.write_bytes(garbage)
        proc = serve_cli(
            "--data-dir", str(data_dir), "--http-addr", f"127.0.0.1:{free_port()}",
            env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (
            f"error: {claim} holds no cluster name (it is written with the name of the cluster "
            "the data directory belongs to): write that name into it, or delete it to detach "
            "the directory from its cluster (see docs/cluster.md)\n"
        )
    claim.unlink()  # detached on purpose
    standalone = Node(data_dir).start()
    with standalone.client() as c:
        standalone.execute(c, ["CREATE TABLE t(x)"])
    assert standalone.stop() == 0
