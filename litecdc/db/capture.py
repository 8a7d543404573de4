"""Row-change capture with APSW's preupdate hook.

Why the preupdate hook and not the session extension (measured on this machine,
see bench/): a Session records only the changed columns of an UPDATE (full
images would mean reading every updated row back) and reports no rowid for
tables with a non-integer primary key, while the preupdate hook hands over the
full old and new row and both rowids. Its one catch is that it also reports
changes that a failing statement then rolls back; the engine handles that by
marking the buffer before each statement (and using a savepoint per statement
outside explicit transactions) and cutting the buffer back on failure.
The hook and a Session must never share a connection (APSW documents a crash):
litecdc uses no Session.

Images are stored as MessagePack maps column name → value: it keeps SQLite's
types exactly (64-bit integers, float bit patterns including ±inf, text, blobs,
NULL) and encodes at C speed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from litecdc.db.schema import SEQ_BITS
from litecdc.results import RowChange, SQLValue

MAX_CHANGES_PER_TRANSACTION = (1 << SEQ_BITS) - 1

OP_NAMES = {"INSERT": "insert", "UPDATE": "update", "DELETE": "delete"}

_encode = msgspec.msgpack.Encoder().encode
_decode_image = msgspec.msgpack.Decoder(dict[str, Any]).decode


@dataclass(frozen=True, slots=True)
class TableShape:
    """What capture needs to know about one table: its columns and primary key."""

    table: str
    columns: tuple[str, ...]
    #: positions of the declared primary-key columns, in key order; () = rowid
    pk_positions: tuple[int, ...]
    #: True when the primary key is the rowid (INTEGER PRIMARY KEY or none declared)
    rowid_key: bool
    #: False for WITHOUT ROWID tables
    has_rowid: bool = True


class ChangeBuffer:
    """Collects preupdate-hook events for the running transaction."""

    def __init__(self, shape_of: Callable[[str], TableShape]) -> None:
        self._shape_of = shape_of
        #: shapes as of now; cleared by the authorizer when a statement changes the schema,
        #: so each event keeps the shape its table had when the row changed (a DROP or
        #: ALTER later in the same transaction cannot mislabel it)
        self.shapes: dict[str, TableShape] = {}
        self.events: list[
            tuple[
                str, TableShape, int, int, tuple[SQLValue, ...] | None, tuple[SQLValue, ...] | None
            ]
        ] = []

    def hook(self, update: Any) -> None:
        # Keep this minimal: it runs once per changed row, inside SQLite.
        shape = self.shapes.get(update.table_name)
        if shape is None:
            shape = self.shapes[update.table_name] = self._shape_of(update.table_name)
        self.events.append(
            (update.op, shape, update.rowid, update.rowid_new, update.old, update.new)
        )

    def mark(self) -> int:
        return len(self.events)

    def cut(self, mark: int) -> None:
        del self.events[mark:]

    def clear(self) -> None:
        self.events.clear()

    def rows(self, cid: int, timestamp_ms: int) -> Iterable[tuple[object, ...]]:
        """The ``_litecdc_changes`` rows for this transaction's events, in order."""
        if len(self.events) > MAX_CHANGES_PER_TRANSACTION:
            raise OverflowError(
                f"a transaction may change at most {MAX_CHANGES_PER_TRANSACTION} rows"
            )
        base = cid << SEQ_BITS
        for seq, (op, shape, rowid, rowid_new, old, new) in enumerate(self.events, 1):
            names = shape.columns
            before = _encode(dict(zip(names, old, strict=False))) if old is not None else None
            after = _encode(dict(zip(names, new, strict=False))) if new is not None else None
            if shape.rowid_key and not shape.pk_positions:
                pk = _encode({"rowid": rowid_new if new is not None else rowid})
            else:
                image = new if new is not None else old
                assert image is not None
                pk = _encode({names[i]: image[i] for i in shape.pk_positions})
            yield (
                base + seq,
                cid,
                seq,
                shape.table,
                OP_NAMES[op],
                rowid if old is not None else None,
                rowid_new if new is not None else None,
                pk,
                before,
                after,
                timestamp_ms,
            )


def decode_change(row: tuple[Any, ...]) -> RowChange:
    """A ``_litecdc_changes`` row (as selected by ``CHANGE_COLUMNS``) as a RowChange."""
    cid, seq, table, op, old_rowid, new_rowid, pk, before, after, ts = row
    return RowChange(
        cid=cid,
        seq=seq,
        table=table,
        op=op,
        old_rowid=old_rowid,
        new_rowid=new_rowid,
        pk=_decode_image(pk),
        before=_decode_image(before) if before is not None else None,
        after=_decode_image(after) if after is not None else None,
        timestamp_ms=ts,
    )


CHANGE_COLUMNS = "cid, seq, tbl, op, old_rowid, new_rowid, pk, before, after, ts"
