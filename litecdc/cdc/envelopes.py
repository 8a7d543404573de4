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
cid and commit time, so consumers can drop the duplicates that at-least-once delivery
allows (by both: a database restored from an older backup numbers new commits with the
same cids again, at later times — docs/cdc.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
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


def _rqlite_event(change: RowChange, row_ids_only: bool) -> dict[str, Any]:
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
    return event


def _rqlite_head(node_id: str, service_id: str, payload: list[dict[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if service_id:
        doc["service_id"] = service_id
    doc["node_id"] = node_id
    doc["payload"] = payload
    return doc


def rqlite_envelope(
    changes: Sequence[RowChange], *, node_id: str, service_id: str = "", row_ids_only: bool = False
) -> bytes:
    payload = [
        {
            "index": group[0].cid,
            "commit_timestamp": group[0].timestamp_ms,
            "events": [_rqlite_event(change, row_ids_only) for change in group],
        }
        for group in _transactions(changes)
    ]
    return _encode(_rqlite_head(node_id, service_id, payload))


class _DebeziumOrder:
    """A transaction's running counts: ``total_order`` and ``data_collection_order``."""

    def __init__(self) -> None:
        self.total = 0
        self.per_table: dict[str, int] = {}

    def envelope(
        self, change: RowChange, *, name: str, now_ms: int, row_ids_only: bool
    ) -> dict[str, Any]:
        self.total += 1
        self.per_table[change.table] = self.per_table.get(change.table, 0) + 1
        before, after = change.before, change.after
        if row_ids_only:
            before, after = key_images(change)
        return {
            "before": before,
            "after": after,
            "op": _DEBEZIUM_OPS[change.op],
            "ts_ms": now_ms,
            "source": {
                "connector": "litecdc",
                "name": name,
                "db": "main",
                "table": change.table,
                "cid": change.cid,
                "ts_ms": change.timestamp_ms,
            },
            "transaction": {
                "id": str(change.cid),
                "total_order": self.total,
                "data_collection_order": self.per_table[change.table],
            },
        }


def debezium_envelope(
    changes: Sequence[RowChange], *, node_id: str, service_id: str = "", row_ids_only: bool = False
) -> bytes:
    now_ms = time.time_ns() // 1_000_000
    out: list[dict[str, Any]] = []
    for group in _transactions(changes):
        order = _DebeziumOrder()
        name = service_id or node_id
        out.extend(
            order.envelope(c, name=name, now_ms=now_ms, row_ids_only=row_ids_only) for c in group
        )
    return _encode(out)


ENVELOPES = {"rqlite": rqlite_envelope, "debezium": debezium_envelope}


def large_transaction_body(
    format: str,
    pages: Iterable[Sequence[RowChange]],
    *,
    node_id: str,
    service_id: str = "",
    row_ids_only: bool = False,
) -> tuple[bytes, int]:
    """The body of one transaction read in ``pages`` (each a run of its changes, in
    order): the same bytes ENVELOPES[format] makes of the whole list, built a page at a
    time, so only the encoded JSON is held, not every change as Python objects too (QA:
    a 300,000-row transaction peaked at 509 MiB for a 137 MiB body, 3.7 times it; now
    twice). Returns the body and its event count (0, and an empty body, for no events)."""
    chunks: list[bytes] = [b""]  # the head, once known; then each page's events, commas
    events = 0
    if format == "debezium":
        order = _DebeziumOrder()
        now_ms = time.time_ns() // 1_000_000
        name = service_id or node_id
        for page in pages:
            if page:
                docs = [
                    order.envelope(c, name=name, now_ms=now_ms, row_ids_only=row_ids_only)
                    for c in page
                ]
                chunks += [b",", _encode(docs)[1:-1]]  # the elements, without the brackets
                events += len(page)
        if not events:
            return b"", 0
        chunks[0:2] = [b"["]
        chunks.append(b"]")
        return b"".join(chunks), events
    for page in pages:
        if not page:
            continue
        if not events:
            element = {"index": page[0].cid, "commit_timestamp": page[0].timestamp_ms, "events": []}
            head = _encode(_rqlite_head(node_id, service_id, [element]))
            assert head.endswith(_RQLITE_TAIL)
            chunks[0] = head[: -len(_RQLITE_TAIL)]  # '..."events":[', the events follow
        chunks += [b",", _encode([_rqlite_event(c, row_ids_only) for c in page])[1:-1]]
        events += len(page)
    if not events:
        return b"", 0
    del chunks[1]  # no comma before the first page
    chunks.append(_RQLITE_TAIL)
    return b"".join(chunks), events


#: how an rqlite body with one payload element ends: its events' closing bracket, the
#: element's, the payload's and the document's
_RQLITE_TAIL = b"]}]}"
