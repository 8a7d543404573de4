"""Real etcd processes for system tests: one member or a 3-member cluster on 127.0.0.1.

Each member is Debian's ``etcd`` binary (``scripts/setup-system.sh`` installs it) started
on free loopback ports with its data in a directory of its own. ``start()`` returns once
every member answers ``GET /health``; ``close()`` stops them (SIGTERM, then SIGKILL) and
removes their data. Helpers send kill -9, SIGSTOP and SIGCONT to one member::

    with EtcdCluster(tmp_path / "etcd", size=3) as cluster:
        client = EtcdClient(EtcdSettings(endpoints=cluster.endpoints))
        cluster.members[0].pause()      # SIGSTOP: the member hangs, its peers go on
        cluster.members[0].resume()     # SIGCONT
        cluster.members[1].kill()       # kill -9
        cluster.members[1].start()      # restarts on the same data and ports

With ``tls=CertFiles`` (see ``fakes.make_certs``) members serve clients over HTTPS and
require a client certificate signed by the test CA.

Run as a script, the module is an election candidate in a process of its own, so a test
can kill -9 or SIGSTOP a leader::

    python etcd_cluster.py candidate --endpoints 127.0.0.1:2379 --cluster c --node-id n1

It prints ``leader <fence_revision>`` / ``follower`` lines on every change of leadership.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fakes import CertFiles

ETCD_BINARY = shutil.which("etcd") or "/usr/bin/etcd"
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 5.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EtcdMember:
    """One etcd process: its ports, data directory, log file and signals."""

    def __init__(
        self,
        name: str,
        base_dir: Path,
        *,
        client_port: int,
        peer_port: int,
        tls: CertFiles | None = None,
    ) -> None:
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = base_dir / f"{name}.data"
        self.log_path = base_dir / f"{name}.log"
        self.tls = tls
        self.initial_cluster = ""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT``, as litecdc's ``--etcd`` option takes it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self) -> list[str]:
        cmd = [
            ETCD_BINARY,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"litecdc-test-{os.getpid()}",
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            "--logger", "zap",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.tls is not None:
            cmd += [
                "--cert-file", str(self.tls.server_cert),
                "--key-file", str(self.tls.server_key),
                "--trusted-ca-file", str(self.tls.ca_cert),
                "--client-cert-auth",
            ]  # fmt: skip
        return cmd

    def start(self) -> None:
        """Start the process (again, after a kill, on the same data and ports)."""
        if self.running():
            return
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        """True when this member answers ``/health`` with ``"health": "true"``."""
        context: ssl.SSLContext | None = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca_cert))
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health", timeout=1.0, context=context
            ) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError(f"etcd {self.name} exited at start:\n{self.log_tail()}")
            if self.healthy():
                return
            time.sleep(0.05)
        raise RuntimeError(f"etcd {self.name} not healthy after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """kill -9: no clean shutdown; ``start()`` brings it back on the same data."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a stopped process must be able to die
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)

    def pause(self) -> None:
        """SIGSTOP: the member stops answering, its connections stay open. Returns once
        every thread of it is stopped: a signal takes effect a little after it is sent,
        and a request sent in between was still served (CI: a write meant for the paused
        member was applied)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.process.pid}/task")
        deadline = time.monotonic() + 10
        while not all(_stopped(task) for task in tasks.iterdir()):
            assert time.monotonic() < deadline, f"etcd {self.process.pid} did not stop"
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM (after SIGCONT, in case it is paused), then kill -9 if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)


class EtcdCluster:
    """``size`` etcd members forming one cluster (``size=1``: a single member)."""

    def __init__(self, base_dir: Path, *, size: int = 1, tls: CertFiles | None = None) -> None:
        self.base_dir = base_dir
        base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [
            EtcdMember(
                f"etcd{i}", base_dir, client_port=free_port(), peer_port=free_port(), tls=tls
            )
            for i in range(size)
        ]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = initial

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self) -> EtcdCluster:
        for member in self.members:
            member.start()
        try:
            for member in self.members:
                member.wait_healthy()
        except BaseException:
            self.close()
            raise
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> None:
        """Wait until every running member reports healthy (e.g. after a resume)."""
        for member in self.members:
            if member.running():
                member.wait_healthy(timeout)

    def close(self) -> None:
        for member in self.members:
            member.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# --- an election candidate in its own process ------------------------------------------


def run_candidate(argv: list[str]) -> int:
    from litecdc.cluster import Election, EtcdClient, EtcdSettings

    parser = argparse.ArgumentParser(prog="candidate")
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--address", default="http://127.0.0.1:1")
    parser.add_argument("--ttl", type=int, default=2)
    args = parser.parse_args(argv)

    client = EtcdClient(EtcdSettings(endpoints=args.endpoints.split(",")))
    election = Election(client, args.cluster, args.node_id, args.address, ttl=args.ttl)

    def report(leader: bool) -> None:
        line = f"leader {election.fence_revision}" if leader else "follower"
        print(line, flush=True)

    election.add_listener(report)
    election.start()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    election.close()
    client.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "candidate":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        sys.exit(run_candidate(sys.argv[2:]))
    sys.exit("usage: etcd_cluster.py candidate --endpoints E --cluster C --node-id N")


def _stopped(task: Path) -> bool:
    """Whether a thread (/proc/PID/task/TID) is stopped by a signal (state T)."""
    try:
        stat = (task / "stat").read_text()
    except FileNotFoundError:  # (the thread ended)
        return True
    return stat[stat.rindex(")") + 2] == "T"
