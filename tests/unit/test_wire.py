"""Wire helpers shared by the node and the pipeline."""

from __future__ import annotations

import json
import math

import pytest

from litecdc.errors import RequestError
from litecdc.wire import decode_key, encode_key


@pytest.mark.parametrize(
    "text",
    ["[" * 5000 + "]" * 5000, "{not json", '{"a": 1}', "[[1]]", '[{"float": "big"}]',
     '[{"float": "inf", "base64": ""}]', '[{"float": []}]'],
)  # fmt: skip
def test_a_bad_key_is_a_request_error(text: str) -> None:
    with pytest.raises(RequestError, match="after_key"):
        decode_key(text, "after_key")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[99999999999999999999]", "99999999999999999999 is outside SQLite's 64-bit"),
        ("[-9223372036854775809]", "outside SQLite's 64-bit integer range"),
        ('[{"float": "nan"}]', "a blob key value is"),
        ("[NaN]", "NaN is not a key value"),
        ("[Infinity]", "Infinity is not a key value"),
        ("[1e400]", "1e400 is beyond a 64-bit float's range"),
    ],
)
def test_a_key_value_no_sqlite_key_holds_is_a_request_error(text: str, says: str) -> None:
    """Fuzz QA: an integer beyond 64 bits was a 500 (binding it failed), a NaN answered an
    empty page marked done (SQLite stores NaN as NULL: no key is NaN)."""
    with pytest.raises(RequestError, match="after_key") as raised:
        decode_key(text, "after_key")
    assert says in str(raised.value)
    edges = [-(2**63), 2**63 - 1, 1.7976931348623157e308]
    assert decode_key(json.dumps(edges), "after_key") == edges


def test_keys_round_trip_blobs() -> None:
    assert decode_key('[1, "a", {"base64": "AP8="}]', "after_key") == [1, "a", b"\x00\xff"]


def test_keys_round_trip_infinities_as_valid_json() -> None:
    key = [math.inf, -math.inf, 1.5, None, "inf", b"\x01"]
    text = encode_key(key)
    assert json.loads(text, parse_constant=_no_constant) == [
        {"float": "inf"}, {"float": "-inf"}, 1.5, None, "inf", {"base64": "AQ=="}
    ]  # fmt: skip
    assert decode_key(text, "after_key") == key


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")
