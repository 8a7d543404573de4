"""The one interface every pipeline sink implements.

A sink receives, for one subscription (one source table):

- **snapshot chunks** (``write_snapshot``): rows of the table with ``_litecdc_cid`` =
  the cid the chunk was read at. Chunks of different ranges are read at different
  cids and may be written again after a crash.
- **change batches** (``write_changes``): the events of whole transactions, cids in
  ``(batch.after_cid, batch.end_cid]``, in (cid, seq) order, with ``_litecdc_op`` =
  'upsert' | 'delete'. A batch is applied in ONE sink commit (a transaction never
  straddles two commits) together with the record that the batch was applied, so a
  replayed batch is recognised and skipped (``applied_cid``).
- **the end of a snapshot** (``finish_snapshot(init_cid)``): every row with a version
  below the subscription's initial snapshot cid was not seen by the (re-)snapshot and
  is gone at the source — a mirror deletes it.

Mirrors (Delta, PostgreSQL, MariaDB) guard every row: a row is written only if the
incoming cid is greater than the stored one; deletes remove a row only if its stored
cid is smaller. Stages run in order (snapshot, then the log from the initial cid),
batches are applied in cid order and each at most once, so guard + batch record +
the finishing sweep give an exact mirror whatever is replayed or retried.

Message sinks (NATS, RabbitMQ, webhook) publish each row/event as a message with a
stable id (``message_id``) so consumers can de-duplicate.
"""

from __future__ import annotations

import hashlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from litecdc.errors import SchemaMismatchError
from litecdc.pipeline.tables import CID_COLUMN, Column, TableSpec
from litecdc.wire import same_name_to_case_blind

if TYPE_CHECKING:
    from litecdc.pipeline.metadata import Subscription

#: rows of a mirror read at a time by ``read_row_batches`` (``pipeline verify``)
READ_BATCH_ROWS = 100_000

#: seconds a probe of a sink's server may take on top of the sink's connect_timeout
PROBE_GRACE = 5.0


class UnstorableKeyError(SchemaMismatchError):
    """Rows whose key the sink cannot store (longer than its key columns hold): the
    write is refused whole. ``keys``: those rows' keys, as tuples in key column order.

    A delete of such a key is no error — the row cannot be in the sink — so once the row
    is deleted at the source the subscription can go on (the server skips the refused
    row's changes when a later commit at the source deletes it).
    """

    def __init__(self, message: str, keys: Sequence[tuple[Any, ...]]) -> None:
        super().__init__(message)
        self.keys = list(keys)


@dataclass(frozen=True)
class ChangeBatch:
    """Where a change batch sits in the log: cids after ``after_cid`` through ``end_cid``."""

    subscription: str
    after_cid: int
    end_cid: int


def check_mirror_columns(
    sink: str,
    where: str,
    existing: Mapping[str, str],
    spec: TableSpec,
    accepted: Mapping[str, Collection[str]],
    native: Mapping[str, str],
    required: Collection[str] = (),
) -> list[Column]:
    """Check an existing SQL mirror table's columns (name → the database's type name)
    against ``spec``; returns the source columns it lacks (to add). ``accepted``: the type
    names each Arrow type may have there; ``native``: the type litecdc would create;
    ``required``: its columns that take no row without a value (NOT NULL, no default)."""
    if existing.get(CID_COLUMN) != "bigint":
        raise SchemaMismatchError(
            f"{sink} sink: {where} has no BIGINT {CID_COLUMN} column: it is not a litecdc "
            "mirror; choose another table (?table=NAME)"
        )
    for column in spec.columns:
        found = existing.get(column.name)
        if found is not None and found not in accepted[column.arrow]:
            raise SchemaMismatchError(
                f"{sink} sink: column {column.name!r} of {where} is {found}, the source has "
                f"{column.arrow} ({native[column.arrow]}): alter or drop the sink table, or "
                "choose another (?table=NAME)"
            )
    # (sinks QA: such a column of the table's own passed, and the first write failed with
    # the database's words — PostgreSQL's naming the row's values in the log)
    needing = sorted(set(required) - set(spec.column_names) - {CID_COLUMN})
    if needing:
        names = ", ".join(repr(n) for n in needing)
        raise SchemaMismatchError(
            f"{sink} sink: {where} has column(s) {names} the source has not, NOT NULL without "
            "a default: the mirror's rows cannot leave them out; give them a default, allow "
            "NULL or drop them, or choose another table (?table=NAME)"
        )
    return [c for c in spec.columns if c.name not in existing]


def short_value(value: Any) -> Any:
    """A key value for an error message: long text or bytes cut, with their length."""
    if isinstance(value, str) and len(value) > 40:
        return f"{value[:24]}… ({len(value.encode())} bytes)"
    if isinstance(value, bytes) and len(value) > 24:
        return f"{value[:12]!r}… ({len(value)} bytes)"
    return value


def registration_id(subscription: str, created_at: str, init_cid: int) -> str:
    """What tells one registration of a subscription at its source from every other under
    its name: 12 hex digits hashed from when the subscription was added to the metadata
    store (``created_at``, ISO text) and the cid it registered at (a re-snapshot registers
    again). Both are recorded before anything is written, so a retried batch — after a
    crash too — keeps its ids; a subscription re-created under the name, on any source,
    or registered again gets new ones."""
    text = f"{subscription}\n{created_at}\n{init_cid}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def check_case_blind_names(
    sink: str, server: str, where: str, names: Sequence[str], fold: Callable[[str], str]
) -> None:
    """SchemaMismatchError when two of ``names`` (a table's columns, with the sink's own)
    are one name to ``server``, which compares names by ``fold`` (idents QA: subscribed,
    then every run failed with "Duplicate column name 'É'" or delta-rs's words, naming
    neither the table nor what to do)."""
    same = same_name_to_case_blind(names, fold)
    if same is not None:
        first, second = same
        raise SchemaMismatchError(
            f"{sink} sink: {where}: columns {first!r} and {second!r} are one name to "
            f"{server}, which takes names regardless of letter case: rename one at the "
            "source"
        )


def registration_of(subscription: Subscription, init_cid: int) -> str:
    """``registration_id`` of ``subscription`` registered at ``init_cid``, from what the
    metadata store recorded: the same on every retry, restart and `verify`."""
    created = subscription.created_at
    stamp = created.isoformat(timespec="microseconds") if created is not None else ""
    return registration_id(subscription.name, stamp, init_cid)


def message_id(cid: int, seq: int, op: str) -> str:
    """The de-duplication id of one change event (an update of the key is two events
    with the same cid and seq: a delete, then an upsert)."""
    return f"{cid}-{seq}-{op}"


class Sink(ABC):
    """A destination for one subscription's table. Not thread-safe; one per subscription.

    Construct with ``(url, spec, subscription)`` through ``litecdc.pipeline.sinks.open_sink``.
    Errors are ``litecdc.errors.SinkError`` (unreachable, refused) or
    ``SchemaMismatchError`` (a source column the sink cannot take).
    """

    #: 'mirror' sinks keep the table's rows (verify compares them); 'log' sinks keep
    #: or send the events.
    kind: str = "mirror"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        self.url = url
        self.spec = spec
        self.subscription = subscription
        #: which registration of the subscription at its source the writes belong to,
        #: set by the server before it writes (``registration_id``); message sinks put it
        #: in their de-duplication ids. Empty when the sink is used on its own.
        self.registration = ""

    @abstractmethod
    def prepare(self) -> None:
        """Create the destination if missing, or check it against ``self.spec``; add
        columns the source gained where the format allows (else SchemaMismatchError)."""

    @abstractmethod
    def write_snapshot(self, rows: pa.Table) -> None:
        """Upsert snapshot rows (``spec.row_schema()``), guarded by ``_litecdc_cid``."""

    @abstractmethod
    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        """Apply one batch (``spec.change_schema()``) in one commit; False when the
        sink had already applied it (``batch.end_cid <= applied_cid()``)."""

    @abstractmethod
    def finish_snapshot(self, init_cid: int) -> int:
        """Delete rows whose version is below ``init_cid``; return how many."""

    @abstractmethod
    def applied_cid(self) -> int:
        """The end cid of the last change batch this sink committed (0 when none)."""

    def forget_progress(self) -> None:  # noqa: B027 - only sinks whose record outlives us
        """A new subscription registers under this name: drop the progress record an
        earlier subscription of the same name left in the sink (unsubscribing does not
        reach the sink), so that ``applied_cid`` starts from 0 again. Called before
        anything of the new subscription is written."""

    def disown_rows(self, init_cid: int) -> int:
        """A new subscription registered at ``init_cid`` writes into a mirror that was
        kept: rows there at that cid or later came from another history — another source,
        whose cids run lower — and the version guard would keep them against every row of
        the snapshot, the sweep too (sinks QA: old values and rows stayed, silently). They
        are set to cid 0, so the snapshot replaces them or the sweep removes them. Called
        before anything of the new subscription is written; returns how many. Sinks that
        keep no rows: 0."""
        return 0

    def read_row_batches(self, batch_rows: int = READ_BATCH_ROWS) -> Generator[pa.Table]:
        """The mirror's rows, table columns only, in parts of at most ``batch_rows`` rows
        and in no particular order (``pipeline verify``: a mirror of millions of rows read
        whole took gigabytes — scale QA)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no rows to compare")

    def read_rows(self) -> pa.Table:
        """The mirror's rows, table columns only, in key order (Arrow's)."""
        schema = pa.schema([pa.field(c.name, c.arrow_type) for c in self.spec.columns])
        parts = [part.cast(schema) for part in self.read_row_batches()]
        rows = pa.concat_tables(parts) if parts else schema.empty_table()
        return rows.sort_by([(k, "ascending") for k in self.spec.key])

    def check_names(self) -> None:  # noqa: B027 - sinks that take any name
        """SchemaMismatchError when the destination cannot hold a name of the table or its
        columns as they are (without contacting it: ``subscribe`` asks too)."""

    def evolve(self, spec: TableSpec) -> None:
        """The source table gained columns: take the new description (``prepare`` again)."""
        self.spec = spec
        self.prepare()

    def keep_for_retry(self) -> bool:
        """True when this sink, its batch failed, holds what the retry must wait for (a
        RabbitMQ batch the broker blocked: its messages may still reach the queue); the
        server then keeps it open for the next attempt instead of closing it."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    #: whether ``probe`` asks a server (the others have none, or bound their own waits);
    #: what a probe's deadline message calls the sink, and the deadline (seconds)
    probes: bool = False
    label: str = "sink"
    probe_timeout: float = 15.0

    def probe(self) -> None:  # noqa: B027 - sinks that wait on no server of their own
        """Raise SinkError when the sink's server does not answer a new connection now.
        The pipeline server asks, from another thread, when a write has waited long: a
        frozen server or a network path that drops packets answers no one, a busy server
        answers. Sinks whose waits are bounded by their own timeouts ask nothing."""

    def abort(self) -> None:  # noqa: B027 - see probe
        """Break the connection a write is waiting on, from another thread, so the write
        returns (with an error). Must not touch the connection otherwise: another thread
        is in it."""


def probe_sink(sink: Sink) -> str | None:
    """What ``sink.probe()`` found wrong, one line; None when the server answered. A
    probe still waiting after ``sink.probe_timeout`` seconds found no answer."""
    found: list[str | None] = []

    def ask() -> None:
        try:
            sink.probe()
            found.append(None)
        except Exception as exc:
            found.append(" ".join(str(exc).split()))

    prober = threading.Thread(target=ask, name="litecdc-sink-probe", daemon=True)
    prober.start()
    prober.join(sink.probe_timeout)
    if not found:
        return (
            f"{sink.label}: its server did not answer a new connection within "
            f"{sink.probe_timeout:g} s"
        )
    return found[0]
