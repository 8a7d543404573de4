"""The scripted demo behind ``make run``: the whole flow on the embedded default.

1. a real standalone node (``litecdc serve`` as a separate process on a free port,
   driven only over its HTTP API) whose CDC service pushes every row change to a
   webhook receiver running in this process;
2. a short workload, and what litecdc recorded for it (journal entries and captured
   row changes);
3. the Spark pipeline (``litecdc.pipeline.demo``) keeping a Delta Lake mirror and a
   PostgreSQL copy of the table exact through a bulk load and a burst of changes,
   ending with ``verify``; and the webhook's count of the events it received.

``pipeline=False`` (``litecdc demo --no-pipeline``) stops after step 2.

With ``cluster=True`` (``litecdc demo --cluster``) it starts its own etcd (Debian's
``etcd`` binary, one member on free ports) and three ``litecdc serve --etcd`` nodes,
writes through a follower, kills the leader (kill -9), shows the new leader taking
writes, and checks that the survivors hold identical journal entries and changes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
def running_node(data_dir: Path, port: int, cdc: str | None = None) -> Iterator[str]:
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
        *(["--cdc-config", cdc] if cdc else []),
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


class WebhookCounter:
    """A webhook receiver for the demo: counts the row events the node pushes to it."""

    def __init__(self) -> None:
        self.events = 0
        self.requests = 0
        self._lock = threading.Lock()
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                doc = json.loads(body)
                with counter._lock:
                    counter.requests += 1
                    counter.events += sum(len(p["events"]) for p in doc["payload"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, events: int, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.events >= events:
                    return True
            time.sleep(0.1)
        return False


def run_demo(
    echo: Echo, data_dir: Path | None = None, cluster: bool = False, pipeline: bool = True
) -> int:
    """Run the demo; returns a process exit code (0 when every check held).

    ``cluster=True`` runs the 3-node cluster demo instead (see the module docstring).
    """
    if cluster:
        return run_cluster_demo(echo, data_dir)
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="litecdc-demo-"))
            )
        hook = stack.enter_context(WebhookCounter())
        port = free_port()
        echo(f"starting a standalone litecdc node on 127.0.0.1:{port} (data in {data_dir})")
        echo(f"  its CDC service pushes every row change to a webhook at {hook.url}")
        # the delivered changes stay readable at /cdc/changes for the listing below: the
        # high watermark (which prunes them) is written every minute, not every second
        data_dir.mkdir(parents=True, exist_ok=True)
        cdc_config = data_dir / "cdc.json"
        cdc_config.write_text(json.dumps({"endpoint": hook.url, "high_watermark_interval": "60s"}))
        base = stack.enter_context(running_node(data_dir, port, cdc=str(cdc_config)))
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
        # litecdc's own entries (the CDC service's state) are not the workload's
        journal["entries"] = [e for e in journal["entries"] if not e.get("internal")]
        echo(f"\njournal (available snapshot {journal['available_snapshot']}; litecdc's own")
        echo("internal entries left out):")
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
        if not problems:
            echo(
                "\nok: 3 committed transactions -> 3 journal entries after the initial record, "
                "5 row changes; the failed one left nothing"
            )
        events = len(changes)
        if pipeline and not problems:
            from litecdc.pipeline.demo import run_pipeline_demo

            differences, written = run_pipeline_demo(echo, base, data_dir)
            events += written
            if differences:
                problems.append(f"verify found {differences} difference(s)")
        if not hook.wait_for(events):
            problems.append(f"the webhook received {hook.events} of {events} row events")
        else:
            echo(
                f"\nthe webhook received all {hook.events:,} row events ({hook.requests} requests)"
            )
        for problem in problems:
            echo(f"CHECK FAILED: {problem}")
        if not problems:
            echo("ok: every check held")
        return 1 if problems else 0
    return 1


def _check(journal: dict[str, Any], changes: list[dict[str, Any]]) -> list[str]:
    problems = []
    cids = [e["cid"] for e in journal["entries"]]
    if len(cids) != 4 or cids[0] != 1:
        problems.append(f"expected the initial record and 3 entries, got cids {cids}")
    ops = [c["op"] for c in changes]
    if ops != ["insert", "insert", "insert", "update", "delete"]:
        problems.append(f"unexpected change ops {ops}")
    return problems


# -- the cluster demo ------------------------------------------------------------------------

CLUSTER_NAME = "demo"
ETCD_BINARY = "etcd"
CLUSTER_WAIT_S = 30.0

CLUSTER_WORKLOAD: list[Any] = [
    "CREATE TABLE orders(id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount REAL)",
    ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "ada", 12.5],
    ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "grace", 0.1],
]
AFTER_FAILOVER: list[Any] = [
    ["INSERT INTO orders(customer, amount) VALUES(?, ?)", "linus", 99.99],
    ["UPDATE orders SET amount = amount * 2 WHERE customer = ?", "ada"],
]


class _Process:
    """A child process whose output goes to a log file (its tail goes into errors)."""

    def __init__(self, name: str, command: list[str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def exited(self) -> str | None:
        """None while running, else what the process said before it exited."""
        if self.popen.poll() is None:
            return None
        tail = self.log_path.read_text(errors="replace")[-1500:]
        return f"{self.name} exited with {self.popen.returncode}: {tail}"

    def kill(self) -> None:
        """kill -9."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def stop(self) -> None:
        """SIGTERM, then kill -9 after 10 s."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _wait_for(what: str, check: Callable[[], Any], processes: list[_Process]) -> Any:
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while True:
        for process in processes:
            problem = process.exited()
            if problem:
                raise RuntimeError(problem)
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {CLUSTER_WAIT_S:.0f} s waiting for {what}")
        time.sleep(0.05)


def _start_etcd(root: Path, stack: contextlib.ExitStack) -> tuple[str, _Process]:
    """One etcd member on free 127.0.0.1 ports, data in ``root/etcd``; its endpoint."""
    binary = shutil.which(ETCD_BINARY)
    if binary is None:
        raise RuntimeError(
            "etcd is not installed: the cluster demo needs Debian's etcd-server "
            "(run `bash scripts/setup-system.sh` as root, or `apt-get install etcd-server`)"
        )
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    command = [
        binary,
        "--name", "demo",
        "--data-dir", str(root / "etcd"),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"demo={peer}",
        "--logger", "zap",
        "--log-level", "warn",
    ]  # fmt: skip
    etcd = _Process("etcd", command, root / "etcd.log")
    stack.callback(etcd.stop)

    def healthy() -> bool:
        return bool(httpx.get(f"{client}/health", timeout=1).json().get("health") == "true")

    _wait_for("etcd to answer /health", healthy, [etcd])
    return client.removeprefix("http://"), etcd


def _start_cluster_node(
    root: Path, index: int, etcd: str, stack: contextlib.ExitStack
) -> tuple[str, _Process]:
    port = free_port()
    command = [
        sys.executable, "-m", "litecdc", "serve",
        "--data-dir", str(root / f"n{index}"),
        "--http-addr", f"127.0.0.1:{port}",
        "--node-id", f"n{index}",
        "--etcd", etcd,
        "--cluster", CLUSTER_NAME,
    ]  # fmt: skip
    node = _Process(f"node n{index}", command, root / f"n{index}.log")
    stack.callback(node.stop)
    return f"http://127.0.0.1:{port}", node


def run_cluster_demo(echo: Echo, data_dir: Path | None = None) -> int:
    """The 3-node cluster demo; returns a process exit code (0 when every check held)."""
    problems: list[str] = []
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="litecdc-demo-"))
            )
        data_dir.mkdir(parents=True, exist_ok=True)
        client = stack.enter_context(httpx.Client(timeout=10, trust_env=False))
        etcd, etcd_process = _start_etcd(data_dir, stack)
        echo(f"started etcd on {etcd} (one member; data and logs in {data_dir})")
        nodes: dict[str, tuple[str, _Process]] = {}
        for i in range(3):
            nodes[f"n{i}"] = _start_cluster_node(data_dir, i, etcd, stack)
        processes = [etcd_process, *(process for _, process in nodes.values())]
        for node_id, (url, _) in nodes.items():
            echo(
                f"started litecdc serve --node-id {node_id} --http-addr {url[7:]} "
                f"--etcd {etcd} --cluster {CLUSTER_NAME}"
            )

        def status(url: str) -> dict[str, Any]:
            cluster: dict[str, Any] = client.get(f"{url}/status").json()["cluster"]
            return cluster

        def one_leader(candidates: list[str]) -> str | None:
            leaders = [n for n in candidates if status(nodes[n][0])["is_leader"]]
            return leaders[0] if len(leaders) == 1 else None

        def ready() -> bool:
            return all(client.get(f"{url}/readyz").status_code == 200 for url, _ in nodes.values())

        _wait_for("every node to know a leader (/readyz)", ready, processes)
        leader = _wait_for("one leader", lambda: one_leader(list(nodes)), processes)
        follower = next(n for n in nodes if n != leader)
        echo(f"\nleader: {leader}")

        echo(
            f"\n$ POST {follower}/db/execute?transaction&raft_index  # a write through a "
            "follower, forwarded to the leader"
        )
        response = client.post(
            f"{nodes[follower][0]}/db/execute",
            params={"transaction": "", "raft_index": ""},
            json=CLUSTER_WORKLOAD,
        )
        response.raise_for_status()
        echo(json.dumps(response.json()))
        last_cid = int(response.json()["raft_index"])

        def applied_everywhere(names: list[str], cid: int) -> bool:
            return all(status(nodes[n][0])["applied_cid"] >= cid for n in names)

        _wait_for(
            f"cid {last_cid} on every node",
            lambda: applied_everywhere(list(nodes), last_cid),
            processes,
        )
        echo("\n/status, cluster section of each node:")
        for node_id, (url, _) in nodes.items():
            echo(f"  {node_id}: {json.dumps(status(url))}")
        echo(f"\n$ GET {follower}/nodes?pretty  # members refresh their record every 2 s")

        def members_caught_up() -> str | None:
            r = client.get(f"{nodes[follower][0]}/nodes", params={"pretty": ""})
            members = r.json().values()
            return r.text if all(m["applied_cid"] >= last_cid for m in members) else None

        echo(_wait_for("/nodes to show every member's position", members_caught_up, processes))

        echo(f"\nkill -9 the leader {leader} (pid {nodes[leader][1].popen.pid})")
        killed_at = time.monotonic()
        nodes[leader][1].kill()
        processes.remove(nodes[leader][1])
        survivors = [n for n in nodes if n != leader]
        new_leader = _wait_for("a new leader", lambda: one_leader(survivors), processes)
        echo(f"new leader: {new_leader}, {time.monotonic() - killed_at:.1f} s after the kill")
        through = next(n for n in survivors if n != new_leader)

        def write_after() -> httpx.Response | None:
            r = client.post(
                f"{nodes[through][0]}/db/execute",
                params={"transaction": "", "raft_index": ""},
                json=AFTER_FAILOVER,
            )
            return r if r.status_code == 200 else None

        echo(f"\n$ POST {through}/db/execute?transaction&raft_index  # writes continue")
        response = _wait_for("a write on the new leader", write_after, processes)
        echo(json.dumps(response.json()))
        last_cid = int(response.json()["raft_index"])
        _wait_for(
            f"cid {last_cid} on the survivors",
            lambda: applied_everywhere(survivors, last_cid),
            processes,
        )
        query = client.get(
            f"{nodes[through][0]}/db/query",
            params={"q": "SELECT * FROM orders", "associative": "", "level": "none"},
        )
        echo(f"\n$ GET {through}/db/query?q=SELECT * FROM orders&associative&level=none")
        echo(json.dumps(query.json()))

        journals = {
            n: client.get(f"{nodes[n][0]}/journal", params={"after": 1, "limit": 100}).json()[
                "entries"
            ]
            for n in survivors
        }
        changes = {
            n: client.get(f"{nodes[n][0]}/cdc/changes", params={"after": 0, "limit": 100}).json()[
                "changes"
            ]
            for n in survivors
        }
        first = survivors[0]
        echo(f"\njournal on {first} (after its initial record):")
        for entry in journals[first]:
            text = "<empty entry>" if entry["query"] is None else entry["query"]
            text = text.replace("\n", "\n" + " " * 22)
            echo(f"  cid {entry['cid']:>2}  snapshot {entry['snapshot']:>2}  {text}")
        echo(f"\ncaptured row changes on {first} ({len(changes[first])}):")
        for change in changes[first]:
            echo(
                f"  cid {change['cid']:>2}.{change['seq']}  {change['op']:<6} {change['table']}"
                f"  before={json.dumps(change['before'])}  after={json.dumps(change['after'])}"
            )
        same_journal = journals[survivors[0]] == journals[survivors[1]]
        same_changes = changes[survivors[0]] == changes[survivors[1]]
        echo(
            f"\njournal entries identical on {' and '.join(survivors)}: "
            f"{'yes' if same_journal else 'NO'}; captured changes identical: "
            f"{'yes' if same_changes else 'NO'}"
        )
        if not same_journal:
            problems.append("the survivors' journal entries differ")
        if not same_changes:
            problems.append("the survivors' captured changes differ")
        ops = [c["op"] for c in changes[first]]
        if ops != ["insert", "insert", "insert", "update"]:
            problems.append(f"unexpected change ops {ops}")
        if new_leader == leader:
            problems.append("leadership did not move")
        echo("\nstopping the nodes and etcd")
    for problem in problems:
        echo(f"CHECK FAILED: {problem}")
    if not problems:
        echo(
            f"ok: a write through a follower, leader {leader} killed, {new_leader} took over and "
            "took writes; the survivors hold identical journal entries and changes"
        )
    return 1 if problems else 0


def main() -> None:  # pragma: no cover - ``python -m litecdc.demo``
    sys.exit(run_demo(print, cluster="--cluster" in sys.argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    main()
