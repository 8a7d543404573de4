"""Helpers for tests that run real `litecdc serve --etcd` processes (tests/e2e's Node)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from e2e.litecdc_node import Node

WAIT = 20.0
Auth = tuple[str, str] | None


def wait(predicate: Any, what: str, timeout: float = WAIT) -> Any:
    """Poll ``predicate`` until it returns something true (HTTP errors count as not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (httpx.HTTPError, KeyError, TypeError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def cluster_status(node: Node, auth: Auth = None) -> dict[str, Any]:
    """The ``cluster`` section of the node's /status."""
    with node.client(auth=auth) as c:
        r = c.get("/status")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()["cluster"]
        return doc


def leader(nodes: list[Node], auth: Auth = None) -> Node:
    """The one running node that leads (waits until exactly one does)."""

    def find() -> Node | None:
        leading = [n for n in nodes if n.proc is not None and cluster_status(n, auth)["is_leader"]]
        return leading[0] if len(leading) == 1 else None

    node: Node = wait(find, "exactly one leader")
    return node


def rows(node: Node, cid: int, auth: Auth = None) -> list[Any]:
    """``kv``'s rows on ``node`` once it has applied ``cid`` (a level=none read)."""
    with node.client(auth=auth) as c:
        r = c.get(
            "/db/query",
            params={"q": "SELECT id, v FROM kv ORDER BY id", "level": "none", "min_cid": cid},
        )
        assert r.status_code == 200, r.text
        values: list[Any] = r.json()["results"][0].get("values", [])
        return values


def journal(node: Node, auth: Auth = None) -> list[Any]:
    """The node's journal entries after the initial record."""
    with node.client(auth=auth) as c:
        r = c.get("/journal", params={"after": 1})
        assert r.status_code == 200, r.text
        entries: list[Any] = r.json()["entries"]
        return entries


def start_nodes(base: Path, etcd_endpoint: str, cluster: str, *extra: str) -> list[Node]:
    """Three `litecdc serve --etcd` nodes n0..n2 (data under ``base``), started."""
    started: list[Node] = []
    try:
        for i in range(3):
            node = Node(base / f"n{i}", "--etcd", etcd_endpoint, "--cluster", cluster,
                        "--node-id", f"n{i}", *extra)  # fmt: skip
            started.append(node.start())
    except BaseException:
        for node in started:
            node.stop()
        raise
    return started


class AnsweringNode(Node):
    """A Node whose ``start()`` returns once its API answers ``/readyz`` at all, 503 too
    (``Node.start`` waits for a ready node): for nodes a test expects not to be ready."""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"litecdc exited with {self.proc.returncode}: {self.log()}")
            try:
                httpx.get(f"{self.url}/readyz", verify=self.verify, timeout=1.0)
                return
            except httpx.TransportError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"litecdc did not answer: {self.log()}")

    @classmethod
    def like(cls, node: Node) -> AnsweringNode:
        """The same node (data directory, options, port) as ``node``, which is stopped."""
        assert node.proc is None
        return cls(node.data_dir, *node.extra, https=node.scheme == "https", verify=node.verify,
                   port=node.port)  # fmt: skip
