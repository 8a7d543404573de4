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

from litecdc.cdc.config import STDOUT, CDCConfig, build_ssl_context, redact_endpoint
from litecdc.cdc.signing import decode_secret, signature_headers
from litecdc.errors import ConfigError
from litecdc.webhook_client import (
    RequestAborted,
    RequestExpired,
    RequestWithdrawn,
    WebhookClient,
)

USER_AGENT = "litecdc-cdc/0.1"


class TransmitError(Exception):
    """One attempt to deliver a batch failed; the service retries per its policy."""


class Withdrawn(Exception):
    """``may_send`` said no before anything of the batch was sent."""


class Sink(Protocol):
    def send(
        self, body: bytes, message_id: str, *, may_send: Callable[[], bool] | None = None
    ) -> None:
        """Deliver one batch or raise TransmitError — for every way it can fail, since
        the service applies its retry policy, drop limit and status to TransmitErrors
        only. ``message_id`` is stable across retries. ``may_send``, when given, is asked
        as late as the sink can before the batch's first byte goes out (the service: is
        this node still the leader?); False: raise Withdrawn, having sent nothing."""

    def abort(self) -> None:
        """Called from another thread when the service stops: make a ``send`` in progress
        end now (raising TransmitError), and every later one. May do nothing when sends
        cannot block for long; a sink registered without it is left to end its send."""

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


#: a request gets transmit_timeout for every TIMEOUT_BYTES of body, started: a batch of
#: large rows, or one transaction of many (never split), takes longer to send and read
#: than a few seconds allow, and would fail on every attempt (QA: a 600,000-row
#: transaction, 288 MB of JSON, stopped all delivery with transmit_timeout 5s)
TIMEOUT_BYTES = 8 * 2**20


def transmit_allowance(transmit_timeout: float, body_bytes: int) -> float:
    """Seconds one request of ``body_bytes`` may take: ``transmit_timeout`` per started
    ``TIMEOUT_BYTES``."""
    return transmit_timeout * max(1, -(-body_bytes // TIMEOUT_BYTES))


class WebhookSink:
    """POST each batch as JSON to an HTTP(S) endpoint; any 2xx is success.

    ``transmit_timeout`` bounds the whole request, per started ``TIMEOUT_BYTES`` of body
    (``litecdc.webhook_client``: a timer shuts the request's socket down at its deadline;
    ``abort`` does the same at shutdown). The status decides: the body of an answer is
    read only in part. URL credentials go as basic auth, so no log line or error message
    shows them.
    """

    def __init__(self, config: CDCConfig) -> None:
        self._key = decode_secret(config.hmac_secret) if config.hmac_secret else None
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        headers.update(config.headers)
        self._client = WebhookClient(
            config.endpoint,
            timeout=config.transmit_timeout,
            headers=headers,
            verify=build_ssl_context(config.tls) if config.scheme == "https" else True,
            sni_hostname=config.tls.server_name,
        )

    def send(
        self, body: bytes, message_id: str, *, may_send: Callable[[], bool] | None = None
    ) -> None:
        headers = {}
        if self._key is not None:
            headers = signature_headers(self._key, message_id, int(time.time()), body)
        timeout = transmit_allowance(self._client.timeout, len(body))
        try:
            # (asked once connected and TLS done, before the request's first byte)
            answer = self._client.post(body, headers, timeout=timeout, may_send=may_send)
        except RequestWithdrawn:
            raise Withdrawn from None
        except RequestAborted:
            raise TransmitError("aborted: the CDC service is stopping") from None
        except RequestExpired:
            allowed = f"{self._client.timeout:g}s"
            if timeout > self._client.timeout:
                allowed += (
                    f"; {timeout:g}s for this {len(body) / 2**20:.0f} MiB body: one per "
                    f"{TIMEOUT_BYTES // 2**20} MiB started"
                )
            raise TransmitError(
                f"timed out: no complete answer within transmit_timeout ({allowed})"
            ) from None
        except httpx.TimeoutException as exc:
            raise TransmitError(f"timed out: {exc.__class__.__name__}") from exc
        except Exception as exc:  # every failure is the batch's to retry, whatever raised
            # (h11's LocalProtocolError, raised for a body the client cannot frame, is not
            # an httpx.HTTPError: httpcore lets it through)
            raise TransmitError(f"{exc.__class__.__name__}: {exc}") from exc
        if not 200 <= answer.status < 300:
            where = f", a redirect to {redact_endpoint(answer.location)}" if answer.location else ""
            if answer.status == 413:
                # (scale QA: a 100k-row transaction's 13.5 MB body was refused, retried for
                # good, and "HTTP 413" alone did not say why nor what to do)
                where = (
                    f" (Payload Too Large) to this {len(body) / 2**20:.1f} MiB body: lower "
                    "max_batch_events, or raise the endpoint's body limit — a transaction "
                    "is never split, so its limit must hold the largest one"
                )
            raise TransmitError(f"endpoint answered HTTP {answer.status}{where}")

    def abort(self) -> None:
        self._client.abort()

    def close(self) -> None:
        self._client.close()


class StdoutSink:
    """Print each batch as one JSON line (``--cdc-config stdout``)."""

    def __init__(self, config: CDCConfig, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout

    def send(
        self, body: bytes, message_id: str, *, may_send: Callable[[], bool] | None = None
    ) -> None:
        if may_send is not None and not may_send():
            raise Withdrawn
        try:
            self._stream.write(body.decode() + "\n")
            self._stream.flush()
        except Exception as exc:  # a closed pipe (… | head), a full disk, a closed stream
            raise TransmitError(f"stdout: {exc.__class__.__name__}: {exc}") from exc

    def abort(self) -> None:
        pass  # a write to a stalled pipe cannot be interrupted

    def close(self) -> None:
        pass


register_sink("http", WebhookSink)
register_sink("https", WebhookSink)
register_sink(STDOUT, StdoutSink)
