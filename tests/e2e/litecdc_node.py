"""The real ``litecdc serve`` process on a free 127.0.0.1 port, for end-to-end tests."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

STARTUP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Node:
    """One ``python -m litecdc serve`` process; ``url`` is its base URL."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        https: bool = False,
        verify: Any = True,
        port: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.port = port or free_port()
        self.scheme = "https" if https else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.verify = verify
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-{self.port}.log"

    def start(self) -> Node:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "litecdc",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--http-addr",
            f"127.0.0.1:{self.port}",
            *self.extra,
        ]
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"litecdc exited with {self.proc.returncode}: {self.log()}")
            try:
                r = httpx.get(f"{self.url}/readyz", verify=self.verify, timeout=1.0)
                if r.status_code in (200, 401):  # 401: up, but readyz needs a permission
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"litecdc did not become ready: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM, then wait; returns the exit code (0 = shut down cleanly)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                # every thread's stack into the node's log first: where it hung
                self.proc.send_signal(signal.SIGUSR1)
                time.sleep(1)
                self.proc.kill()
                self.proc.wait(timeout=5)
                self._log.flush()
                tail = self.log_path.read_text(errors="replace").splitlines()[-120:]
                print(
                    f"node did not stop within 15 s; the end of {self.log_path}:",
                    *tail, sep="\n", file=sys.stderr,
                )  # fmt: skip
        code = self.proc.returncode
        self.proc = None
        self._log.close()
        return code

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("verify", self.verify)
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)

    # conveniences for tests ---------------------------------------------------------
    def execute(self, client: httpx.Client, statements: list[Any], **params: Any) -> Any:
        r = client.post("/db/execute", params=params, json=statements)
        assert r.status_code == 200, r.text
        return r.json()

    def query(self, client: httpx.Client, sql: str, **params: Any) -> Any:
        r = client.get("/db/query", params={"q": sql, **params})
        assert r.status_code == 200, r.text
        return r.json()


def dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def serve_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m litecdc serve ARGS`` run to its end (for start-up errors)."""
    return subprocess.run(
        [sys.executable, "-m", "litecdc", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
