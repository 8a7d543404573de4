"""End-to-end fixtures: the real ``litecdc serve`` process on a free 127.0.0.1 port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litecdc_node import Node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node shared by one test module; tests use their own table names."""
    n = Node(tmp_path_factory.mktemp("node") / "data").start()
    yield n
    n.stop()


@pytest.fixture
def fresh_node(tmp_path: Path) -> Iterator[Node]:
    """A node with an empty database, for tests that replace or count everything."""
    n = Node(tmp_path / "data").start()
    yield n
    n.stop()


@pytest.fixture
def client(node: Node) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c
