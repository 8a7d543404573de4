"""Throwaway servers started from Debian's binaries on free ports of 127.0.0.1.

``make run``'s demo, the benchmarks and the test suite (tests/servers/fixtures.py) use
them to run real PostgreSQL, MariaDB, NATS JetStream and RabbitMQ servers without
anything pre-started::

    from litecdc.localservers import PostgreSQLServer

    with PostgreSQLServer() as pg:
        url = pg.create_database()

Each lives in its own temporary directory, is owned by an unprivileged account when the
caller is root (PostgreSQL refuses to run as root), and dies with the process that
started it.
"""

from __future__ import annotations

from litecdc.localservers.mariadb import MariaDBServer
from litecdc.localservers.nats import NATSServer
from litecdc.localservers.postgresql import PostgreSQLServer
from litecdc.localservers.process import ServerUnavailableError, free_port
from litecdc.localservers.rabbitmq import RabbitMQServer

__all__ = [
    "MariaDBServer",
    "NATSServer",
    "PostgreSQLServer",
    "RabbitMQServer",
    "ServerUnavailableError",
    "free_port",
]
