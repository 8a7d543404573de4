"""Session-scoped pytest fixtures for throwaway servers, registered for the whole suite by
tests/conftest.py. Each server starts the first time a test asks for it (so tests that need
none stay fast) and stops at the end of the session. A missing binary fails the test with a
message to run `make test`; it is never a skip.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

import pytest

from litecdc.localservers import (
    MariaDBServer,
    NATSServer,
    PostgreSQLServer,
    RabbitMQServer,
    ServerUnavailableError,
)

log = logging.getLogger("litecdc.tests.servers")

S = TypeVar("S", bound=AbstractContextManager[object])


def _serve(factory: Callable[[], S], what: str) -> Iterator[S]:
    try:
        server = factory()
        server.__enter__()
    except ServerUnavailableError as exc:
        pytest.fail(f"{what}: {exc}", pytrace=False)
    log.info("%s started in %.2fs", what, getattr(server, "startup_seconds", 0.0))
    try:
        yield server
    finally:
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PostgreSQLServer]:
    """The session's PostgreSQL server (superuser ``postgres``, trust auth, 127.0.0.1)."""
    yield from _serve(PostgreSQLServer, "PostgreSQL")


@pytest.fixture(scope="session")
def postgresql_url(postgresql_server: PostgreSQLServer) -> str:
    """``postgresql://postgres@127.0.0.1:PORT/litecdc``: a database shared by the session."""
    return postgresql_server.create_database("litecdc")


@pytest.fixture
def postgresql_db_url(postgresql_server: PostgreSQLServer) -> Iterator[str]:
    """A fresh, empty database for one test (dropped afterwards)."""
    url = postgresql_server.create_database()
    yield url
    postgresql_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[MariaDBServer]:
    """The session's MariaDB server (``root`` without password, 127.0.0.1)."""
    yield from _serve(MariaDBServer, "MariaDB")


@pytest.fixture(scope="session")
def mariadb_url(mariadb_server: MariaDBServer) -> str:
    """``mysql://root@127.0.0.1:PORT/litecdc``: a database shared by the session."""
    return mariadb_server.create_database("litecdc")


@pytest.fixture
def mariadb_db_url(mariadb_server: MariaDBServer) -> Iterator[str]:
    """A fresh, empty database for one test (dropped afterwards)."""
    url = mariadb_server.create_database()
    yield url
    mariadb_server.drop_database(url.rsplit("/", 1)[1])


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NATSServer]:
    yield from _serve(NATSServer, "NATS")


@pytest.fixture(scope="session")
def nats_url(nats_server: NATSServer) -> str:
    """``nats://127.0.0.1:PORT`` with JetStream enabled (file storage in a temp dir)."""
    return nats_server.url


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitMQServer]:
    yield from _serve(RabbitMQServer, "RabbitMQ")


@pytest.fixture(scope="session")
def rabbitmq_url(rabbitmq_server: RabbitMQServer) -> str:
    """``amqp://guest:guest@127.0.0.1:PORT/`` (default vhost)."""
    return rabbitmq_server.url
