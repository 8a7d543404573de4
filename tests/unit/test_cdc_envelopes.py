"""Webhook envelopes with row_ids_only: each event identifies its row before and after."""

from __future__ import annotations

import json
from typing import Any

import pytest

from litecdc.cdc.envelopes import debezium_envelope, large_transaction_body, rqlite_envelope
from litecdc.cdc.sinks import TIMEOUT_BYTES, transmit_allowance
from litecdc.results import RowChange


def change(
    op: str,
    pk: dict[str, Any],
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    rowids: tuple[int | None, int | None] = (None, None),
) -> RowChange:
    return RowChange(
        cid=7,
        seq=1,
        table="t",
        op=op,
        old_rowid=rowids[0],
        new_rowid=rowids[1],
        pk=pk,
        before=before,
        after=after,
        timestamp_ms=0,
    )


KEY_MOVES = change(  # UPDATE k SET code = 'B' on a TEXT primary key
    "update", {"code": "B"}, {"code": "A", "v": 1}, {"code": "B", "v": 1}, rowids=(1, 1)
)
ROWID_MOVES = change("update", {"rowid": 2}, {"v": 1}, {"v": 1}, rowids=(1, 2))
WITHOUT_ROWID = change("insert", {"k": "x"}, None, {"k": "x", "v": 2})


def test_debezium_keys_show_the_old_key_before_and_the_new_one_after() -> None:
    events = json.loads(debezium_envelope([KEY_MOVES, ROWID_MOVES], node_id="n", row_ids_only=True))
    assert [(e["before"], e["after"]) for e in events] == [
        ({"code": "A"}, {"code": "B"}),
        ({"rowid": 1}, {"rowid": 2}),
    ]


def test_rqlite_row_ids_only_identifies_without_rowid_rows_by_their_key() -> None:
    doc = json.loads(rqlite_envelope([WITHOUT_ROWID, ROWID_MOVES], node_id="n", row_ids_only=True))
    events = doc["payload"][0]["events"]
    assert events[0] == {"op": "INSERT", "table": "t", "after": {"k": "x"}}
    assert events[1] == {"op": "UPDATE", "table": "t", "new_row_id": 2, "old_row_id": 1}


def test_a_user_column_named_rowid_is_not_taken_for_the_row_id() -> None:
    # CREATE TABLE t(rowid TEXT, x): no declared key, so the key is the real rowid
    named = change("insert", {"rowid": 1}, None, {"rowid": "abc", "x": 2}, rowids=(None, 1))
    events = json.loads(debezium_envelope([named], node_id="n", row_ids_only=True))
    assert (events[0]["before"], events[0]["after"]) == (None, {"rowid": 1})


def one_transaction(count: int) -> list[RowChange]:
    """A transaction of every op, two tables, row ids and keys, blobs as base64."""
    changes = []
    for seq in range(1, count + 1):
        op = ("insert", "update", "delete")[seq % 3]
        image = {"id": seq, "v": f"é{seq}", "b": "AAE="}
        changes.append(
            RowChange(
                cid=42,
                seq=seq,
                table="t" if seq % 4 else "u",
                op=op,  # type: ignore[arg-type]
                old_rowid=None if op == "insert" else seq,
                new_rowid=None if op == "delete" else seq,
                pk={"id": seq},
                before=None if op == "insert" else image,
                after=None if op == "delete" else {**image, "v": "new"},
                timestamp_ms=1795650285719,
            )
        )
    return changes


@pytest.mark.parametrize("format", ["rqlite", "debezium"])
@pytest.mark.parametrize("row_ids_only", [False, True])
@pytest.mark.parametrize("page", [1, 7, 30, 100])
def test_a_large_transaction_built_in_pages_is_the_same_body(
    format: str, row_ids_only: bool, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body of a transaction too large for one batch is built a page at a time: the
    same bytes as the whole list's envelope."""
    monkeypatch.setattr("time.time_ns", lambda: 1795650285800_000_000)  # debezium's ts_ms
    changes = one_transaction(30)
    pages = [changes[i : i + page] for i in range(0, len(changes), page)]
    whole = {"rqlite": rqlite_envelope, "debezium": debezium_envelope}[format](
        changes, node_id="n1", service_id="shop", row_ids_only=row_ids_only
    )
    body, events = large_transaction_body(
        format, [[], *pages, []], node_id="n1", service_id="shop", row_ids_only=row_ids_only
    )
    assert (body, events) == (whole, 30)
    assert json.loads(body)  # one JSON document
    assert large_transaction_body(format, [[], []], node_id="n1") == (b"", 0)


def test_a_request_gets_transmit_timeout_per_started_8_mib() -> None:
    assert transmit_allowance(5.0, 0) == 5.0
    assert transmit_allowance(5.0, TIMEOUT_BYTES) == 5.0
    assert transmit_allowance(5.0, TIMEOUT_BYTES + 1) == 10.0
    assert transmit_allowance(5.0, 288 * 2**20) == 180.0
