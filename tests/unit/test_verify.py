"""``pipeline verify``'s comparison of a source table with its mirror, on Arrow tables."""

from __future__ import annotations

import pyarrow as pa

from litecdc.pipeline.tables import Column, TableSpec
from litecdc.pipeline.verify import compare

SPEC = TableSpec(
    "t", (Column("id", "INTEGER", "int64", True), Column("v", "TEXT", "string")), ("id",)
)


def _table(rows: list[tuple[int, str]]) -> pa.Table:
    return pa.table({"id": [r[0] for r in rows], "v": [r[1] for r in rows]})


def test_each_kind_of_difference_is_described_as_what_it_is() -> None:
    source = _table([(1, "a"), (2, "b"), (3, "c"), (4, "d"), (4, "d")])
    sink = _table([(2, "b"), (3, "x"), (4, "d"), (5, "e"), (2, "b")])
    found, total = compare(SPEC, source, sink)
    assert total == 5
    described = {tuple(d.key): (d.kind, d.describe()) for d in found}
    # before, a row missing at the sink read "1 row(s) at the sink, 1 at the source"
    assert described[(1,)] == ("missing", "key [1]: missing at the sink")
    assert described[(2,)][0] == "duplicate"
    assert described[(2,)][1].startswith("key [2]: 2 rows at the sink, 1 at the source")
    assert described[(3,)] == ("different", "key [3]: v: source 'c' != sink 'x'")
    assert described[(4,)] == ("missing", "key [4]: 1 row(s) at the sink, 2 at the source")
    assert described[(5,)][0] == "extra"
    assert described[(5,)][1] == "key [5]: at the sink only (deleted at the source?)"


def test_equal_tables_have_no_difference() -> None:
    rows = [(1, "a"), (2, "b")]
    assert compare(SPEC, _table(rows), _table(rows[::-1])) == ([], 0)
