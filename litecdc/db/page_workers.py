"""Snapshot chunks read by worker processes straight into Arrow.

Building a chunk in Python (a tuple per row, then columns, then Arrow) costs about
2 µs a row and holds the GIL, so parallel partitions of a Spark read queued up behind
each other in the node. Each worker process reads with ADBC's SQLite driver, which
fills Arrow arrays in C (about 6x faster), from ONE SELECT that also returns the
journal's head (``db.source.rows_query``): one statement is one read transaction, so the
chunk and its cid agree. ADBC brings its own SQLite library: it is only ever opened in
these processes (two SQLite libraries in one process can release each other's file
locks), read-only. ADBC converts mixed storage classes on its own terms, so a chunk
holding a value that is not of its column's exact class, or an empty chunk, comes back
as None and the node builds it with ``db.source.read_rows`` (which converts or refuses
as documented).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from litecdc.db import source
from litecdc.wire import to_ipc

log = logging.getLogger("litecdc.db")

_conn: Any = None  # the worker's ADBC connection


def _open(path: str) -> None:
    import adbc_driver_sqlite.dbapi as adbc

    global _conn
    _conn = adbc.connect(f"file:{path}?mode=ro", autocommit=True)


def _rows_ipc(
    table: source.SourceTable,
    after_key: Sequence[Any] | None,
    until_key: Sequence[Any] | None,
    limit: int,
) -> bytes | None:
    """The chunk as Arrow IPC, or None when the node must build it itself (an empty
    chunk, or values that need converting or refusing: ``source.read_rows``)."""
    assert _conn is not None, "worker not initialised"
    sql, params = source.rows_query(table, after_key, until_key, limit)
    cursor = _conn.cursor()
    try:
        # one Arrow batch per chunk (ADBC's default is 1024 rows): every batch costs Spark
        # a round of its own on the way into the JVM
        cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(limit)})
        cursor.execute(sql, params)
        data = cursor.fetch_arrow_table()
    except Exception:  # a value of another type than the first ones: the careful path
        return None
    finally:
        cursor.close()
    page = source.page_from_arrow(table, data, limit)
    return None if page is None else to_ipc(page.rows)


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
        table: source.SourceTable,
        after_key: Sequence[Any] | None,
        until_key: Sequence[Any] | None,
        limit: int,
    ) -> bytes | None:
        """A snapshot chunk as an Arrow IPC stream (schema metadata as ``read_rows``), or
        None when the caller must build it (see the module docstring)."""
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
