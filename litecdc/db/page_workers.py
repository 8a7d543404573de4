"""Snapshot chunks built in worker processes, as Arrow IPC bytes.

Building a chunk is mostly Python work (a tuple per row, then columns, then Arrow), so in
the node's process every chunk holds the GIL and parallel partitions of a Spark read
queue up behind each other. Each worker process opens the database file read-only with
its own APSW connection — the same SQLite library as the node, in another process, so
no file locks are shared (a second SQLite library inside one process could break
them) — and answers one chunk at a time: ``BEGIN``, the chunk and the cid it saw
(``db.source.read_rows``), ``COMMIT``, then the Arrow IPC stream. The garbage collector
is paused while a chunk is built: the tuples it creates hold no cycles, and its
collections cost about as much as building them.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import apsw

from litecdc.db import source
from litecdc.wire import to_ipc

log = logging.getLogger("litecdc.db")

BUSY_TIMEOUT_MS = 5000

_conn: apsw.Connection | None = None


def _open(path: str) -> None:
    global _conn
    _conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    _conn.set_busy_timeout(BUSY_TIMEOUT_MS)


def _rows_ipc(
    table: str,
    after_key: Sequence[Any] | None,
    until_key: Sequence[Any] | None,
    limit: int,
) -> bytes:
    conn = _conn
    assert conn is not None, "worker not initialised"
    gc.disable()
    try:
        conn.execute("BEGIN")
        try:
            page = source.read_rows(conn, source.describe(conn, table), after_key, until_key, limit)
        finally:
            conn.execute("COMMIT")
        return to_ipc(page.rows)
    finally:
        gc.enable()


class PageWorkers:
    """A pool of ``workers`` processes reading ``path``; started on first use."""

    def __init__(self, path: str, workers: int) -> None:
        self.path = path
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the page workers are closed")
            if self._pool is None:
                # spawn: a clean interpreter, not a fork of a process with threads and an
                # open writer connection
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_open,
                    initargs=(self.path,),
                )
            return self._pool

    def rows_ipc(
        self,
        table: str,
        after_key: Sequence[Any] | None,
        until_key: Sequence[Any] | None,
        limit: int,
    ) -> bytes:
        """A snapshot chunk as an Arrow IPC stream (schema metadata as ``read_rows``)."""
        try:
            return self._executor().submit(_rows_ipc, table, after_key, until_key, limit).result()
        except BrokenProcessPool:
            # a worker died (killed, out of memory): start a new pool next time
            with self._lock:
                self._pool = None
            raise

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
