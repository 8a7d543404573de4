"""Snapshot chunks read by worker processes straight into Arrow.

Building a chunk in Python (a tuple per row, then columns, then Arrow) costs about
2 µs a row and holds the GIL, so parallel partitions of a Spark read queued up behind
each other in the node. Each worker process reads with ADBC's SQLite driver, which
fills Arrow arrays in C (about 6x faster), in one read transaction with the journal's
head (``db.source.rows_query``), so the chunk and its cid agree. ADBC brings its own
SQLite library: it is only ever opened in these processes (two SQLite libraries in one
process can release each other's file locks), read-only. ADBC converts mixed storage
classes on its own terms, so a chunk holding a value that is not of its column's exact
class, or an empty chunk, comes back as None and the node builds it with
``db.source.read_rows`` (which converts or refuses as documented).

A chunk goes back to the node as a file in a private spool directory in ``/dev/shm``
(RAM), not through the pool's result pipe: pickling 10 MB through the pipe cost the
node's main process about 20 ms a chunk, as much as the HTTP serving itself. The node
reads the file once and unlinks it; a full or missing ``/dev/shm`` falls back to the
pipe.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from litecdc.db import source
from litecdc.wire import to_ipc

log = logging.getLogger("litecdc.db")

_conn: Any = None  # the worker's ADBC connection
_path: str | None = None  # the database file it reads
_spool: str | None = None  # the worker's spool directory (None: hand chunks over the pipe)

SHM = "/dev/shm"
PARENT_CHECK_S = 1.0  # how often a worker checks that its node is still there
_SPOOL_PREFIX = "litecdc-pages-"


def _open(path: str, spool: str | None) -> None:
    global _path, _spool
    _path, _spool = path, spool
    _connect()
    _exit_with_parent()


def _exit_with_parent() -> None:
    """Exit when the node is gone. A node killed with SIGKILL never shuts its pool down,
    and each worker holds the write end of the pool's queue too, so no EOF ever comes:
    the workers (and multiprocessing's resource tracker, with its semaphores in
    /dev/shm) would wait forever."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="litecdc-watch-node", daemon=True).start()


def _connect() -> None:
    import adbc_driver_sqlite.dbapi as adbc

    global _conn
    # not autocommit: the head and the chunk are read in one transaction (rolled back)
    _conn = adbc.connect(f"file:{_path}?mode=ro", autocommit=False)


def _end_read(cursor: Any) -> bool:
    """Close the cursor and end the read transaction. False when that failed (SQLite may
    have ended the transaction itself, on an I/O error): what was read may not be one
    transaction, and the connection is replaced so no stale snapshot lives on."""
    global _conn
    try:
        cursor.close()
        _conn.rollback()
        return True
    except Exception:
        log.warning("page worker: ending a read transaction failed; reconnecting", exc_info=True)
        with contextlib.suppress(Exception):
            _conn.close()
        _connect()
        return False


def _read_chunk(sql: str, params: Sequence[Any], limit: int) -> tuple[int, pa.Table] | None:
    """The journal's head and the chunk, read in one transaction; None when ADBC refused a
    value (one of another type than the first ones: the careful path)."""
    assert _conn is not None, "worker not initialised"
    cursor = _conn.cursor()
    try:
        # one Arrow batch per chunk (ADBC's default is 1024 rows): every batch costs Spark
        # a round of its own on the way into the JVM
        cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(limit)})
        cursor.execute(source.HEAD_CID_SQL)
        head = cursor.fetchone()
        cursor.execute(sql, params)
        read = (int(head[0]), cursor.fetch_arrow_table())
    except Exception:  # a value of another type than the first ones: the careful path
        read = None
    finally:
        ended = _end_read(cursor)
    return read if ended else None


def _rows_ipc(
    table: source.SourceTable,
    after_key: Sequence[Any] | None,
    until_key: Sequence[Any] | None,
    limit: int,
) -> str | bytes | None:
    """The chunk as Arrow IPC, in a spool file (its path) or as bytes, or None when the
    node must build it itself (an empty chunk, or values that need converting or
    refusing: ``source.read_rows``)."""
    sql, params = source.rows_query(table, after_key, until_key, limit)
    read = _read_chunk(sql, params, limit)
    if read is None:
        return None
    cid, data = read
    page = source.page_from_arrow(table, data, cid, limit)
    if page is None:
        return None
    if _spool is not None:
        name = None
        try:
            fd, name = tempfile.mkstemp(dir=_spool, suffix=".arrows")
            os.close(fd)
            with pa.OSFile(name, "wb") as out, pa.ipc.new_stream(out, page.rows.schema) as w:
                w.write_table(page.rows)
            return name
        except OSError:  # /dev/shm full, or the spool gone: the pipe
            if name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(name)
    return to_ipc(page.rows)


def _take(name: str) -> bytes | None:
    """A spool file's contents (None if it is gone); the file is gone afterwards."""
    try:
        with open(name, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


@dataclass(frozen=True)
class _Spool:
    path: str
    lock_fd: int  # holds an exclusive flock on path/OWNER_LOCK while the node lives


OWNER_LOCK = "owner.lock"
_FRESH_S = 60.0  # a spool without its lock file yet is being created, unless older


def _new_spool() -> _Spool | None:
    """A private directory in /dev/shm for this node's chunks (None without /dev/shm).
    Spools no process holds the lock of (their node was killed) are removed first: a
    lock, not a pid, because pids are reused and differ between containers that share
    /dev/shm."""
    if not os.path.isdir(SHM) or not os.access(SHM, os.W_OK):
        return None
    with contextlib.suppress(OSError):
        for entry in os.listdir(SHM):
            path = os.path.join(SHM, entry)
            if entry.startswith(_SPOOL_PREFIX) and _abandoned(path):
                shutil.rmtree(path, ignore_errors=True)
    try:
        path = tempfile.mkdtemp(prefix=f"{_SPOOL_PREFIX}{os.getpid()}-", dir=SHM)
        fd = os.open(os.path.join(path, OWNER_LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    return _Spool(path, fd)


def _abandoned(path: str) -> bool:
    try:
        fd = os.open(os.path.join(path, OWNER_LOCK), os.O_RDWR)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - os.stat(path).st_mtime > _FRESH_S
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its node is alive
        return False
    finally:
        os.close(fd)  # releases the lock if it was taken
    return True


class PageWorkers:
    """A pool of ``workers`` processes reading ``path``; started on first use."""

    def __init__(self, path: str, workers: int) -> None:
        self.path = path
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._spool: _Spool | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("the page workers are closed")
            if self._pool is None:
                if self._spool is None:
                    self._spool = _new_spool()
                # spawn: a clean interpreter, not a fork of a process with threads and an
                # open writer connection
                self._pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_open,
                    initargs=(self.path, self._spool.path if self._spool else None),
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
            data = self._executor().submit(_rows_ipc, table, after_key, until_key, limit).result()
        except BrokenProcessPool:
            # a worker died (killed, out of memory): start a new pool next time
            with self._lock:
                self._pool = None
            raise
        return _take(data) if isinstance(data, str) else data  # None: read_rows builds it

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if self._spool is not None:
            shutil.rmtree(self._spool.path, ignore_errors=True)
            os.close(self._spool.lock_fd)
