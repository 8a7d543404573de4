"""A throwaway PostgreSQL server from Debian's binaries (/usr/lib/postgresql/*/bin).

PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres``
account (Debian's package creates it) or ``nobody``, in a directory of its own under /tmp
(pytest's temp root is private to root). Only TCP on 127.0.0.1; trust authentication.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg

from litecdc.localservers.process import (
    LocalServer,
    ServerProcess,
    ServerUnavailableError,
    find_binary,
    free_port,
    unprivileged_user,
)

SUPERUSER = "postgres"


class PostgreSQLServer(LocalServer):
    """``with PostgreSQLServer() as pg: pg.create_database()`` → a postgresql:// URL."""

    def __init__(self, *, start_timeout: float = 60.0) -> None:
        self.postgres = find_binary(
            ["postgres"], "PostgreSQL server", ["/usr/lib/postgresql/*/bin/postgres"]
        )
        bindir = os.path.dirname(self.postgres)
        self.initdb = os.path.join(bindir, "initdb")
        if not os.path.exists(self.initdb):
            raise ServerUnavailableError(f"initdb not found next to {self.postgres}")
        self.user = unprivileged_user(("postgres", "nobody"))
        self.start_timeout = start_timeout
        self.port = 0
        self.base_dir: Path | None = None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="litecdc-pg-"))
        data = self.base_dir / "data"
        log = self.base_dir / "server.log"
        if self.user is not None:
            os.chown(self.base_dir, self.user.pw_uid, self.user.pw_gid)
        as_user = self.user is not None
        result = subprocess.run(
            [
                *(self.initdb, "-D", str(data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"),
                *("--no-sync", "--locale=C"),
            ],
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            check=False,
            user=self.user.pw_uid if self.user else None,
            group=self.user.pw_gid if self.user else None,
            extra_groups=[] if as_user else None,
        )
        if result.returncode != 0:
            raise ServerUnavailableError(f"initdb failed: {result.stderr.strip()}")
        # A port taken between free_port() and the bind makes postgres exit: try another.
        for attempt in range(3):
            self.port = free_port()
            self._process = ServerProcess(
                [
                    *(self.postgres, "-D", str(data), "-p", str(self.port)),
                    *("-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="),
                    # Throwaway data: durability only costs time here.
                    *("-c", "fsync=off", "-c", "synchronous_commit=off"),
                    *("-c", "full_page_writes=off", "-c", "max_connections=200"),
                ],
                probe=self._ready,
                log_path=log,
                timeout=self.start_timeout,
                # SIGINT is PostgreSQL's "fast" shutdown; SIGTERM waits for clients to leave.
                stop_signal=signal.SIGINT,
                user=self.user,
                cwd=str(self.base_dir),
            )
            try:
                self._process.start_or_explain("PostgreSQL")
                return
            except ServerUnavailableError:
                if attempt == 2:
                    raise

    def _ready(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=2):
            return True

    def create_database(self, name: str | None = None) -> str:
        """A new empty database on this server; returns its URL."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            # FORCE: a test may leave a connection open; it must not keep the database.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
