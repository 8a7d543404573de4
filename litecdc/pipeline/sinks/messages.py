"""The JSON form of rows and change events that the log sinks (NATS, RabbitMQ, webhook) send.

One event::

    {"table": "orders", "op": "upsert", "cid": 42, "seq": 0,
     "key": {"id": 7}, "row": {"id": 7, "note": "…", "photo": "iVBORw0…"}}

``op`` is 'upsert' (``row`` = the row after the change), 'delete' (``row`` = the row
before) or 'snapshot' (a row of a snapshot chunk read at ``cid``; ``seq`` is null). An
update of the key is a 'delete' of the old key then an 'upsert' of the new one, with the
same cid and seq. A (re-)snapshot ends with one 'snapshot_done' message (``cid`` = the
snapshot's initial cid; ``seq``, ``key`` and ``row`` null): every row of the table the
snapshot had is sent by then with a cid at or above it, so a row whose last message
has a lower cid is gone at the source — its delete may never come (the node pruned it
before a re-snapshot), and this is how a consumer learns it. It speaks for the rows of
its own subscription: several may publish into one destination (the subscription is
the part of a message's id before its first ':').

Blobs are base64 strings, NULL is null, integers are exact 64-bit JSON numbers (a
JavaScript consumer needs a big-int aware parser above 2^53). JSON has no infinities:
±infinity in a REAL column is the string "inf" / "-inf" — the text an untyped column
holding the same number arrives as (the node writes a number in an untyped column out
as Python's ``repr``), and what the node's own JSON source API (``format=json``) shows;
``float(value)`` reads it back in Python.

Each message has a stable id for de-duplication: ``message_id(cid, seq, op)`` for a
change event, ``snapshot_message_id`` for a snapshot row (the table and key hashed in,
as one chunk's rows share a cid). What a sink sends is that id scoped by ``scoped_id``:
``<subscription>:<registration>:<id>``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from litecdc.pipeline.sinks.base import message_id
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, SEQ_COLUMN, TableSpec

OP_SNAPSHOT = "snapshot"
OP_SNAPSHOT_DONE = "snapshot_done"


#: how ±infinity is written (SQLite has no NaN): as ``repr`` writes it, like the node
INFINITY_TEXT = {math.inf: "inf", -math.inf: "-inf"}


def json_value(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, float) and math.isinf(value):
        return INFINITY_TEXT[value]
    return value


def snapshot_message_id(table: str, cid: int, key: dict[str, Any]) -> str:
    digest = hashlib.sha256(
        json.dumps([table, key], sort_keys=True, ensure_ascii=False).encode()
    ).hexdigest()[:24]
    return f"{cid}-snapshot-{digest}"


def scoped_id(subscription: str, registration: str, msg_id: str) -> str:
    """The id a message sink sends for ``msg_id`` (an event's, a snapshot row's, a webhook
    batch's): ``<subscription>:<registration>:<msg_id>`` (``<subscription>:<msg_id>`` for
    a sink used on its own, without a registration). Consumers de-duplicate on it, over
    every subscription sending to one destination: the subscription's name keeps two
    sources' equal cids apart, its registration (``Sink.registration``, see
    ``registration_id``) a subscription re-created under an earlier one's name — on
    another source, or a source rebuilt, whose cids are the same again. Both stay the
    same on every retry of a batch, in this process or the next."""
    if registration:
        return f"{subscription}:{registration}:{msg_id}"
    return f"{subscription}:{msg_id}"


def _records(rows: pa.Table, names: list[str]) -> Iterator[dict[str, Any]]:
    columns = [rows[n].to_pylist() for n in names]
    for values in zip(*columns, strict=True):
        yield dict(zip(names, values, strict=True))


def event_messages(events: pa.Table, spec: TableSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """(message id, document) of each change event, in (cid, seq) order as given."""
    names = [CID_COLUMN, SEQ_COLUMN, OP_COLUMN, *spec.column_names]
    for record in _records(events, names):
        cid, seq, op = int(record[CID_COLUMN]), int(record[SEQ_COLUMN]), str(record[OP_COLUMN])
        row = {c: json_value(record[c]) for c in spec.column_names}
        doc = {
            "table": spec.name,
            "op": op,
            "cid": cid,
            "seq": seq,
            "key": {k: row[k] for k in spec.key},
            "row": row,
        }
        yield message_id(cid, seq, op), doc


def snapshot_messages(rows: pa.Table, spec: TableSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    """(message id, document) of each row of a snapshot chunk."""
    for record in _records(rows, [*spec.column_names, CID_COLUMN]):
        cid = int(record[CID_COLUMN])
        row = {c: json_value(record[c]) for c in spec.column_names}
        key = {k: row[k] for k in spec.key}
        doc = {"table": spec.name, "op": OP_SNAPSHOT, "cid": cid, "seq": None, "key": key}
        doc["row"] = row
        yield snapshot_message_id(spec.name, cid, key), doc


def snapshot_done_message(spec: TableSpec, init_cid: int) -> tuple[str, dict[str, Any]]:
    """(message id, document) of the message ending a snapshot begun at ``init_cid``."""
    doc = {
        "table": spec.name,
        "op": OP_SNAPSHOT_DONE,
        "cid": init_cid,
        "seq": None,
        "key": None,
        "row": None,
    }
    return f"{init_cid}-snapshot-done", doc


def encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
