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
     '[{"float": "inf", "base64": ""}]'],
)  # fmt: skip
def test_a_bad_key_is_a_request_error(text: str) -> None:
    with pytest.raises(RequestError, match="after_key"):
        decode_key(text, "after_key")


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
