"""System-test fixtures: real etcd processes (Debian's binary) on 127.0.0.1.

``etcd`` is one member shared by a test module; ``etcd3`` is a fresh 3-member cluster per
test (tests pause and kill its members). Tests keep apart on the shared member by using
their own key prefix or cluster name (``cluster_name``).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.litecdc_node import Node
from etcd_cluster import ETCD_BINARY, EtcdCluster
from serve_cluster import start_nodes

from litecdc.cluster import EtcdClient, EtcdSettings

if shutil.which(ETCD_BINARY) is None:  # pragma: no cover - set-up installs it
    pytest.exit("etcd is not installed: run `bash scripts/setup-system.sh` (as root)", 1)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A single etcd member for the whole test module."""
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), size=1) as cluster:
        yield cluster


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster for one test."""
    with EtcdCluster(tmp_path / "etcd3", size=3) as cluster:
        yield cluster


@pytest.fixture
def client(etcd: EtcdCluster) -> Iterator[EtcdClient]:
    with EtcdClient(EtcdSettings(endpoints=etcd.endpoints, request_timeout=2.0)) as c:
        yield c


@pytest.fixture
def cluster_name() -> str:
    """A cluster name (and key prefix) no other test uses."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def nodes(tmp_path: Path, etcd: EtcdCluster, cluster_name: str) -> Iterator[list[Node]]:
    """Three ``litecdc serve --etcd`` nodes of a fresh cluster on the module's etcd."""
    started = start_nodes(tmp_path, etcd.endpoints[0], cluster_name)
    yield started
    for node in started:
        node.stop()
