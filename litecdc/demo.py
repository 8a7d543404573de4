"""The scripted demo behind ``make run``: a real standalone node, a short workload,
and what litecdc recorded for it (journal entries and captured row changes).

It starts ``litecdc serve`` as a separate process on a free port, talks to it
only over the rqlite-compatible HTTP API, and stops it at the end.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

Echo = Callable[[str], None]

WORKLOAD: list[tuple[str, list[Any]]] = [
    (
        "create the table",
        [
            "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount REAL, "
            "created TEXT DEFAULT CURRENT_TIMESTAMP)",
        ],
    ),
    (
        "insert three orders (one transaction)",
        [
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "ada", 12.5],
            ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "grace", 0.1],
            ["INSERT INTO orders(customer, amount) VALUES(:c, :a)", {"c": "linus", "a": 99.99}],
        ],
    ),
    (
        "update one, delete one",
        [
            ["UPDATE orders SET amount = amount * 2 WHERE customer = ?", "ada"],
            "DELETE FROM orders WHERE customer = 'grace'",
        ],
    ),
    (
        "a failing statement commits nothing",
        [
            "INSERT INTO orders(customer) VALUES(NULL)",
        ],
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_node(data_dir: Path, port: int) -> Iterator[str]:
    """Start ``litecdc serve`` and yield its base URL once /readyz answers 200."""
    command = [
        sys.executable,
        "-m",
        "litecdc",
        "serve",
        "--data-dir",
        str(data_dir),
        "--http-addr",
        f"127.0.0.1:{port}",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                error = process.stderr.read().decode() if process.stderr else ""
                raise RuntimeError(f"litecdc serve exited with {process.returncode}: {error}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("litecdc serve did not become ready within 30 s")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_demo(echo: Echo, data_dir: Path | None = None) -> int:
    """Run the demo; returns a process exit code (0 when every check held)."""
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="litecdc-demo-"))
            )
        port = free_port()
        echo(f"starting a standalone litecdc node on 127.0.0.1:{port} (data in {data_dir})")
        base = stack.enter_context(running_node(data_dir, port))
        client = stack.enter_context(httpx.Client(base_url=base, timeout=10))
        for title, statements in WORKLOAD:
            response = client.post("/db/execute", params={"transaction": ""}, json=statements)
            response.raise_for_status()
            echo(f"\n$ POST /db/execute?transaction  # {title}")
            echo(json.dumps(response.json()))
        rows = client.get("/db/query", params={"q": "SELECT * FROM orders", "associative": ""})
        echo("\n$ GET /db/query?q=SELECT * FROM orders&associative")
        echo(json.dumps(rows.json()))

        journal = client.get("/journal", params={"after": 0, "limit": 100}).json()
        echo(f"\njournal (available snapshot {journal['available_snapshot']}):")
        for entry in journal["entries"]:
            query = "<initial record>" if entry["query"] == "" else entry["query"]
            query = "<empty entry>" if query is None else query.replace("\n", "\n" + " " * 22)
            echo(f"  cid {entry['cid']:>2}  snapshot {entry['snapshot']:>2}  {query}")
        changes = client.get("/cdc/changes", params={"after": 0, "limit": 100}).json()["changes"]
        echo(f"\ncaptured row changes ({len(changes)}):")
        for change in changes:
            echo(
                f"  cid {change['cid']:>2}.{change['seq']}  {change['op']:<6} {change['table']}"
                f"  before={json.dumps(change['before'])}  after={json.dumps(change['after'])}"
            )

        problems = _check(journal, changes)
        for problem in problems:
            echo(f"CHECK FAILED: {problem}")
        if not problems:
            echo(
                "\nok: 3 committed transactions -> 3 journal entries after the initial record, "
                "5 row changes; the failed one left nothing"
            )
        return 1 if problems else 0
    return 1


def _check(journal: dict[str, Any], changes: list[dict[str, Any]]) -> list[str]:
    problems = []
    cids = [e["cid"] for e in journal["entries"]]
    if cids != [1, 2, 3, 4]:
        problems.append(f"expected journal cids 1-4, got {cids}")
    ops = [c["op"] for c in changes]
    if ops != ["insert", "insert", "insert", "update", "delete"]:
        problems.append(f"unexpected change ops {ops}")
    return problems


def main() -> None:  # pragma: no cover - ``python -m litecdc.demo``
    sys.exit(run_demo(print))


if __name__ == "__main__":  # pragma: no cover
    main()
