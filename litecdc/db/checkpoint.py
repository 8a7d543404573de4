"""WAL checkpoints on a thread of their own, off the write path (standalone nodes); on the
writer right after its COMMIT (cluster nodes: InlineCheckpointer, at the end).

By default SQLite checkpoints inside the COMMIT that takes the WAL past 1000 pages: that
writer copies every page back into the database file (and syncs it) before it returns,
which costs litecdc's bulk writes about a tenth of their throughput and puts a spike in
the latency of an unlucky single-row write. Here the writer's WAL hook only notes the
size; a thread with its own connection runs PASSIVE checkpoints (which never block the
writer or readers) while the writer goes on, on the machine's other core. rqlite and
Litestream keep checkpoints away from the writer for the same reason.

The WAL only starts over when a write begins after a checkpoint has copied ALL of it,
which a writer that never pauses rarely allows: so once the WAL passes ``limit`` pages
the writer, after its commit, waits for one more checkpoint (the frames written since
the last one, little work by then) and the next write starts the WAL over. That bounds
the WAL to about ``limit`` pages plus one transaction.
"""

from __future__ import annotations

import logging
import threading
import time

import apsw

log = logging.getLogger("litecdc.db")

#: WAL size (pages) that wakes the checkpointer: SQLite's own autocheckpoint default
CHECKPOINT_PAGES = 1000
#: WAL size (pages) past which the writer waits for a checkpoint after its commit
WAIT_PAGES = 4 * CHECKPOINT_PAGES
#: the most the writer waits for that checkpoint
WAIT_TIMEOUT_S = 30.0
#: a checkpoint that keeps failing is logged at most this often
WARNING_INTERVAL_S = 60.0


class _PassiveCheckpoints:
    """PASSIVE checkpoints, counted; one that fails is logged at most every
    WARNING_INTERVAL_S and tried again by the caller later."""

    def __init__(self) -> None:
        self.done = 0
        self._last_warning = float("-inf")

    def checkpoint(self, conn: apsw.Connection) -> None:
        try:
            # PASSIVE copies what no reader still needs and never waits; the next
            # write after a complete one starts the WAL over from its beginning
            conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            self.done += 1
        except apsw.Error as exc:
            # busy, I/O trouble, a full disk: the WAL keeps growing until a later try
            # succeeds (the writer's own commits report such trouble to their clients)
            if time.monotonic() - self._last_warning >= WARNING_INTERVAL_S:
                self._last_warning = time.monotonic()
                log.warning("WAL checkpoint failed, will try again: %s", exc)


class BackgroundCheckpointer:
    """Checkpoints one database's WAL whenever a commit leaves it over ``pages`` pages."""

    def __init__(
        self,
        writer: apsw.Connection,
        path: str,
        *,
        pages: int = CHECKPOINT_PAGES,
        limit: int = WAIT_PAGES,
        synchronous: str = "full",
    ) -> None:
        self._pages = pages
        self.limit = limit
        #: WAL size after the writer's last commit
        self.wal_pages = 0
        #: WAL size at which a commit next wakes the thread
        self._next_wake = pages
        self._waiters: list[threading.Event] = []
        self._waiters_lock = threading.Lock()
        self._conn = apsw.Connection(path)
        # a connection that has not read the database yet does not know it is in WAL mode,
        # and its checkpoints do nothing (return (-1, -1))
        self._conn.execute("PRAGMA journal_mode").fetchall()
        # the checkpoint's syncs follow this connection's level: the writer's
        self._conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._wake = threading.Event()
        self._stopping = False
        self._pacer = _PassiveCheckpoints()
        self._thread = threading.Thread(target=self._run, name="litecdc-checkpoint", daemon=True)
        self._thread.start()
        # replaces the writer's autocheckpoint (a connection has one WAL hook)
        writer.set_wal_hook(self._committed)

    @property
    def checkpoints(self) -> int:
        return self._pacer.done

    @property
    def pages(self) -> int:
        """WAL growth (pages) between two wake-ups of the thread."""
        return self._pages

    @pages.setter
    def pages(self, value: int) -> None:
        self._pages = self._next_wake = value

    def _committed(self, _conn: apsw.Connection, _db: str, pages: int) -> int:
        # runs inside every COMMIT of the writer: a few comparisons and a flag
        if pages < self.wal_pages:
            self._next_wake = self._pages  # the WAL started over
        self.wal_pages = pages
        if pages >= self._next_wake:
            # once per `pages` new pages, not on every commit past the threshold: each
            # checkpoint syncs the database file, and a writer that never pauses keeps the
            # WAL from starting over (measured: single-row writes lost a third of their rate)
            self._next_wake = pages + self._pages
            self._wake.set()
        return apsw.SQLITE_OK

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._waiters_lock:
                waiters, self._waiters = self._waiters, []
            try:
                if self._stopping:
                    return
                self._checkpoint()
            finally:
                for waiter in waiters:
                    waiter.set()

    def _checkpoint(self) -> None:
        self._pacer.checkpoint(self._conn)

    def after_commit(self) -> None:
        """Called by the writer after a commit, before its next write can begin: waits for
        a checkpoint when the WAL has grown past ``limit`` (see the module docstring)."""
        if self.wal_pages < self.limit or self._stopping:
            return
        done = threading.Event()
        with self._waiters_lock:
            self._waiters.append(done)
        self._wake.set()
        if not done.wait(WAIT_TIMEOUT_S):
            log.warning("WAL checkpoint still running after %.0f s", WAIT_TIMEOUT_S)
        # the next write starts the WAL over (unless a reader still needs it)
        self.wal_pages = 0
        self._next_wake = self._pages

    def close(self) -> None:
        """Stop the thread (after the checkpoint it may be running) and its connection."""
        self._stopping = True
        self._wake.set()
        self._thread.join()
        self._conn.close()


class InlineCheckpointer:
    """SQLite's own autocheckpoint, run by the writer right after its COMMIT instead of
    inside it (cluster nodes, where the thread cost write throughput: see store.py).

    Inside COMMIT, a checkpoint that fails (a full disk) is ignored by SQLite — but the
    writer's VFS is Python's (determinism.FixedClockVFS), and APSW raised that write's
    error out of the COMMIT that had succeeded: the apply loop took a committed batch for
    a failed one and re-applied it forever ("UNIQUE constraint failed:
    _litecdc_journal.cid"; full-disk QA). Here a failing checkpoint is logged and tried
    again after the next commit, as SQLite would.
    """

    def __init__(self, writer: apsw.Connection, *, pages: int = CHECKPOINT_PAGES) -> None:
        self._writer = writer
        self._pages = pages
        self._pacer = _PassiveCheckpoints()
        #: WAL size after the writer's last commit
        self.wal_pages = 0
        # replaces the writer's autocheckpoint (a connection has one WAL hook)
        writer.set_wal_hook(self._committed)

    @property
    def checkpoints(self) -> int:
        return self._pacer.done

    def _committed(self, _conn: apsw.Connection, _db: str, pages: int) -> int:
        self.wal_pages = pages  # (runs inside COMMIT: nothing that can fail)
        return apsw.SQLITE_OK

    def after_commit(self) -> None:
        """Checkpoint (PASSIVE) when the commit left the WAL at ``pages`` or more, as
        SQLite's autocheckpoint does after each such commit."""
        if self.wal_pages < self._pages:
            return
        self._pacer.checkpoint(self._writer)  # (the commit stands, whatever it meets)
        self.wal_pages = 0

    def close(self) -> None:
        """Nothing runs apart from the writer."""
