from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from litecdc import NodeConfig, Store

pytest_plugins = ["servers.fixtures"]  # throwaway PostgreSQL/MariaDB/NATS/RabbitMQ

# Spark drivers started by the suite (module sessions, and every `pipeline run` process,
# which inherits this) live seconds to minutes: the JIT's first tier alone starts them
# sooner and serves such short jobs as well — the Parquet-log rebuild test took 147 s
# instead of 175 s on the 2 cores (2026-11-28). Only how the JVM compiles changes; a
# pipeline outside the suite keeps Java's default.
os.environ.setdefault(
    "PYSPARK_SUBMIT_ARGS", "--driver-java-options -XX:TieredStopAtLevel=1 pyspark-shell"
)


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
