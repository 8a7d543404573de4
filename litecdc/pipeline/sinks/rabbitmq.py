"""RabbitMQ sink: one persistent message per row/event, publisher confirms (kind 'log').

``?queue=NAME`` publishes to that durable queue (declared if missing) through the
default exchange; ``?exchange=NAME`` publishes to that exchange (a durable topic exchange
is declared if missing) with routing key ``litecdc.<table>.<op>``; every message is
mandatory, so one no queue takes (none bound yet) fails the batch instead of vanishing.
Neither: queue ``litecdc.<table>``. Bodies are the event JSON (``litecdc.pipeline.sinks.messages``),
``message_id`` = ``message_id(cid, seq, op)`` (snapshot rows: ``snapshot_message_id``),
delivery mode 2 (persistent), content type application/json.

At-least-once: a batch counts as applied once the broker confirmed every message; a
retried batch is published again and consumers de-duplicate on ``message_id``.
``applied_cid`` is what this process has delivered (0 after a restart: the pipeline
resumes from its own progress record).

Example::

    sink = RabbitMQSink("amqp://guest:guest@127.0.0.1:5672/?queue=orders", spec, "orders-mq")
    sink.prepare()
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from typing import Any

import pika
import pika.exceptions
import pyarrow as pa
import pyarrow.compute as pc

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.messages import encode, event_messages, snapshot_messages
from litecdc.pipeline.sinks.registry import AmqpOptions, mask_url, parse_sink_url
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")


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
        detail = str(exc) or type(exc).__name__
        if self.options.password and self.options.password != "guest":
            detail = detail.replace(self.options.password, "***")
        return SinkError(f"rabbitmq sink: {doing} ({self._safe}) failed: {detail}{hint}")

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
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise self._fail("connecting", exc) from exc

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
                        message_id=msg_id,
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
        return 0  # a log keeps no rows to sweep

    def applied_cid(self) -> int:
        return self._applied

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None and conn.is_open:
            try:
                conn.close()
            except pika.exceptions.AMQPError as exc:
                log.debug("rabbitmq sink: close: %s", exc)
