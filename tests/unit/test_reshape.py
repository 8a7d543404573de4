"""Which DDL changes a table's rows without row changes (db/reshape.py)."""

from __future__ import annotations

import pytest

from litecdc.db.reshape import gives_rows_a_value


@pytest.mark.parametrize(
    ("default", "gives"),
    [
        (None, False),
        ("NULL", False),
        (" null ", False),
        ("(NULL)", False),
        ("((null))", False),
        ("''", True),
        ("0", True),
        ("'NULL'", True),
        ("(1) + (2)", True),
    ],
)
def test_which_defaults_give_existing_rows_a_value(default: str | None, gives: bool) -> None:
    """ADD COLUMN with such a DEFAULT changes a table's rows without row changes (the node
    records it, the pipeline copies the table again); QA: ((NULL)) was taken for a value."""
    assert gives_rows_a_value(default) is gives
