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


@pytest.fixture
def step_limit_stops(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The write step limit lowered to a million steps (about 10 ms); one entry is
    appended each time a statement is stopped at it."""
    from litecdc.db import engine as engine_module
    from litecdc.db.engine import Engine

    monkeypatch.setattr(engine_module, "_WRITE_LIMIT_CHECKS", 100)
    stops: list[bool] = []
    real = Engine._write_limit_reached

    def counted(self: Engine) -> bool:
        reached = real(self)
        if reached:
            stops.append(True)
        return reached

    monkeypatch.setattr(Engine, "_write_limit_reached", counted)
    return stops
