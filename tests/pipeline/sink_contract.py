"""What the sink behaviour suite needs: a simulated source, exact row comparison, and
reading back what the message sinks sent.

``SourceSim`` keeps a table's whole history, so snapshot chunks read "at" any cid and
change batches over any cid range are consistent with one another, as the node's
would be. ``expected_rows`` is the table at the last cid: what every mirror must hold
whatever the interleaving of chunks and batches, replays and retries.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import string
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import nats
import pika  # type: ignore[import-untyped]
import pyarrow as pa

from litecdc.pipeline.tables import (
    CID_COLUMN,
    OP_COLUMN,
    OP_DELETE,
    OP_UPSERT,
    SEQ_COLUMN,
    Column,
    TableSpec,
)

Row = dict[str, Any]
Message = tuple[str, dict[str, Any]]  # (de-duplication id, event document)
Key = tuple[Any, ...]

SPEC = TableSpec(
    "items",
    (
        Column("id", "INTEGER", "int64", not_null=True),
        Column("name", "TEXT", "string"),
        Column("price", "REAL", "float64"),
        Column("data", "BLOB", "binary"),
        Column("n", "INTEGER", "int64"),
    ),
    ("id",),
)

#: A composite key with a text part (MariaDB stores text keys as VARBINARY).
COMPOSITE_SPEC = TableSpec(
    "regions",
    (
        Column("region", "TEXT", "string", not_null=True),
        Column("n", "INTEGER", "int64", not_null=True),
        Column("value", "TEXT", "string"),
    ),
    ("region", "n"),
)

FLOATS = [0.1, 1e308, -0.0, 5e-324, 2.2250738585072014e-308, -1.5e-300, 1 / 3, 123456789.125]
INTS = [2**62, -(2**63), 2**63 - 1, 0, -1]
TEXTS = [
    "",
    "plain",
    "é ü ß",
    "中文字符",
    "emoji 😀🎉",
    "quotes ' \" \\ back\\slash",
    "tab\tnew\nline\r\n, comma",
    "\u2028line sep",
    "trailing space ",
]
BLOBS = [b"", b"\x00", b"\x00\xff\x80\x7f", bytes(range(256)), b"x" * 70_000]


def incompressible(n: int, seed: int = 0) -> str:
    """``n`` random letters and digits: text PostgreSQL's compression (pglz, lz4) cannot
    shrink, so its index entry is as long as the text (a long run of one letter shrinks
    to a few bytes per 273 characters)."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters + string.digits, k=n))


def sample_row(i: int) -> Row:
    """Row ``i`` of the test table: every interesting value appears, NULLs included."""
    return {
        "id": i,
        "name": None if i % 7 == 0 else TEXTS[i % len(TEXTS)] + f" #{i}",
        "price": None if i % 5 == 0 else FLOATS[i % len(FLOATS)],
        "data": None if i % 6 == 0 else BLOBS[i % len(BLOBS)],
        "n": None if i % 9 == 0 else INTS[i % len(INTS)],
    }


@dataclass
class SourceSim:
    """A source table with its full change history (one cid per ``commit``)."""

    spec: TableSpec
    cid: int = 0
    rows: dict[Key, Row] = field(default_factory=dict)
    events_log: list[tuple[int, int, str, Row]] = field(default_factory=list)
    states: dict[int, dict[Key, Row]] = field(default_factory=lambda: {0: {}})

    def key_of(self, row: Mapping[str, Any]) -> Key:
        return tuple(row[k] for k in self.spec.key)

    def commit(self, *changes: tuple[str, Any]) -> int:
        """One transaction: ('upsert', row), ('delete', key tuple) or ('rekey', (old
        key, new row)) — a key update is a delete and an upsert with one cid and seq."""
        self.cid += 1
        for seq, (kind, arg) in enumerate(changes):
            if kind == "upsert":
                row = {c: arg.get(c) for c in self.spec.column_names}
                self.rows[self.key_of(row)] = row
                self.events_log.append((self.cid, seq, OP_UPSERT, row))
            elif kind == "delete":
                before = self.rows.pop(tuple(arg))
                self.events_log.append((self.cid, seq, OP_DELETE, before))
            elif kind == "rekey":
                old_key, new_row = arg
                before = self.rows.pop(tuple(old_key))
                new = {c: new_row.get(c) for c in self.spec.column_names}
                self.rows[self.key_of(new)] = new
                self.events_log.append((self.cid, seq, OP_DELETE, before))
                self.events_log.append((self.cid, seq, OP_UPSERT, new))
            else:
                raise ValueError(kind)
        self.states[self.cid] = dict(self.rows)
        return self.cid

    def chunk(self, lo: Any, hi: Any, at: int) -> pa.Table:
        """The rows with lo <= first key column < hi as of cid ``at``."""
        state = self.states[at]
        picked = sorted((k, r) for k, r in state.items() if lo <= k[0] < hi)
        rows = [{**r, CID_COLUMN: at} for _, r in picked]
        return pa.Table.from_pylist(rows, schema=self.spec.row_schema())

    def events(self, after: int, end: int) -> pa.Table:
        picked = [
            {CID_COLUMN: cid, SEQ_COLUMN: seq, OP_COLUMN: op, **row}
            for cid, seq, op, row in self.events_log
            if after < cid <= end
        ]
        return pa.Table.from_pylist(picked, schema=self.spec.change_schema())

    def expected_rows(self) -> list[Row]:
        return [self.rows[k] for k in sorted(self.rows)]


def canonical(value: Any) -> Any:
    """A value compared bit for bit (-0.0 differs from 0.0; NaN equals itself)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value).hex(), math.copysign(1.0, value))
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def canonical_rows(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple((k, canonical(v)) for k, v in sorted(r.items())) for r in rows]


def table_rows(table: pa.Table) -> list[Row]:
    return list(table.to_pylist())


def nats_raw_messages(server: str, stream: str) -> list[Message]:
    async def read() -> list[Message]:
        nc = await nats.connect(server)
        try:
            js = nc.jetstream()
            info = await js.stream_info(stream)
            out: list[Message] = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append(
                    ((msg.headers or {}).get("Nats-Msg-Id", ""), json.loads(msg.data or b""))
                )
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def rabbitmq_messages(url: str, queue: str) -> list[Message]:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        out: list[Message] = []
        while True:
            method, props, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            assert props.delivery_mode == 2  # persistent
            out.append((props.message_id, json.loads(body)))
    finally:
        conn.close()


def consume(docs: Iterable[Mapping[str, Any]]) -> dict[Key, Row]:
    """A table rebuilt from one subscription's messages as docs/pipeline.md tells a
    consumer to: 'snapshot' and 'upsert' set the key's row, 'delete' removes it, and
    'snapshot_done' drops every row whose last message has a cid below the message's."""
    rows: dict[Key, tuple[int, Row]] = {}
    for doc in docs:
        op, cid = doc["op"], int(doc["cid"])
        if op == "snapshot_done":
            rows = {k: (c, row) for k, (c, row) in rows.items() if c >= cid}
            continue
        key = tuple(doc["key"].values())
        if op == "delete":
            rows.pop(key, None)
        else:
            assert op in ("snapshot", "upsert"), doc
            rows[key] = (cid, doc["row"])
    return {k: row for k, (_, row) in rows.items()}
