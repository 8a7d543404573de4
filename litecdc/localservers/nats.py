"""A throwaway NATS server with JetStream from Debian's ``nats-server``."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from litecdc.localservers.process import (
    LocalServer,
    ServerProcess,
    ServerUnavailableError,
    find_binary,
    free_port,
)


class NATSServer(LocalServer):
    """``with NATSServer() as nats: nats.url`` → nats://127.0.0.1:PORT, JetStream on."""

    def __init__(self, *, start_timeout: float = 30.0) -> None:
        self.binary = find_binary(["nats-server"], "NATS server (nats-server)")
        self.start_timeout = start_timeout
        self.port = 0
        self.base_dir: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="litecdc-nats-"))
        for attempt in range(3):
            self.port = free_port()
            self._process = ServerProcess(
                [
                    *(self.binary, "-a", "127.0.0.1", "-p", str(self.port)),
                    *("-js", "-sd", str(self.base_dir / "jetstream")),
                    *("-n", f"litecdc-test-{self.port}"),
                ],
                probe=self._ready,
                log_path=self.base_dir / "server.log",
                timeout=self.start_timeout,
            )
            try:
                self._process.start_or_explain("NATS")
                return
            except ServerUnavailableError:
                if attempt == 2:
                    raise

    def _ready(self) -> bool:
        # The server greets every client with an INFO line once it accepts connections;
        # JetStream is up by then (it is enabled before the client listener opens).
        with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            return sock.recv(4096).startswith(b"INFO ")
