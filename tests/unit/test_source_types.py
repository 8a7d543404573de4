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
