"""The ``litecdc pipeline`` CLI as real processes, and writers that load a node over HTTP,
for the pipeline's end-to-end tests (tests/pipeline/test_pipeline_e2e.py)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from e2e.litecdc_node import Node

from litecdc.pipeline.metadata import MetadataStore, Progress

if TYPE_CHECKING:
    from litecdc.pipeline.server import PipelineServer

#: one `pipeline run --until-caught-up` may take this long (Spark start-up is ~8 s here)
RUN_TIMEOUT = 240.0
MASTER = "local[2]"


class PipelineCLI:
    """``python -m litecdc pipeline …`` against one metadata store (``--meta``)."""

    def __init__(self, meta: str, workdir: Path) -> None:
        self.meta = meta
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._background = 0  # runs started, to name their logs

    def _cmd(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "litecdc", "pipeline", command, "--meta", self.meta, *args]

    def call(
        self, command: str, *args: str, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self._cmd(command, *args),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, command: str, *args: str, timeout: float = 60.0) -> str:
        done = self.call(command, *args, timeout=timeout)
        assert done.returncode == 0, _describe(done)
        return done.stdout

    def subscribe(self, name: str, source: str, table: str, sink: str, *extra: str) -> str:
        return self.ok(
            "subscribe", "--source", source, "--table", table, "--name", name, "--sink", sink,
            *extra,
        )  # fmt: skip

    def run_until_caught_up(self, *extra: str) -> subprocess.CompletedProcess[str]:
        """``pipeline run --until-caught-up``; asserts exit 0 and returns the process."""
        done = self.call(
            "run", "--master", MASTER, "--until-caught-up", "--quiet", "--poll-interval", "0.2",
            *extra, timeout=RUN_TIMEOUT,
        )  # fmt: skip
        self._background += 1  # kept beside the background runs' logs, for debugging
        (self.workdir / f"run-{self._background}.log").write_text(done.stderr + done.stdout)
        assert done.returncode == 0, _describe(done)
        assert "every subscription has caught up" in done.stdout, _describe(done)
        return done

    def start(self, *extra: str) -> Background:
        """``pipeline run`` (runs until killed) in its own process group."""
        self._background += 1
        log_path = self.workdir / f"run-{self._background}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            self._cmd("run", "--master", MASTER, "--quiet", "--poll-interval", "0.2", *extra),
            cwd=self.workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return Background(proc, log_path)

    def verify(self, name: str) -> subprocess.CompletedProcess[str]:
        return self.call("verify", name, timeout=120.0)

    def assert_verified(self, name: str) -> str:
        done = self.verify(name)
        assert done.returncode == 0, _describe(done)
        assert " 0 difference(s)" in done.stdout, done.stdout
        return done.stdout

    def progress(self, name: str) -> Progress:
        store = MetadataStore.open(self.meta)
        try:
            return store.progress(name)
        finally:
            store.close()


class Background:
    """A ``pipeline run`` process started in its own session (so its Spark JVM and Python
    workers are in its process group)."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.proc = proc
        self.log_path = log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL the whole process group: driver, JVM and Python workers at once."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        # the JVM and workers are in the same group; make sure nothing lingers
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def wait_for(self, check: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        """Poll ``check()`` until truthy while the process is running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive(), (
                f"pipeline run exited early ({self.proc.returncode}):\n{self.log()}"
            )
            value = check()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}:\n{self.log()[-4000:]}")


def _describe(done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{done.args!r} exited {done.returncode}\n--- stdout\n{done.stdout[-4000:]}"
        f"\n--- stderr\n{done.stderr[-8000:]}"
    )


# -- writing to the node ------------------------------------------------------------------
def param(value: Any) -> Any:
    """A statement parameter: BLOBs go as arrays of byte values."""
    if isinstance(value, bytes):
        return list(value)
    return value


def execute(
    client: httpx.Client, statements: list[Any], *, transaction: bool = True
) -> list[dict[str, Any]]:
    """Run statements (``"SQL"`` or ``["SQL", *params]``); assert none failed."""
    body = [s if isinstance(s, str) else [s[0], *[param(v) for v in s[1:]]] for s in statements]
    params = {"transaction": ""} if transaction else {}
    r = client.post("/db/execute", params=params, json=body)
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    errors = [x["error"] for x in results if "error" in x]
    assert not errors, errors[:5]
    return results


def rounds_until_caught_up(server: PipelineServer, node: Node, name: str) -> None:
    """``server.run_round()`` until subscription ``name`` has applied every change
    committed at ``node`` now, failing on its first error — as a `pipeline run` that keeps
    running does (``run()`` closes the server's connections when it returns)."""
    with node.client() as c:
        head = int(c.get("/status").json()["store"]["last_cid"])
    for _ in range(500):
        server.run_round()
        state = server.states[name]
        assert state.last_error is None, state.last_error
        if state.stage == "incremental" and state.applied_cid >= head:
            return
    raise AssertionError(f"not caught up: {server.states[name]}")


def wait_until_pruned_past(node: Node, name: str, applied: int, timeout: float = 30.0) -> None:
    """Until ``node`` (started with a small ``--retention-cids``) has expired subscription
    ``name``'s hold and pruned its change log past ``applied``: the position is gone."""
    from litecdc.pipeline.source_client import SourceClient

    deadline = time.monotonic() + timeout
    with SourceClient([node.url]) as client:
        while True:
            holds = client.subscriptions()
            hold = holds.get(name)
            if hold is not None and hold.expired and holds.pruned_cid > applied:
                return
            assert time.monotonic() < deadline, holds
            time.sleep(0.2)


def scalar(client: httpx.Client, sql: str) -> Any:
    r = client.get("/db/query", params={"q": sql})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]["values"][0][0]


class Writer(threading.Thread):
    """Inserts, updates and deletes on ``table`` (``id INTEGER PRIMARY KEY``) over HTTP
    until stopped: one small transaction per request."""

    def __init__(
        self, node: Node, table: str, make_row: Callable[[int], list[Any]], id_range: range,
        new_ids: range,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.node = node
        self.table = table
        self.make_row = make_row
        self.id_range = id_range
        self.new_ids = iter(new_ids)
        self.commits = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._rng = random.Random(7)

    def run(self) -> None:
        rng = self._rng
        try:
            with self.node.client() as c:
                while not self._stop_event.is_set():
                    a, b = rng.choice(self.id_range), rng.choice(self.id_range)
                    row = self.make_row(next(self.new_ids))
                    marks = ", ".join("?" for _ in row)
                    execute(
                        c,
                        [
                            [f"INSERT INTO {self.table} VALUES({marks})", *row],
                            [f"UPDATE {self.table} SET name = ?, price = ? WHERE id = ?",
                             f"writer ✓ {self.commits}", rng.random() * 1e6, a],
                            [f"DELETE FROM {self.table} WHERE id = ?", b],
                        ],
                    )  # fmt: skip
                    self.commits += 1
                    time.sleep(0.01)
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def stop(self) -> int:
        self._stop_event.set()
        self.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"writer failed: {self.error!r}") from self.error
        return self.commits
