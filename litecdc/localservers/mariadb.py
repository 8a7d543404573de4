"""A throwaway MariaDB server from Debian's ``mariadb-server`` (mariadbd, mariadb-install-db).

``--no-defaults`` keeps /etc/mysql out of it; ``--skip-name-resolve`` at install time gives
``root@127.0.0.1`` with no password. Under root mariadbd needs ``--user=root``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pymysql

from litecdc.localservers.process import (
    LocalServer,
    ServerProcess,
    ServerUnavailableError,
    find_binary,
    free_port,
)


class MariaDBServer(LocalServer):
    """``with MariaDBServer() as db: db.create_database()`` → a mysql:// URL."""

    def __init__(self, *, base_dir: Path | None = None, start_timeout: float = 60.0) -> None:
        self.mariadbd = find_binary(["mariadbd", "mysqld"], "MariaDB server (mariadb-server)")
        self.install_db = find_binary(
            ["mariadb-install-db", "mysql_install_db"], "MariaDB server (mariadb-server)"
        )
        self._own_dir = base_dir is None
        self.base_dir = base_dir
        self.start_timeout = start_timeout
        self.port = 0

    def url(self, dbname: str = "mysql") -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{dbname}"

    def _connect(self, dbname: str | None = None) -> pymysql.connections.Connection[object]:
        return pymysql.connect(
            host="127.0.0.1", port=self.port, user="root", database=dbname, connect_timeout=2
        )

    def start(self) -> None:
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="litecdc-mariadb-"))
        base = self.base_dir
        data = base / "data"
        user = ["--user=root"] if os.geteuid() == 0 else []
        result = subprocess.run(
            [
                *(self.install_db, "--no-defaults", f"--datadir={data}", *user),
                *("--auth-root-authentication-method=normal", "--skip-test-db"),
                "--skip-name-resolve",
            ],
            cwd=base,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise ServerUnavailableError(
                f"mariadb-install-db failed: {(result.stderr or result.stdout).strip()[-2000:]}"
            )
        for attempt in range(3):
            self.port = free_port()
            self._process = ServerProcess(
                [
                    *(self.mariadbd, "--no-defaults", f"--datadir={data}", *user),
                    *(f"--port={self.port}", "--bind-address=127.0.0.1"),
                    *(f"--socket={base / 'mysqld.sock'}", f"--pid-file={base / 'mysqld.pid'}"),
                    *("--skip-name-resolve", "--skip-log-bin", "--max-connections=200"),
                    # Throwaway data: durability only costs time here.
                    *("--innodb-flush-log-at-trx-commit=0", "--innodb-buffer-pool-size=64M"),
                    *("--innodb-doublewrite=0", "--character-set-server=utf8mb4"),
                ],
                probe=self._ready,
                log_path=base / "server.log",
                timeout=self.start_timeout,
                cwd=str(base),
            )
            try:
                self._process.start_or_explain("MariaDB")
                return
            except ServerUnavailableError:
                if attempt == 2:
                    raise

    def _ready(self) -> bool:
        self._connect().close()
        return True

    def create_database(self, name: str | None = None) -> str:
        """A new empty database on this server; returns its URL."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        finally:
            conn.close()
        return self.url(name)

    def drop_database(self, name: str) -> None:
        conn = self._connect()
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()
