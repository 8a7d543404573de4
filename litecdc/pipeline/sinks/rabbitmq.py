"""RabbitMQ sink: one persistent message per row/event, publisher confirms (kind 'log').

``?queue=NAME`` publishes to that durable queue (declared if missing) through the
default exchange; ``?exchange=NAME`` publishes to that exchange (a durable topic exchange
is declared if missing) with routing key ``litecdc.<table>.<op>`` (op ``upsert``,
``delete``, ``snapshot`` or ``snapshot_done``); every message is
mandatory, so one no queue takes (none bound yet) fails the batch instead of vanishing.
Neither: queue ``litecdc.<table>``. Bodies are the event JSON (``litecdc.pipeline.sinks.messages``),
delivery mode 2 (persistent), content type application/json, ``message_id`` =
``<subscription>:<registration>:`` + ``message_id(cid, seq, op)`` (snapshot rows:
``snapshot_message_id``; the end of a snapshot: ``<init_cid>-snapshot-done``), as
NATS's ``Nats-Msg-Id`` (``messages.scoped_id``). AMQP holds at most 255 bytes there,
and a subscription's name has up to 200 characters: a name of more than
``MAX_NAME_IN_ID`` is written as its first 100 characters, ``~`` and 16 hex digits of
its SHA-256 (``~`` is in no name: no other name is written the same).

At-least-once: a batch counts as applied once the broker confirmed every message; a
retried batch is published again and consumers de-duplicate on ``message_id``. RabbitMQ
keeps no ids itself, so what the scope protects is the consumer's record of ids it saw:
the subscription's name keeps sources publishing into one exchange or queue apart, its
registration (``Sink.registration``, set by the server) a subscription re-created under
an earlier one's name — on another source, or a source rebuilt, the cids are the same
again, and a consumer would drop the new rows as ones it already had.
``applied_cid`` is what this process has delivered (0 after a restart: the pipeline
resumes from its own progress record).

Example::

    sink = RabbitMQSink("amqp://guest:guest@127.0.0.1:5672/?queue=orders", spec, "orders-mq")
    sink.prepare()
"""

from __future__ import annotations

import hashlib
import logging
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import pika
import pika.exceptions
import pyarrow as pa
import pyarrow.compute as pc
from pika.adapters.utils.connection_workflow import (
    AMQPConnectorException,
    AMQPConnectorStackTimeout,
)
from pika.exceptions import AuthenticationError

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.messages import (
    encode,
    event_messages,
    scoped_id,
    snapshot_done_message,
    snapshot_messages,
)
from litecdc.pipeline.sinks.registry import AmqpOptions, mask_url, parse_sink_url, scrub_password
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")

#: the longest subscription name written whole in a message_id, an AMQP short string of
#: at most 255 bytes: with the registration and the longest id (a snapshot row's at a
#: 19-digit cid, 53 bytes) it stays within
MAX_NAME_IN_ID = 100


class RabbitMQSink(Sink):
    kind = "log"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, AmqpOptions):
            raise SinkError(f"rabbitmq sink: {mask_url(url)} is not an amqp:// URL")
        self.options = options
        self.queue = options.queue or (None if options.exchange else f"litecdc.{spec.name}")
        self._safe = mask_url(url)
        self._conn: Any = None
        self._channel: Any = None
        self._applied = 0

    def _fail(
        self,
        doing: str,
        exc: Exception,
        hint: str = ": check the broker is up, the credentials and the vhost",
    ) -> SinkError:
        detail = scrub_password(
            str(exc) or type(exc).__name__, self.options.password, self.options.user
        )
        return SinkError(f"rabbitmq sink: {doing} ({self._safe}) failed: {detail}{hint}")

    def _connect_failed(self, exc: BaseException) -> SinkError:
        """What went wrong connecting, said in terms of the URL: which broker (host:port)
        could not be reached or refused what, and what to check."""
        o = self.options
        where = f"{o.host}:{o.port}"
        cause = _innermost(exc)
        if isinstance(exc, pika.exceptions.ProbableAuthenticationError | AuthenticationError):
            problem = f"the broker at {where} refused the login of user {o.user!r}"
            hint = "check the URL's user and password"
        elif isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
            problem = f"the broker at {where} refused access to virtual host {o.vhost!r}"
            hint = (
                f"check that the vhost exists and user {o.user!r} has permissions on it (the "
                "URL's path names it; none or %2F is the default vhost '/')"
            )
        elif isinstance(cause, socket.gaierror):
            problem = f"cannot reach the broker at {where}"
            hint = f"check the URL's host name (no address found for {o.host!r})"
        elif isinstance(cause, AMQPConnectorStackTimeout | TimeoutError):
            protocol = "AMQP over TLS" if o.tls else "AMQP"
            problem = (
                f"the broker at {where} did not answer ({protocol}) within {o.connect_timeout:g} s"
            )
            hint = (
                "check that the port is RabbitMQ's AMQP port (5672; 5671 for amqps://, which "
                "must be a TLS listener) and that the broker is not overloaded"
            )
        elif isinstance(cause, ssl.SSLError):
            problem = f"the TLS handshake with the broker at {where} failed"
            hint = "check the broker's certificate (and that the port is a TLS listener)"
        elif isinstance(cause, OSError):
            problem = f"cannot reach the broker at {where}"
            hint = (
                f"check that RabbitMQ is running and listens on {where} (the URL's host and "
                "port) and that nothing between blocks the connection"
            )
        else:
            problem = f"connecting to the broker at {where} failed"
            hint = "check the broker is up, the URL's credentials and its vhost"
        reason = _reason(cause)
        detail = scrub_password(reason, o.password, o.user)
        return SinkError(f"rabbitmq sink: {problem} ({self._safe}): {detail}: {hint}")

    def prepare(self) -> None:
        o = self.options
        params = pika.ConnectionParameters(
            host=o.host,
            port=o.port,
            virtual_host=o.vhost,
            credentials=pika.PlainCredentials(o.user, o.password),
            connection_attempts=1,
            socket_timeout=o.connect_timeout,
            blocked_connection_timeout=60,
            ssl_options=pika.SSLOptions(ssl.create_default_context(), o.host) if o.tls else None,
            client_properties={"connection_name": f"litecdc-{self.subscription}"},
        )
        try:
            if self._conn is None or self._conn.is_closed:
                self._conn = pika.BlockingConnection(params)
                self._channel = None
            if self._channel is None or self._channel.is_closed:
                channel = self._conn.channel()
                channel.confirm_delivery()  # basic_publish now waits for the broker's ack
                self._channel = channel
            if self.queue is not None:
                self._channel.queue_declare(self.queue, durable=True)
            else:
                self._declare_exchange()
        except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as exc:
            # pika raises its connector's errors (a handshake timeout) and socket errors (an
            # unknown host) as they are, not as AMQPError
            self.close()
            raise self._connect_failed(exc) from exc

    def _declare_exchange(self) -> None:
        try:
            self._channel.exchange_declare(self.options.exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker:  # missing: make a durable topic one
            self._channel = self._conn.channel()
            self._channel.confirm_delivery()
            self._channel.exchange_declare(self.options.exchange, "topic", durable=True)
            log.info("rabbitmq sink: declared exchange %s", self.options.exchange)

    def _publish(self, messages: Iterable[tuple[str, dict[str, Any]]], doing: str) -> None:
        if self._channel is None or self._channel.is_closed:
            self.prepare()
        exchange = self.options.exchange or ""
        try:
            for msg_id, doc in messages:
                key = self.queue or f"litecdc.{self.spec.name}.{doc['op']}"
                self._channel.basic_publish(
                    exchange,
                    key,
                    encode(doc),
                    pika.BasicProperties(
                        message_id=self.message_id(msg_id),
                        delivery_mode=pika.DeliveryMode.Persistent,
                        content_type="application/json",
                    ),
                    # every message must reach a queue: a vanished queue, or an exchange
                    # no queue is bound to, would drop it while the run reports it applied
                    mandatory=True,
                )
        except pika.exceptions.UnroutableError as exc:
            if self.queue is not None:
                raise self._fail(f"{doing}: the queue is gone", exc) from exc
            raise self._fail(
                f"{doing}: no queue bound to exchange {self.options.exchange!r} takes routing "
                f"key litecdc.{self.spec.name}.<op>, so a message would be lost",
                exc,
                hint=f": bind a queue (e.g. with litecdc.{self.spec.name}.#) or give the "
                "exchange an alternate exchange",
            ) from exc
        except pika.exceptions.NackError as exc:
            raise self._fail(f"{doing}: the broker refused a message", exc) from exc
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise self._fail(doing, exc) from exc

    def message_id(self, msg_id: str) -> str:
        """The AMQP ``message_id`` of the message ``msg_id`` (module docstring)."""
        name = self.subscription
        if len(name) > MAX_NAME_IN_ID:
            digest = hashlib.sha256(name.encode()).hexdigest()[:16]
            name = f"{name[:MAX_NAME_IN_ID]}~{digest}"
        return scoped_id(name, self.registration, msg_id)

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self._publish(snapshot_messages(rows, self.spec), "publishing a chunk")

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        if batch.end_cid <= self._applied:
            return False
        if self._applied and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], self._applied))
        doing = f"publishing changes up to cid {batch.end_cid}"
        self._publish(event_messages(events, self.spec), doing)
        self._applied = batch.end_cid
        return True

    def finish_snapshot(self, init_cid: int) -> int:
        """A log keeps no rows to sweep: consumers get a 'snapshot_done' message and drop
        the rows whose last message is older (``messages`` module)."""
        marker = [snapshot_done_message(self.spec, init_cid)]
        self._publish(marker, "publishing the end of the snapshot")
        return 0

    def applied_cid(self) -> int:
        return self._applied

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except pika.exceptions.AMQPError as exc:
                log.debug("rabbitmq sink: close: %s", exc)


def _innermost(exc: BaseException) -> BaseException:
    """The error at the bottom of pika's wrappers (``AMQPConnectionError`` holds an
    ``AMQPConnectorSocketConnectError`` whose ``exception`` is the
    ``ConnectionRefusedError``; a failed workflow holds each attempt's)."""
    while True:
        attempts = getattr(exc, "exceptions", None)
        if isinstance(attempts, list) and attempts:
            inner = attempts[-1]  # the last attempt's
        elif exc.args:
            inner = exc.args[0]
        else:
            inner = getattr(exc, "exception", None)
        if not isinstance(inner, BaseException):
            return exc
        exc = inner


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]  # "connection refused"
    if isinstance(exc, AMQPConnectorStackTimeout):
        return "timed out"
    text = str(exc.args[0]) if exc.args else str(exc)
    # "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - Login was refused …'"
    return text.removeprefix("ConnectionClosedByBroker: ") or type(exc).__name__
