"""A throwaway RabbitMQ node from Debian's ``rabbitmq-server``.

Each node is kept apart from any other on the machine (a system service, a parallel test
run): its own node name, AMQP and distribution ports, data/log dirs, HOME (for the Erlang
cookie) and its own epmd on a free port (ERL_EPMD_PORT), stopped with the node — so it
neither uses nor leaves behind the shared epmd on 4369. /etc/rabbitmq is not read.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pika

from litecdc.localservers.process import (
    LocalServer,
    ServerProcess,
    ServerUnavailableError,
    find_binary,
    free_port,
    port_open,
)

# The script that runs the node in the foreground (/usr/sbin/rabbitmq-server only wraps it
# to switch to the rabbitmq account).
RABBITMQ_SCRIPT_GLOBS = ["/usr/lib/rabbitmq/bin/rabbitmq-server"]
RABBITMQCTL_GLOBS = ["/usr/lib/rabbitmq/bin/rabbitmqctl"]


class RabbitMQServer(LocalServer):
    """``with RabbitMQServer() as mq: mq.url`` → amqp://guest:guest@127.0.0.1:PORT/."""

    def __init__(self, *, start_timeout: float = 90.0) -> None:
        self.script = find_binary([], "RabbitMQ server (rabbitmq-server)", RABBITMQ_SCRIPT_GLOBS)
        self.epmd = find_binary(["epmd"], "Erlang port mapper (epmd, from rabbitmq-server)")
        self.start_timeout = start_timeout
        self.port = 0
        self.base_dir: Path | None = None
        self._epmd: ServerProcess | None = None
        self._env: dict[str, str] = {}

    @property
    def startup_seconds(self) -> float:
        if self._process is None:
            return 0.0
        return self._process.startup_seconds + (self._epmd.startup_seconds if self._epmd else 0)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> None:
        base = self.base_dir = Path(tempfile.mkdtemp(prefix="litecdc-rabbitmq-"))
        (base / "home").mkdir()
        epmd_port = free_port()
        self._epmd = ServerProcess(
            [self.epmd, "-port", str(epmd_port), "-address", "127.0.0.1"],
            probe=lambda: port_open(epmd_port),
            log_path=base / "epmd.log",
            timeout=10,
        )
        self._epmd.start_or_explain("epmd")
        for attempt in range(2):
            self.port = free_port()
            name = f"litecdc-{uuid.uuid4().hex[:8]}@localhost"
            env = {
                "HOME": str(base / "home"),
                "ERL_EPMD_PORT": str(epmd_port),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
                "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
                "RABBITMQ_NODENAME": name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(free_port()),
                "RABBITMQ_MNESIA_BASE": str(base / f"mnesia-{attempt}"),
                "RABBITMQ_LOG_BASE": str(base / "log"),
                "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
                "RABBITMQ_LOGS": "-",
            }
            self._env = env
            (base / "enabled_plugins").write_text("[].\n")
            self._process = ServerProcess(
                [self.script],
                probe=self._ready,
                log_path=base / "server.log",
                timeout=self.start_timeout,
                envvars=env,
                cwd=str(base),
            )
            try:
                self._process.start_or_explain("RabbitMQ")
                return
            except ServerUnavailableError:
                if attempt == 1:
                    raise

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl ARGS`` against this node (its name, cookie and epmd) and return
        what it printed; ServerUnavailableError when it fails."""
        if not self._env:
            raise ServerUnavailableError("RabbitMQ: ctl() before start()")
        ctl = find_binary(["rabbitmqctl"], "rabbitmqctl (from rabbitmq-server)", RABBITMQCTL_GLOBS)
        done = subprocess.run(
            [ctl, "-n", self._env["RABBITMQ_NODENAME"], *args],
            env={**os.environ, **self._env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise ServerUnavailableError(
                f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}"
            )
        return done.stdout

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        params = pika.URLParameters(self.url + "?connection_attempts=1&socket_timeout=2")
        pika.BlockingConnection(params).close()
        return True

    def _stop_processes(self) -> None:
        super()._stop_processes()
        if self._epmd is not None:  # after the node that registered with it
            self._epmd.stop_quietly()
            self._epmd = None
