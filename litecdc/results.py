"""Value types shared by the store and its callers (HTTP, CLI, tests).

These are plain data: no SQLite, no HTTP. A SQL value is one of SQLite's five
storage classes as Python sees them: int, float, str, bytes or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

import msgspec

#: cids and per-transaction sequence numbers share one 63-bit change id (cid << 24 | seq)
MAX_CID = (1 << 39) - 1
MAX_SEQ = (1 << 24) - 1

SQLValue: TypeAlias = int | float | str | bytes | None

#: the range of SQLite's integers (64-bit signed)
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
Params: TypeAlias = Sequence[SQLValue] | Mapping[str, SQLValue]
ReadLevel: TypeAlias = Literal["none", "weak", "strong", "linearizable", "auto"]


@dataclass(frozen=True, slots=True)
class Statement:
    """One client statement: SQL text (possibly several SQL statements) and its parameters.

    Positional parameters bind to ``?``/``?NNN``; a mapping binds ``:name``, ``@name``
    and ``$name`` (keys given with or without the prefix).
    """

    sql: str
    params: Params = ()


@dataclass(slots=True)
class StatementResult:
    """What one statement did, in the shape rqlite reports it.

    Writes fill ``last_insert_id`` and ``rows_affected``; reads fill ``columns``,
    ``decltypes`` (declared column types, None for expressions) and ``rows``.
    A failed statement has only ``error``. ``seconds`` is the statement's run time.
    """

    last_insert_id: int | None = None
    rows_affected: int | None = None
    columns: list[str] | None = None
    decltypes: list[str | None] | None = None
    rows: list[tuple[SQLValue, ...]] | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass(slots=True)
class WriteOutcome:
    """The result of one write request: per-statement results and the journal cid.

    ``cid`` is None when nothing was committed (every statement failed, or the
    transaction was rolled back). In a cluster, ``log_revision`` is the etcd revision of
    the write's log entry.
    """

    results: list[StatementResult]
    cid: int | None = None
    snapshot: int | None = None
    log_revision: int | None = None
    #: /db/request of reads only, answered by the read path (rqlite's db.Query)
    read_only: bool = False

    @property
    def raft_index(self) -> int | None:
        """The write's place in the node's history, answered as rqlite's ``raft_index``:
        its cid (None when a standalone node committed nothing, so used no cid)."""
        return self.cid


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One row of ``_litecdc_journal``: the hctree triple plus the determinism inputs.

    ``query`` is None for an empty entry (a transaction that failed after its cid
    was allocated). ``timestamp_ms`` is the leader's clock (Unix ms) and ``seed``
    the random seed every replica uses when re-executing ``query``. ``internal``
    marks litecdc's own entries (CDC state, pruning): they may write ``_litecdc_*``
    tables and never produce change events.
    """

    cid: int
    query: str | None
    snapshot: int
    timestamp_ms: int
    seed: int
    internal: bool = False


@dataclass(frozen=True, slots=True)
class LogEntry:
    """A write as a cluster's log carries it (etcd), before any node has run it.

    ``statements`` are self-contained SQL texts (parameters already written as exact
    literals), run one by one — each alone, or all-or-nothing with ``transaction`` —
    exactly as the leader's client asked; every node gets the same results.
    ``internal`` marks litecdc's own entries (CDC state, pruning).
    """

    cid: int
    snapshot: int
    timestamp_ms: int
    seed: int
    statements: tuple[str, ...]
    transaction: bool = False
    internal: bool = False

    def encode(self) -> bytes:
        return _log_encoder.encode(self)

    @staticmethod
    def decode(data: bytes) -> LogEntry:
        return _log_decoder.decode(data)


@dataclass(frozen=True, slots=True)
class RowChange:
    """One captured row change from ``_litecdc_changes``.

    ``op`` is "insert", "update" or "delete". ``before`` is set for updates and
    deletes, ``after`` for inserts and updates; both map every column name to its
    value with its SQLite type preserved. ``pk`` maps primary-key column names to
    values (``{"rowid": n}`` for tables without a declared primary key).
    """

    cid: int
    seq: int
    table: str
    op: Literal["insert", "update", "delete"]
    old_rowid: int | None
    new_rowid: int | None
    pk: dict[str, SQLValue]
    before: dict[str, SQLValue] | None
    after: dict[str, SQLValue] | None
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class JournalPage:
    entries: list[JournalEntry]
    available_snapshot: int
    #: the oldest entry the node keeps (older ones were trimmed: --journal-retention-cids)
    oldest_cid: int = 1
    #: whether the page ended at its limit or its size bound (more entries may follow)
    more: bool = False


@dataclass(slots=True)
class NodeStatus:
    """What ``/status`` reports about this node's store (the HTTP layer adds the rest)."""

    node_id: str
    mode: str
    data_dir: str
    db_path: str
    db_size_bytes: int
    last_cid: int
    available_snapshot: int
    journal_min_cid: int
    changes_queued: int
    sqlite_version: str
    tables: int
    extra: dict[str, object] = field(default_factory=dict)


_log_encoder = msgspec.msgpack.Encoder()
_log_decoder = msgspec.msgpack.Decoder(LogEntry)
