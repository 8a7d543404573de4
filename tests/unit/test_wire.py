"""Wire helpers shared by the node and the pipeline."""

from __future__ import annotations

import pytest

from litecdc.errors import RequestError
from litecdc.wire import decode_key


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "{not json", '{"a": 1}', "[[1]]"])
def test_a_bad_key_is_a_request_error(text: str) -> None:
    with pytest.raises(RequestError, match="after_key"):
        decode_key(text, "after_key")


def test_keys_round_trip_blobs() -> None:
    assert decode_key('[1, "a", {"base64": "AP8="}]', "after_key") == [1, "a", b"\x00\xff"]
