"""Test doubles that run for real on this machine: a webhook receiver and TLS certificates.

Import from tests as ``from fakes import WebhookReceiver, make_certs`` (pytest puts
``tests/`` on ``sys.path`` because ``tests/conftest.py`` lives there).
"""

from __future__ import annotations

from .certs import CLIENT_COMMON_NAME, CertFiles, client_ssl_context, make_certs, server_ssl_context
from .webhook_receiver import (
    RecordedRequest,
    TLSFailure,
    WebhookReceiver,
    decode_standard_webhooks_secret,
    reserve_port,
    sign_standard_webhook,
    verify_standard_webhook,
)

__all__ = [
    "CLIENT_COMMON_NAME",
    "CertFiles",
    "RecordedRequest",
    "TLSFailure",
    "WebhookReceiver",
    "client_ssl_context",
    "decode_standard_webhooks_secret",
    "make_certs",
    "reserve_port",
    "server_ssl_context",
    "sign_standard_webhook",
    "verify_standard_webhook",
]
