"""Standard Webhooks signing: litecdc's signatures verify with an independent checker."""

from __future__ import annotations

from fakes import verify_standard_webhook

from litecdc.cdc.signing import decode_secret, signature_headers

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_message_ids_with_dots_verify() -> None:
    """litecdc's ids hold the node id ("127.0.0.1:14002-3-5"); the fake used to refuse
    any id with a dot, which the reference libraries accept (QA)."""
    body = b'{"payload": []}'
    for message_id in ("127.0.0.1:14002-3-5", "node-1-3-5", "a.b.c"):
        headers = signature_headers(decode_secret(SECRET), message_id, 1614265330, body)
        assert headers["webhook-id"] == message_id
        assert verify_standard_webhook(SECRET, headers, body, tolerance_seconds=None)
        assert not verify_standard_webhook(SECRET, headers, body + b" ", tolerance_seconds=None)
