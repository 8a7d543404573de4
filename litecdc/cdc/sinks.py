"""Where batches go. One registry maps an endpoint's scheme to a sink factory, so new
schemes can be added (``register_sink``) without touching the service.

Built in: ``http`` and ``https`` (:class:`WebhookSink`) and ``stdout`` (:class:`StdoutSink`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

import httpx

from litecdc.cdc.config import STDOUT, CDCConfig, build_ssl_context
from litecdc.cdc.signing import decode_secret, signature_headers
from litecdc.errors import ConfigError

USER_AGENT = "litecdc-cdc/0.1"


class TransmitError(Exception):
    """One attempt to deliver a batch failed; the service retries per its policy."""


class Sink(Protocol):
    def send(self, body: bytes, message_id: str) -> None:
        """Deliver one batch or raise TransmitError. ``message_id`` is stable across retries."""

    def close(self) -> None: ...


SinkFactory = Callable[[CDCConfig], Sink]
_REGISTRY: dict[str, SinkFactory] = {}


def register_sink(scheme: str, factory: SinkFactory) -> None:
    """Make ``scheme://`` endpoints deliver through ``factory(config)``."""
    _REGISTRY[scheme.lower()] = factory


def known_schemes() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def create_sink(config: CDCConfig) -> Sink:
    factory = _REGISTRY.get(config.scheme)
    if factory is None:
        raise ConfigError(f"cdc config: no sink for endpoint scheme {config.scheme!r}")
    return factory(config)


class WebhookSink:
    """POST each batch as JSON to an HTTP(S) endpoint; any 2xx is success."""

    def __init__(self, config: CDCConfig) -> None:
        # credentials in the URL become basic auth and leave the URL, so that no log
        # line or error message (httpx logs every request's URL) can show them
        url = httpx.URL(config.endpoint)
        auth = httpx.BasicAuth(url.username, url.password) if url.userinfo else None
        self._url = url.copy_with(userinfo=b"") if url.userinfo else url
        self._key = decode_secret(config.hmac_secret) if config.hmac_secret else None
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        headers.update(config.headers)
        verify: object = True
        if config.scheme == "https":
            verify = build_ssl_context(config.tls)
        extensions = {}
        if config.tls.server_name:
            extensions["sni_hostname"] = config.tls.server_name
        self._extensions = extensions
        self._client = httpx.Client(
            auth=auth,
            headers=headers,
            timeout=config.transmit_timeout,
            verify=verify,  # type: ignore[arg-type]
            follow_redirects=False,
        )

    def send(self, body: bytes, message_id: str) -> None:
        headers = {}
        if self._key is not None:
            headers = signature_headers(self._key, message_id, int(time.time()), body)
        try:
            response = self._client.post(
                self._url, content=body, headers=headers, extensions=self._extensions
            )
        except httpx.TimeoutException as exc:
            raise TransmitError(f"timed out: {exc.__class__.__name__}") from exc
        except httpx.HTTPError as exc:
            raise TransmitError(f"{exc.__class__.__name__}: {exc}") from exc
        if not 200 <= response.status_code < 300:
            raise TransmitError(f"endpoint answered HTTP {response.status_code}")

    def close(self) -> None:
        self._client.close()


class StdoutSink:
    """Print each batch as one JSON line (``--cdc-config stdout``)."""

    def __init__(self, config: CDCConfig, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    def send(self, body: bytes, message_id: str) -> None:
        self._stream.write(body.decode() + "\n")
        self._stream.flush()

    def close(self) -> None:
        pass


register_sink("http", WebhookSink)
register_sink("https", WebhookSink)
register_sink(STDOUT, StdoutSink)
