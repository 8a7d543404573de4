"""Keeps the change log within its retention cap when nothing else prunes it, and the
journal within its own.

Webhook deliveries (the high watermark entry) and pull subscribers (register, progress,
release) prune the change log as they move. A subscriber that stops calling, or a node
with neither, would let it grow without bound: the leader checks every few seconds
and, when the cap would delete something or expire a hold, writes the pruning entry
(``db.schema.prune_sql``) through the log so every replica prunes the same rows.
Every node, leader or not, trims its own journal (``Store.trim_journal``).
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger("litecdc.cdc")


class PrunableStore(Protocol):
    def retention_due(self) -> bool: ...
    def prune_changes(self) -> None: ...
    def trim_journal(self) -> int: ...


class LeaderCheck(Protocol):
    def is_leader(self) -> bool: ...


class RetentionKeeper:
    """A background check of the retention caps: the change log's on the leader, the
    journal's on every node."""

    def __init__(self, store: PrunableStore, leadership: LeaderCheck, interval: float) -> None:
        self._store = store
        self._leadership = leadership
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="litecdc-retention", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def check_once(self) -> bool:
        """Prune now if this node leads and the cap calls for it; True when it did."""
        if not self._leadership.is_leader() or not self._store.retention_due():
            return False
        self._store.prune_changes()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check_once()
            except Exception as exc:  # leadership lost, store closing…: next time
                log.warning("retention: could not prune the change log: %s", exc)
            try:
                self._store.trim_journal()
            except Exception as exc:  # store closing, disk error…: next time
                log.warning("retention: could not trim the journal: %s", exc)
