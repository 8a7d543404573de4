"""Throwaway servers for tests (litecdc.localservers), as pytest fixtures.

Fixtures (tests/servers/fixtures.py, registered by tests/conftest.py): ``postgresql_url``,
``postgresql_db_url`` (a fresh database per test), ``mariadb_url``, ``mariadb_db_url``,
``nats_url`` (JetStream on), ``rabbitmq_url``; the ``*_server`` fixtures behind them give
the server objects.
"""
