"""What a batch of row changes looks like on the wire.

* ``rqlite`` (default) — rqlite's CDC JSON, so existing rqlite consumers work::

    {"service_id": "...", "node_id": "...",
     "payload": [{"index": <cid>, "commit_timestamp": <unix ms>,
                  "events": [{"op": "INSERT|UPDATE|DELETE", "table": "t",
                              "new_row_id": 1, "old_row_id": 1,
                              "before": {col: value}, "after": {col: value}}]}]}

  One payload element per transaction (cid); fields that do not apply are omitted
  (``service_id`` when unset, ``old_row_id``/``before`` on inserts, ``new_row_id``/``after``
  on deletes, both images with ``row_ids_only``).
* ``debezium`` — a JSON array with one object per row change, in Debezium's envelope::

    {"before": {...} | null, "after": {...} | null, "op": "c|u|d", "ts_ms": <send time>,
     "source": {"connector": "litecdc", "name": <service or node id>, "db": "main",
                "table": "t", "cid": <cid>, "ts_ms": <commit time>},
     "transaction": {"id": "<cid>", "total_order": n, "data_collection_order": m}}

Blob values are base64 strings in both (as rqlite sends them); every event carries its
cid, so consumers can drop the duplicates that at-least-once delivery allows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from litecdc.results import RowChange

_encode = msgspec.json.Encoder().encode
_RQLITE_OPS = {"insert": "INSERT", "update": "UPDATE", "delete": "DELETE"}
_DEBEZIUM_OPS = {"insert": "c", "update": "u", "delete": "d"}


def _transactions(changes: Sequence[RowChange]) -> list[list[RowChange]]:
    groups: list[list[RowChange]] = []
    for change in changes:
        if groups and groups[-1][0].cid == change.cid:
            groups[-1].append(change)
        else:
            groups.append([change])
    return groups


def key_images(change: RowChange) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The row's key before and after the change (``row_ids_only``): an update that
    changes the key has the old one before and the new one after."""
    rowids = (change.old_rowid, change.new_rowid)
    if set(change.pk) == {"rowid"} and change.pk["rowid"] in rowids:  # the key is the rowid
        before = {"rowid": change.old_rowid} if change.before is not None else None
        after = {"rowid": change.new_rowid} if change.after is not None else None
        return before, after
    names = list(change.pk)

    def key(image: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if image is None else {name: image.get(name) for name in names}

    return key(change.before), key(change.after)


def rqlite_envelope(
    changes: Sequence[RowChange], *, node_id: str, service_id: str = "", row_ids_only: bool = False
) -> bytes:
    payload = []
    for group in _transactions(changes):
        events: list[dict[str, Any]] = []
        for change in group:
            event: dict[str, Any] = {"op": _RQLITE_OPS[change.op], "table": change.table}
            if change.new_rowid is not None:
                event["new_row_id"] = change.new_rowid
            if change.old_rowid is not None:
                event["old_row_id"] = change.old_rowid
            if not row_ids_only:
                if change.before is not None:
                    event["before"] = change.before
                if change.after is not None:
                    event["after"] = change.after
            elif change.old_rowid is None and change.new_rowid is None:
                # a WITHOUT ROWID table has no row ids: its key identifies the row
                before, after = key_images(change)
                if before is not None:
                    event["before"] = before
                if after is not None:
                    event["after"] = after
            events.append(event)
        payload.append(
            {"index": group[0].cid, "commit_timestamp": group[0].timestamp_ms, "events": events}
        )
    doc: dict[str, Any] = {}
    if service_id:
        doc["service_id"] = service_id
    doc["node_id"] = node_id
    doc["payload"] = payload
    return _encode(doc)


def debezium_envelope(
    changes: Sequence[RowChange], *, node_id: str, service_id: str = "", row_ids_only: bool = False
) -> bytes:
    now_ms = time.time_ns() // 1_000_000
    out = []
    for group in _transactions(changes):
        per_table: dict[str, int] = {}
        for order, change in enumerate(group, 1):
            per_table[change.table] = per_table.get(change.table, 0) + 1
            before, after = change.before, change.after
            if row_ids_only:
                before, after = key_images(change)
            out.append(
                {
                    "before": before,
                    "after": after,
                    "op": _DEBEZIUM_OPS[change.op],
                    "ts_ms": now_ms,
                    "source": {
                        "connector": "litecdc",
                        "name": service_id or node_id,
                        "db": "main",
                        "table": change.table,
                        "cid": change.cid,
                        "ts_ms": change.timestamp_ms,
                    },
                    "transaction": {
                        "id": str(change.cid),
                        "total_order": order,
                        "data_collection_order": per_table[change.table],
                    },
                }
            )
    return _encode(out)


ENVELOPES = {"rqlite": rqlite_envelope, "debezium": debezium_envelope}
