"""Webhook envelopes with row_ids_only: each event identifies its row before and after."""

from __future__ import annotations

import json
from typing import Any

from litecdc.cdc.envelopes import debezium_envelope, rqlite_envelope
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
