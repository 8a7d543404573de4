"""Which Arrow type the pull source mirrors a column as, from its declared type."""

from __future__ import annotations

import pytest

from litecdc import Statement, Store
from litecdc.db.source import arrow_type_name


@pytest.mark.parametrize(
    ("declared", "arrow"),
    [
        ("INTEGER", "int64"), ("BIGINT", "int64"), ("TEXT", "string"), ("VARCHAR(5)", "string"),
        ("BLOB", "binary"), ("REAL", "float64"), ("DOUBLE PRECISION", "float64"),
        ("BOOLEAN", "int64"), ("DATETIME", "string"), ("", "string"),
        ("NUMERIC", "float64"), ("DECIMAL(10,2)", "float64"), ("NUMBER", "float64"),
        ("MONEY", "float64"), ("SERIAL", "float64"), ("YEAR", "float64"),
        ("UNSIGNED DEC(4)", "float64"), ("BIGNUMERIC", "float64"), ("SMALLDECIMAL", "float64"),
        ("AUTONUMBER", "float64"), ("CURRENCY", "float64"), ("SMALLMONEY", "float64"),
        ("OID", "float64"), ("LONG", "string"),  # (MySQL's and Oracle's LONG are text)
        ("PHONENUMBER", "string"),
        ("DECADE", "string"),  # (words, not parts of them)
        # NUMERIC affinity, but text in practice (types QA): as an untyped column
        ("JSON", "string"), ("jsonb", "string"), ("UUID", "string"), ("STRING", "string"),
        ("ANY", "string"), ("ENUM('a','b')", "string"), ("XML", "string"),
        ("INET", "string"), ("EMAIL", "string"), ("URL", "string"), ("CIDR", "string"),
        ("COMPANY", "string"), ("INTERVAL", "int64"),  # SQLite: INTERVAL has INT affinity
    ],
)  # fmt: skip
def test_declared_types_map_to_arrow_types(declared: str, arrow: str) -> None:
    assert arrow_type_name(declared) == arrow


def test_a_json_column_is_served_as_its_text_and_numbers_written_out(store: Store) -> None:
    """Types QA: a column declared JSON (NUMERIC affinity) was mirrored as a double, and
    its first text value stopped the subscription."""
    store.execute(
        [
            Statement("CREATE TABLE docs(id INTEGER PRIMARY KEY, body JSON, ref UUID, peer INET)"),
            Statement("""INSERT INTO docs VALUES(1, '{"a": [1, 2]}', 'f47ac10b', '::1')"""),
            Statement("INSERT INTO docs VALUES(2, 12345678901234567, 0.1, 10)"),
        ]
    )
    page = store.source_rows("docs", None, None, 10)
    assert page.rows.column("body").to_pylist() == ['{"a": [1, 2]}', "12345678901234567"]
    assert page.rows.column("ref").to_pylist() == ["f47ac10b", "0.1"]
    assert page.rows.column("peer").to_pylist() == ["::1", "10"]


def test_an_integer_in_a_double_column_is_taken_when_a_double_holds_it_exactly(
    store: Store,
) -> None:
    """Sinks QA: every integer past 2**53 in a column mirrored as double was refused,
    2**60 too (a double holds it exactly); one it would round stays refused, naming it."""
    from litecdc.errors import DataTypeError

    store.execute(
        [
            Statement("CREATE TABLE n(id INTEGER PRIMARY KEY, v NUMERIC)"),
            Statement("INSERT INTO n VALUES(1, ?), (2, ?), (3, ?)", (2**53, 2**60, -(2**63))),
        ]
    )
    page = store.source_rows("n", None, None, 10)
    assert page.rows.column("v").to_pylist() == [2.0**53, 2.0**60, -(2.0**63)]
    store.execute([Statement("INSERT INTO n VALUES(4, ?)", (2**63 - 1,))])
    with pytest.raises(DataTypeError) as refused:
        store.source_rows("n", None, None, 10)
    assert str(refused.value).startswith(
        "table n column v: an INTEGER value at key [4] does not fit the column's mirrored "
        "type float64 (declared 'NUMERIC')"
    )
