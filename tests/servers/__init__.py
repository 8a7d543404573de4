"""Throwaway servers for tests, started from Debian's binaries on free ports of 127.0.0.1.

Fixtures (tests/servers/fixtures.py, registered by tests/conftest.py): ``postgresql_url``,
``postgresql_db_url`` (a fresh database per test), ``mariadb_url``, ``mariadb_db_url``,
``nats_url`` (JetStream on), ``rabbitmq_url``; the ``*_server`` fixtures behind them give
the server objects. Outside pytest (benchmarks, scripts) use the classes directly::

    from servers import PostgreSQLServer
    with PostgreSQLServer() as pg:
        url = pg.create_database()
"""

from __future__ import annotations

from .mariadb_server import MariaDBServer
from .nats_server import NATSServer
from .postgresql_server import PostgreSQLServer
from .process import ServerUnavailableError
from .rabbitmq_server import RabbitMQServer

__all__ = [
    "MariaDBServer",
    "NATSServer",
    "PostgreSQLServer",
    "RabbitMQServer",
    "ServerUnavailableError",
]
