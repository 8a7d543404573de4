from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from litecdc import NodeConfig, Store

pytest_plugins = ["servers.fixtures"]  # throwaway PostgreSQL/MariaDB/NATS/RabbitMQ


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(NodeConfig(data_dir=tmp_path / "node"))
    yield s
    s.close()
