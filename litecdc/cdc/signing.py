"""Standard Webhooks request signing (https://www.standardwebhooks.com/).

Headers: ``webhook-id`` (the message id, the same on every retry), ``webhook-timestamp``
(Unix seconds) and ``webhook-signature`` = ``v1,`` + base64(HMAC-SHA256(key,
f"{id}.{timestamp}.{body}")), where the key is the base64 part of a ``whsec_`` secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from litecdc.errors import ConfigError

SECRET_PREFIX = "whsec_"


def decode_secret(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret (a bare base64 key is accepted too)."""
    encoded = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError('cdc config: hmac_secret must be "whsec_" followed by base64') from None
    if len(key) < 16:
        raise ConfigError("cdc config: hmac_secret must hold at least 16 bytes of key")
    return key


def signature_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }
