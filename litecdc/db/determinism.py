"""Make re-executed SQL produce the same values on every replica.

Each journal entry carries the leader's timestamp and a random seed. While a
transaction runs (first time on the leader, or re-applied from the journal):

* SQLite asks its VFS for the current time (``'now'`` in every date function,
  ``CURRENT_TIMESTAMP``/``CURRENT_DATE``/``CURRENT_TIME``, column defaults too);
  :class:`FixedClockVFS` answers with the entry's timestamp.
* ``random()`` and ``randomblob(N)`` are replaced by functions of
  (seed, call number within the transaction). A statement that fails rolls the
  call number back to where it was before the statement, so the leader and a
  replica that never runs the failed statement see the same sequence.

Everything else that would differ between replicas is refused before commit
(see ``NON_DETERMINISTIC_FUNCTIONS``, and ``litecdc.db.access`` for PRAGMAs, tables
and trigger bodies).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time

import apsw

#: Unix epoch as milliseconds since the Julian epoch (what xCurrentTimeInt64 returns).
UNIX_EPOCH_JULIAN_MS = 210_866_760_000_000

#: Functions whose value depends on a node's history, build or file layout, not on
#: the replicated state; a write that calls one is refused.
NON_DETERMINISTIC_FUNCTIONS: dict[str, str] = {
    "changes": "depends on the connection's previous statement",
    "total_changes": "depends on the connection's history",
    "last_insert_rowid": "depends on the connection's previous statement; "
    "use the last_insert_id the write returns",
    "sqlite_offset": "depends on the file layout of each replica",
    "sqlite_version": "differs between builds of SQLite",
    "sqlite_source_id": "differs between builds of SQLite",
    "sqlite_compileoption_used": "differs between builds of SQLite",
    "sqlite_compileoption_get": "differs between builds of SQLite",
    "fts5_source_id": "differs between builds of SQLite",
    "fts3_tokenizer": "hands out the address of a tokenizer in this process's memory",
    "load_extension": "loads code that replicas may not have",
}


def pin_process_timezone() -> None:
    """Make SQLite's ``'localtime'`` and ``'utc'`` modifiers agree on every replica.

    SQLite converts with the C library's local time zone, which is per machine; litecdc
    runs every node in UTC (process-wide: ``TZ=UTC``), so those modifiers are no-ops
    everywhere instead of giving each replica its own answer.
    """
    if os.environ.get("TZ") != "UTC":
        os.environ["TZ"] = "UTC"
        time.tzset()


class FixedClockVFS(apsw.VFS):
    """The default VFS, except that "now" can be pinned to a given moment.

    Only ``xCurrentTimeInt64`` is overridden; file I/O is the base VFS's (measured:
    no throughput difference on 1000-row transactions).
    """

    name = "litecdc-fixed-clock"
    _instance: FixedClockVFS | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._pinned: dict[int, int] = {}
        super().__init__(self.name, "")

    @classmethod
    def get(cls) -> FixedClockVFS:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def pin(self, timestamp_ms: int | None) -> None:
        """Pin "now" for the calling thread (the writer's), or unpin with None."""
        if timestamp_ms is None:
            self._pinned.pop(threading.get_ident(), None)
        else:
            self._pinned[threading.get_ident()] = timestamp_ms + UNIX_EPOCH_JULIAN_MS

    def xFullPathname(self, name: str) -> str:
        # The base VFS answers a path through a symbolic link (a data directory under a
        # linked /data, a linked db.sqlite) with SQLITE_OK_SYMLINK, which a Python VFS
        # takes for an error ("not an error"); SQLite's own unix VFS follows links, so
        # resolve them as it does: the WAL and locks go next to the real file.
        return os.path.realpath(name)

    def xCurrentTimeInt64(self) -> int:
        pinned = self._pinned.get(threading.get_ident())
        if pinned is not None:
            return pinned
        return int(super().xCurrentTimeInt64())


#: SQLite's default SQLITE_MAX_LENGTH
MAX_BLOB_BYTES = 1_000_000_000


def _as_int64(value: object) -> int:
    """A value as SQLite's sqlite3_value_int64 reads it (floats truncate, text's leading
    integer, anything else 0)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        # out of range: clamped, as SQLite's doubleToInt64 (randomblob(1e300) is too big)
        if value != value:
            return 0
        if value >= 2.0**63:
            return 2**63 - 1
        return -(2**63) if value <= -(2.0**63) else int(value)
    if isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        # ASCII digits and spaces only, as sqlite3Atoi64 (Python's \d takes '٣' for 3)
        digits = re.match(r"[ \t\n\f\r\v]*([+-]?[0-9]+)", text)
        return max(-(2**63), min(2**63 - 1, int(digits.group(1)))) if digits else 0
    return 0


class DeterministicRandom:
    """``random()``/``randomblob()`` as pure functions of (seed, call number)."""

    def __init__(self) -> None:
        self.seed = 0
        self.calls = 0

    def start(self, seed: int) -> None:
        self.seed = seed
        self.calls = 0

    def _digest(self, size: int) -> bytes:
        self.calls += 1
        material = f"{self.seed}:{self.calls}".encode()
        return hashlib.shake_256(material).digest(size)

    def random(self, *_: object) -> int:
        return int.from_bytes(self._digest(8), "little", signed=True)

    def randomblob(self, *args: object) -> bytes:
        count = _as_int64(args[0] if args else 1)
        if count < 1:  # as SQLite: N < 1 gives a 1-byte blob
            count = 1
        if count > MAX_BLOB_BYTES:
            raise ValueError("string or blob too big")
        return self._digest(count)

    def install(self, connection: apsw.Connection) -> None:
        connection.create_scalar_function("random", self.random, 0, deterministic=False)
        connection.create_scalar_function("randomblob", self.randomblob, 1, deterministic=False)
