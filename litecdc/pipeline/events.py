"""Change batches: ordering and the net effect per key.

A micro-batch holds the change events of whole transactions in (cid, seq) order. A
mirror only needs the last event of each key in the batch: the sinks apply that one
with the version guard (incoming cid > stored cid), which is what makes a replayed or
retried batch, or a snapshot chunk read at another cid, converge to the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, OP_DELETE, SEQ_COLUMN, TableSpec


@dataclass(frozen=True)
class NetChanges:
    """The last event per key of a batch, split by kind (both keep CID_COLUMN)."""

    upserts: pa.Table  # table columns + CID_COLUMN
    deletes: pa.Table  # key columns + CID_COLUMN


def sort_events(events: pa.Table) -> pa.Table:
    return events.sort_by([(CID_COLUMN, "ascending"), (SEQ_COLUMN, "ascending")])


def net_changes(events: pa.Table, spec: TableSpec) -> NetChanges:
    """Reduce a batch of change events to the last event of each key."""
    if events.num_rows == 0:
        empty = spec.row_schema().empty_table()
        return NetChanges(empty, empty.select([*spec.key, CID_COLUMN]))
    ordered = sort_events(events)
    position = pa.array(range(ordered.num_rows), pa.int64())
    indexed = ordered.append_column("__pos", position)
    last = indexed.group_by(list(spec.key), use_threads=False).aggregate([("__pos", "max")])
    keep = pc.sort_indices(last["__pos_max"])
    picked = ordered.take(pc.take(last["__pos_max"], keep))
    is_delete = pc.equal(picked[OP_COLUMN], OP_DELETE)
    row_columns = [*spec.column_names, CID_COLUMN]
    upserts = picked.filter(pc.invert(is_delete)).select(row_columns)
    deletes = picked.filter(is_delete).select([*spec.key, CID_COLUMN])
    return NetChanges(upserts, deletes)
