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

Publishing: up to ``IN_FLIGHT`` messages go out ahead of their confirms, on one channel
in confirm mode, so they reach the queue in (cid, seq) order; the batch returns once the
broker confirmed the last. Waiting for each confirm before the next publish (pika's
``BlockingConnection``) kept a batch at one round trip per message, about 2,000
messages/s (``bench/bench_message_sinks.py``). The first message the broker returns (no
queue takes it) or refuses (basic.nack: a queue at its length limit, say) stops the
publishing and fails the batch once the broker settled the messages already sent — none
of a failed attempt reaches a queue after a retry's —, and the channel is closed (what
comes of a failed batch must not count for the next); a channel or connection the broker
closes fails it at once. A connection the broker blocks (a resource alarm:
``connection.blocked``) holds what was sent unread in its socket, and closing it would
not stop the broker from taking those messages once the alarm clears, among a retry's
(pipeline QA: a connection given up after ``BLOCKED_TIMEOUT`` did so). So a batch
blocked that long fails but keeps its channel and connection ("draining"): the retry
first waits, up to ``BLOCKED_TIMEOUT`` each time, for the broker to settle them, and
sends nothing on a connection still blocked. The client is pika's ``AsyncioConnection``
on an event loop in a private thread
(``loop_thread.LoopThread``), so the sink's API stays synchronous; it
connects through the same connection workflow as ``BlockingConnection``, whose errors
``_connect_failed`` puts in terms of the URL.

Example::

    sink = RabbitMQSink("amqp://guest:guest@127.0.0.1:5672/?queue=orders", spec, "orders-mq")
    sink.prepare()
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import pika
import pika.exceptions
import pyarrow as pa
import pyarrow.compute as pc
from pika.adapters.asyncio_connection import AsyncioConnection
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
    AMQPConnectorPhaseErrorBase,
    AMQPConnectorSocketConnectError,
    AMQPConnectorStackTimeout,
)
from pika.exceptions import AuthenticationError

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import ChangeBatch, Sink
from litecdc.pipeline.sinks.loop_thread import LoopThread
from litecdc.pipeline.sinks.messages import (
    encode,
    event_messages,
    scoped_id,
    snapshot_done_message,
    snapshot_messages,
)
from litecdc.pipeline.sinks.registry import (
    AMQP_SHORT_STRING_BYTES,
    AmqpOptions,
    mask_url,
    parse_sink_url,
    scrub_password,
)
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")

#: the longest subscription name written whole in a message_id, an AMQP short string of
#: at most 255 bytes: with the registration and the longest id (a snapshot row's at a
#: 19-digit cid, 53 bytes) it stays within
MAX_NAME_IN_ID = 100
#: publishes awaiting their broker confirm at once (default 2000: 1000 gave 7-25% fewer
#: events/s, 3000 about the same, bench/bench_message_sinks.py on 2 cores)
IN_FLIGHT = 2000
RPC_TIMEOUT = 30.0  # seconds for the broker to answer a declaration or open a channel
CLOSE_TIMEOUT = 10.0  # seconds to wait for a graceful close
#: seconds the broker may hold the connection blocked (a resource alarm) before the batch
#: fails: the pipeline server applies one subscription at a time, so a longer wait would
#: hold every other subscription up as long (was 60 s); the failed one is retried with
#: the server's back-off (each retry waits this long again for the alarm to clear)
BLOCKED_TIMEOUT = 10.0
#: seconds a batch waits with confirms outstanding and none arriving before it fails (a
#: broker that stopped answering; a lost connection fails at once). Longer than
#: BLOCKED_TIMEOUT, whose error says why a blocked broker stopped
CONFIRM_TIMEOUT = 90.0
#: bytes of message bodies awaiting their confirm at once: large rows (RabbitMQ takes
#: messages up to 128 MB) must not fill memory with IN_FLIGHT of them (QA: 2000 rows of
#: 200 KB took +894 MB)
IN_FLIGHT_BYTES = 16 * 1024 * 1024
NOT_FOUND = 404  # AMQP reply code
#: AMQP's limit on a routing key (a short string)
MAX_ROUTING_KEY_BYTES = AMQP_SHORT_STRING_BYTES
T = TypeVar("T")


class _Returned(Exception):
    """The broker returned a mandatory message: no queue took it."""

    def __init__(self, message_id: str, reply_code: int, reply_text: str) -> None:
        super().__init__(f"message {message_id} returned ({reply_code} {reply_text})")


class _Nacked(Exception):
    """The broker refused a message (basic.nack)."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"basic.nack of message {message_id}")


class _NoConfirms(TimeoutError):
    """Confirms stopped arriving."""


class _Blocked(Exception):
    """The broker held the connection blocked (connection.blocked) for BLOCKED_TIMEOUT."""


class _ConfirmChannel:
    """A pika channel in confirm mode, used on the sink's loop only: its replies as
    awaitables, and the publishes the broker has not confirmed yet, by delivery tag (the
    broker numbers a confirm-mode channel's publishes 1, 2, …; a confirm may cover every
    tag up to its own, and may come out of order)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self._loop = asyncio.get_running_loop()
        #: the reason the channel closed (its connection's too): set once closed
        self.closed: asyncio.Future[BaseException] = self._loop.create_future()
        #: delivery tag -> (message_id, body size)
        self.unconfirmed: dict[int, tuple[str, int]] = {}
        self.unconfirmed_bytes = 0
        self.published = 0  # delivery tag of the last publish
        self._progress_at = self._loop.time()  # when a confirm last came (or a wait began)
        self._lowest = 1  # every tag below is confirmed
        #: the first message the broker returned or refused: the batch fails
        self.failure: _Returned | _Nacked | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._wait_for = 0
        self._past_failure = False
        #: while the connection is blocked: when a wait for confirms gives up (_Blocked)
        self.blocked_until: float | None = None
        channel.add_on_close_callback(self._on_close)
        channel.add_on_return_callback(self._on_return)

    @classmethod
    async def open(cls, connection: Any) -> _ConfirmChannel:
        opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self = cls(connection.channel(on_open_callback=lambda ch: _settle(opened, ch)))
        await self._either(opened)
        await self.call(lambda done: self.channel.confirm_delivery(self._on_confirm, done))
        return self

    @property
    def usable(self) -> bool:
        return not self.closed.done() and self.failure is None

    async def call(self, start: Callable[[Callable[[Any], None]], object]) -> Any:
        """Start an operation that answers through a callback (given as the argument);
        its answer, or the reason the channel closed first (``ChannelClosedByBroker``…)."""
        answer: asyncio.Future[Any] = self._loop.create_future()
        start(lambda result: _settle(answer, result))
        return await self._either(answer)

    async def _either(self, answer: asyncio.Future[T]) -> T:
        either: set[asyncio.Future[Any]] = {answer, self.closed}
        await asyncio.wait(either, timeout=RPC_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if answer.done():
            return answer.result()
        if self.closed.done():
            raise self.closed.result()
        raise TimeoutError(f"the broker did not answer within {RPC_TIMEOUT:g} s")

    def publish(self, exchange: str, key: str, body: bytes, message_id: str) -> None:
        """Send one persistent, mandatory message (buffered: it goes out while the loop
        waits, ``settle``)."""
        self.channel.basic_publish(
            exchange,
            key,
            body,
            pika.BasicProperties(
                message_id=message_id,
                delivery_mode=pika.DeliveryMode.Persistent,
                content_type="application/json",
            ),
            # every message must reach a queue: a vanished queue, or an exchange no
            # queue is bound to, would drop it while the run reports it applied
            mandatory=True,
        )
        self.published += 1
        self.unconfirmed[self.published] = (message_id, len(body))
        self.unconfirmed_bytes += len(body)

    def set_blocked(self, until: float | None, *, renew: bool = False) -> None:
        """The connection is blocked: a wait for confirms ends at ``until`` (loop time)
        with ``_Blocked`` — a deadline already set stays, unless ``renew`` (a drain's own
        wait: an alarm flapping on and off must not put it off for ever, review) —; None:
        it is not (any more)."""
        if until is not None and self.blocked_until is not None and not renew:
            return
        if until is not None and self.blocked_until is None:
            self._progress_at = self._loop.time()  # (no confirms while blocked: no silence)
        self.blocked_until = until
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)  # look again

    async def settle(self, at_most: int, *, past_failure: bool = False) -> None:
        """Wait until at most ``at_most`` publishes await their confirm. Raises the first
        message returned (``_Returned``) or refused (``_Nacked``) — with
        ``past_failure``, only once the rest are settled too —, why the channel closed
        (pika's error), ``_Blocked`` when the connection is blocked past
        ``blocked_until``, or ``_NoConfirms`` when none came for ``CONFIRM_TIMEOUT``."""
        self._progress_at = self._loop.time()  # the broker's silence counts from here on
        while True:
            if self.closed.done():
                raise self.closed.result()
            waiting = len(self.unconfirmed)
            if self.failure is not None and (not past_failure or waiting == 0):
                raise self.failure
            if waiting <= at_most:
                return
            now = self._loop.time()
            blocked_left = None if self.blocked_until is None else self.blocked_until - now
            if blocked_left is not None and blocked_left <= 0:
                raise _Blocked
            # measured from the last confirm: a few at the start of a wait do not make the
            # broker's silence after them count from zero again (QA: 190 s, not 90)
            left = self._progress_at + CONFIRM_TIMEOUT - now
            if left <= 0:
                raise _NoConfirms(
                    f"the broker confirmed none of {waiting} messages for {CONFIRM_TIMEOUT:g} s"
                )
            if blocked_left is not None:
                left = min(left, blocked_left)
            self._waiter = self._loop.create_future()
            self._wait_for, self._past_failure = at_most, past_failure
            try:
                await asyncio.wait({self._waiter}, timeout=left)
            finally:
                self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        failed = self.failure is not None and not self._past_failure
        if self.closed.done() or failed or len(self.unconfirmed) <= self._wait_for:
            waiter.set_result(None)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        tag = int(method.delivery_tag)
        if method.multiple:
            last = tag or self.published  # tag 0 with multiple: everything so far
            tags: Iterable[int] = range(self._lowest, last + 1)
            self._lowest = max(self._lowest, last + 1)
        else:
            tags = (tag,)
        refused = isinstance(method, pika.spec.Basic.Nack)
        self._progress_at = self._loop.time()
        for each in tags:
            sent = self.unconfirmed.pop(each, None)
            if sent is None:
                continue
            self.unconfirmed_bytes -= sent[1]
            if refused and self.failure is None:
                self.failure = _Nacked(sent[0])
        self._wake()

    def _on_return(self, _channel: Any, method: Any, properties: Any, _body: bytes) -> None:
        # the broker sends basic.return before the confirm of the same message
        if self.failure is None:
            self.failure = _Returned(
                str(properties.message_id), method.reply_code, str(method.reply_text)
            )
        self._wake()

    def _on_close(self, _channel: Any, reason: BaseException) -> None:
        _settle(self.closed, reason)
        self._wake()


def _settle(future: asyncio.Future[T], result: T) -> None:
    if not future.done():
        future.set_result(result)


class RabbitMQSink(Sink):
    kind = "log"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, AmqpOptions):
            raise SinkError(f"rabbitmq sink: {mask_url(url)} is not an amqp:// URL")
        self.options = options
        self.queue = options.queue or (None if options.exchange else f"litecdc.{spec.name}")
        longest = self.queue or f"litecdc.{spec.name}.snapshot_done"
        if len(longest.encode()) > MAX_ROUTING_KEY_BYTES:
            if self.queue:
                what, fix = f"queue name {longest!r}", "give a shorter ?queue= name"
            else:  # the table's name is in every routing key
                what, fix = f"routing key {longest!r}", "publish to a queue instead (?queue=)"
            raise SinkError(
                f"rabbitmq sink: the {what} is longer than AMQP's {MAX_ROUTING_KEY_BYTES} "
                f"bytes ({mask_url(url)}): {fix}"
            )
        self._safe = mask_url(url)
        # the loop thread owns the connection and the channel: touched only there
        self._loop: LoopThread | None = None
        self._conn: Any = None
        self._channel: _ConfirmChannel | None = None
        #: a channel whose batch the broker blocked: its messages may still be taken, and
        #: the next batch waits until they are settled (module docstring)
        self._draining: _ConfirmChannel | None = None
        #: (loop time) since when the broker blocks the connection; None while it does not
        self._blocked_since: float | None = None
        #: set while the connection is not blocked (or closed): what may send waits on it
        self._unblocked: asyncio.Event | None = None
        self._applied = 0

    def _fail(
        self,
        doing: str,
        what: Exception | str,
        hint: str = ": check the broker is up, the credentials and the vhost",
    ) -> SinkError:
        """``doing`` failed because of ``what`` (an error, or its description)."""
        text = what if isinstance(what, str) else str(what) or type(what).__name__
        detail = scrub_password(text, self.options.password, self.options.user)
        return SinkError(f"rabbitmq sink: {doing} ({self._safe}) failed: {detail}{hint}")

    def _write_failed(self, doing: str, exc: Exception) -> SinkError:
        """A batch cut short by the connection or the channel, or by a broker that
        stopped confirming: what happened, in words."""
        where = f"{self.options.host}:{self.options.port}"
        retried = "the batch is retried on a new connection"
        if isinstance(exc, pika.exceptions.ChannelClosed):
            text = f"the broker closed the channel: {exc.reply_code} {exc.reply_text}"
            hint = "the batch is retried on a new channel (the queue or exchange declared again)"
        elif isinstance(exc, _Blocked):
            text = (
                f"the broker at {where} blocked the connection for more than "
                f"{BLOCKED_TIMEOUT:g} s (a resource alarm: memory or disk is short there)"
            )
            hint = (
                "check the broker's log and free memory or disk; the batch is retried once "
                "the broker took or refused what was sent of it"
            )
        elif isinstance(exc, pika.exceptions.ConnectionClosed):
            text = f"the broker closed the connection: {exc.reply_code} {exc.reply_text}"
            hint = f"check the broker's log; {retried}"
        elif isinstance(exc, pika.exceptions.AMQPConnectionError):
            text = f"the connection to the broker at {where} was lost ({exc or type(exc).__name__})"
            hint = f"check that the broker is up; {retried}"
        elif isinstance(exc, _NoConfirms):
            text = f"{exc}"
            hint = f"check that the broker at {where} is up and not overloaded; {retried}"
        else:
            return self._fail(doing, exc)
        return self._fail(doing, text, hint=f": {hint}")

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
        elif isinstance(
            cause, pika.exceptions.StreamLostError | pika.exceptions.IncompatibleProtocolError
        ):
            # something listens there but hung up on AMQP's greeting: another protocol's
            # server, or a TLS listener given amqp:// (QA: was "check the credentials")
            tls_mixup = (
                "a TLS listener needs amqps://"
                if not o.tls
                else "amqps:// needs a TLS listener (5671)"
            )
            problem = f"the server at {where} closed the connection during the AMQP handshake"
            hint = (
                "check that the port is RabbitMQ's AMQP port (5672; 5671 for amqps://) and "
                f"not another service's; {tls_mixup}"
            )
        elif isinstance(cause, ssl.SSLError):
            problem = f"the TLS handshake with the broker at {where} failed"
            hint = "check the broker's certificate (and that the port is a TLS listener)"
        elif isinstance(exc, pika.exceptions.ChannelClosedByBroker):
            # the connection is up: a declaration was refused
            target = f"queue {self.queue!r}" if self.queue else f"exchange {o.exchange!r}"
            problem = f"the broker at {where} refused the {target}"
            hint = (
                f"user {o.user!r} needs the 'configure' permission on it to have it declared "
                "(or declare it beforehand: an existing one is taken as it is) and 'write' to "
                "publish"
                if exc.reply_code == 403
                else f"check the {target} on the broker"
            )
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

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._loop is None:
            self._loop = LoopThread("litecdc-rabbitmq-sink")
        return self._loop.run(coro, timeout)

    # -- set-up -----------------------------------------------------------------------

    def prepare(self) -> None:
        # nothing new on a connection the broker blocks, nor before what it holds unread of
        # a blocked batch is settled (module docstring)
        self._finish_draining("preparing")
        # a safety net: connecting and each of the (at most 6) broker calls bound their own
        timeout = self.options.connect_timeout + 6 * RPC_TIMEOUT + 5
        try:
            self._run(self._prepare(), timeout)
        except _Blocked as exc:  # (its connection kept: the alarm may clear by the retry)
            raise self._write_failed("preparing", exc) from exc
        except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as exc:
            # pika reports its connector's errors (a handshake timeout) and socket errors (an
            # unknown host) as they are, not as AMQPError
            self.close()
            raise self._connect_failed(exc) from exc

    def _parameters(self) -> pika.ConnectionParameters:
        o = self.options
        return pika.ConnectionParameters(
            host=o.host,
            port=o.port,
            virtual_host=o.vhost,
            credentials=pika.PlainCredentials(o.user, o.password),
            connection_attempts=1,
            socket_timeout=o.connect_timeout,
            # the whole of TCP, TLS and the AMQP handshake (pika's default: 15 s)
            stack_timeout=o.connect_timeout,
            # (no blocked_connection_timeout: pika would close a blocked connection, whose
            # unread messages the broker still takes once the alarm clears)
            ssl_options=pika.SSLOptions(ssl.create_default_context(), o.host) if o.tls else None,
            client_properties={"connection_name": f"litecdc-{self.subscription}"},
        )

    async def _prepare(self) -> None:
        if self._conn is None or not self._conn.is_open:
            self._channel = self._draining = None
            self._blocked_since = None
            self._unblocked = asyncio.Event()
            self._unblocked.set()
            self._conn = await self._connect()
            self._conn.add_on_connection_blocked_callback(lambda *_: self._on_blocked(True))
            self._conn.add_on_connection_unblocked_callback(lambda *_: self._on_blocked(False))
            unblocked = self._unblocked
            self._conn.add_on_close_callback(lambda *_: unblocked.set())  # (nothing to wait for)
        else:
            # a declaration on a blocked connection waits unanswered (RPC_TIMEOUT, then a
            # misleading "did not answer"): wait for the alarm to clear instead (review)
            await self._wait_unblocked()
        if self._channel is None or not self._channel.usable:
            self._channel = await _ConfirmChannel.open(self._conn)
            if self._blocked_since is not None:
                self._channel.set_blocked(self._blocked_since + BLOCKED_TIMEOUT)
        channel = self._channel
        if self.queue is not None:
            await self._declare_queue(channel)
        else:
            await self._declare_exchange(channel)

    async def _connect(self) -> Any:
        """An open ``AsyncioConnection`` on this loop: pika's connection workflow, as
        ``BlockingConnection`` runs it, so failures are the same exceptions."""
        finished: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        AsyncioConnection.create_connection(
            [self._parameters()],
            on_done=lambda result: _settle(finished, result),
            custom_ioloop=asyncio.get_running_loop(),
        )
        result = await finished
        if isinstance(result, BaseException):
            raise _workflow_error(result)
        return result

    async def _declare_queue(self, channel: _ConfirmChannel) -> None:
        """Take the queue as it is when it exists — a quorum or stream queue, one with a
        length limit or a TTL: declaring it again without its arguments is refused (406;
        QA), and a user may publish to a queue it may not declare (403) —, else declare a
        durable classic one."""
        name = self.queue
        try:
            await channel.call(
                lambda done: channel.channel.queue_declare(name, passive=True, callback=done)
            )
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != NOT_FOUND:
                raise
            channel = self._channel = await _ConfirmChannel.open(self._conn)
            await channel.call(
                lambda done: channel.channel.queue_declare(name, durable=True, callback=done)
            )
            log.info("rabbitmq sink: declared queue %s", name)

    async def _declare_exchange(self, channel: _ConfirmChannel) -> None:
        name = self.options.exchange
        try:
            await channel.call(
                lambda done: channel.channel.exchange_declare(name, passive=True, callback=done)
            )
        except pika.exceptions.ChannelClosedByBroker as exc:  # missing: a durable topic one
            if exc.reply_code != NOT_FOUND:
                raise
            channel = self._channel = await _ConfirmChannel.open(self._conn)
            await channel.call(
                lambda done: channel.channel.exchange_declare(
                    name, "topic", durable=True, callback=done
                )
            )
            log.info("rabbitmq sink: declared exchange %s", name)

    def _on_blocked(self, blocked: bool) -> None:
        """connection.blocked / unblocked (on the loop): waits for confirms learn it."""
        now = asyncio.get_running_loop().time()
        self._blocked_since = now if blocked else None
        if self._unblocked is not None:
            if blocked:
                self._unblocked.clear()
            else:
                self._unblocked.set()
        for channel in (self._channel, self._draining):
            if channel is not None:
                channel.set_blocked(now + BLOCKED_TIMEOUT if blocked else None)

    async def _wait_unblocked(self) -> None:
        """Return once the broker does not block the connection; ``_Blocked`` after
        BLOCKED_TIMEOUT."""
        if self._unblocked is None or self._unblocked.is_set():
            return
        try:
            await asyncio.wait_for(self._unblocked.wait(), BLOCKED_TIMEOUT)
        except TimeoutError:
            raise _Blocked from None

    # -- writes -----------------------------------------------------------------------

    def _finish_draining(self, doing: str) -> None:
        """Wait (up to BLOCKED_TIMEOUT) for the broker to settle what a blocked batch sent,
        before anything else is sent: SinkError while it still blocks the connection."""
        draining = self._draining
        if draining is None:
            return

        async def settle() -> None:
            if self._blocked_since is not None:
                draining.set_blocked(
                    asyncio.get_running_loop().time() + BLOCKED_TIMEOUT, renew=True
                )
            # (a stale message returned or refused is the failed batch's, retried now)
            with contextlib.suppress(_Returned, _Nacked):
                await draining.settle(0, past_failure=True)

        try:
            self._run(settle(), None)
        except _Blocked as exc:
            raise self._write_failed(doing, exc) from exc
        except (pika.exceptions.AMQPError, OSError, _NoConfirms) as exc:
            # the connection is gone (or the broker stopped answering): what it held unread
            # went with it, as far as this side can tell
            self.close()
            raise self._write_failed(doing, exc) from exc
        self._draining = None
        self._close_channel(draining)

    def _publish(self, messages: Iterable[tuple[str, dict[str, Any]]], doing: str) -> None:
        self._finish_draining(doing)
        if self._channel is None or not self._channel.usable:
            self.prepare()
        channel = self._channel
        assert channel is not None
        try:
            self._run(self._publish_all(channel, messages), None)
        except _Blocked as exc:
            if channel.unconfirmed:
                # kept, not closed: the broker may still take what it holds unread (module
                # docstring); the next batch waits for it
                self._draining, self._channel = channel, None
            raise self._write_failed(doing, exc) from exc
        except _Returned as exc:
            self._drop_channel()
            if self.queue is not None:
                raise self._fail(
                    f"{doing}: the queue is gone",
                    exc,
                    hint=": it is declared again when the batch is retried",
                ) from exc
            raise self._fail(
                f"{doing}: no queue bound to exchange {self.options.exchange!r} takes routing "
                f"key litecdc.{self.spec.name}.<op>, so a message would be lost",
                exc,
                hint=f": bind a queue (e.g. with litecdc.{self.spec.name}.#) or give the "
                "exchange an alternate exchange",
            ) from exc
        except _Nacked as exc:
            self._drop_channel()
            full = (
                f"queue {self.queue!r}"
                if self.queue
                else f"a queue bound to exchange {self.options.exchange!r}"
            )
            raise self._fail(
                f"{doing}: the broker refused a message",
                exc,
                hint=(
                    f": {full} is full (x-max-length or x-max-length-bytes with x-overflow "
                    "reject-publish) or the broker failed to store it (see its log); the "
                    "batch is retried"
                ),
            ) from exc
        except (pika.exceptions.AMQPError, OSError) as exc:  # lost, closed, or silent
            self.close()
            raise self._write_failed(doing, exc) from exc
        except Exception:  # the messages could not be made: what went out is not counted
            self._drop_channel()
            raise

    async def _publish_all(
        self, channel: _ConfirmChannel, messages: Iterable[tuple[str, dict[str, Any]]]
    ) -> None:
        """Publish every message in order, up to ``IN_FLIGHT`` ahead of their confirms;
        return once the broker confirmed them all. A message returned or refused stops
        the publishing, and fails the batch once the broker settled every message sent:
        none of a failed attempt reaches a queue after a retry's (unless the broker
        blocked the connection: module docstring)."""
        exchange = self.options.exchange or ""
        # nothing goes out on a blocked connection: wait for the alarm to clear (the batch
        # fails after BLOCKED_TIMEOUT, nothing of it sent)
        await self._wait_unblocked()
        try:
            for msg_id, doc in messages:
                key = self.queue or f"litecdc.{self.spec.name}.{doc['op']}"
                channel.publish(exchange, key, encode(doc), self.message_id(msg_id))
                if (
                    len(channel.unconfirmed) >= IN_FLIGHT
                    or channel.unconfirmed_bytes >= IN_FLIGHT_BYTES
                ):
                    await channel.settle(min(IN_FLIGHT, len(channel.unconfirmed)) // 2)
            await channel.settle(0)
        except (_Returned, _Nacked):
            # the batch's own error, whatever waiting for the rest of it comes to
            with contextlib.suppress(_Returned, _Nacked, pika.exceptions.AMQPError, OSError):
                await channel.settle(0, past_failure=True)
            raise

    def _drop_channel(self) -> None:
        """Leave a channel whose batch failed: confirms and returns of the rest of that
        batch may still come, and must not count for the next one."""
        channel, self._channel = self._channel, None
        if channel is not None:
            self._close_channel(channel)

    def _close_channel(self, channel: _ConfirmChannel) -> None:
        if self._loop is not None:

            async def close() -> None:
                if channel.channel.is_open:
                    channel.channel.close()

            self._run(close(), CLOSE_TIMEOUT)

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

    def keep_for_retry(self) -> bool:
        return self._draining is not None

    def close(self) -> None:
        loop, self._loop = self._loop, None
        conn, self._conn, self._channel = self._conn, None, None
        self._draining = None  # (stopping while blocked: see docs/pipeline.md)
        # a blocked broker reads no connection.close: cut the connection (review: each
        # close waited CLOSE_TIMEOUT, one after another at shutdown)
        blocked = self._unblocked is not None and not self._unblocked.is_set()
        if loop is None:
            return
        if conn is not None:
            try:
                loop.run(_close_connection(conn, abort=blocked), CLOSE_TIMEOUT + 1)
            except Exception as exc:  # closing a dead connection: nothing left to do
                log.debug("rabbitmq sink: close: %s", exc)
        loop.stop()


async def _close_connection(conn: Any, *, abort: bool = False) -> None:
    if conn.is_closed:
        return
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    conn.add_on_close_callback(lambda _conn, _reason: _settle(closed, None))
    if abort:
        # (pika has no public abort: this is what its blocked_connection_timeout used)
        conn._terminate_stream(pika.exceptions.ConnectionBlockedTimeout("closing while blocked"))
    elif not conn.is_closing:
        conn.close()
    await asyncio.wait_for(closed, CLOSE_TIMEOUT)


def _workflow_error(error: BaseException) -> BaseException:
    """The error of the connection workflow's last attempt, as ``BlockingConnection``
    raises it (an ``AMQPConnectionError`` for a failed socket connect, the phase's own
    error for a failed TLS or AMQP handshake)."""
    if not (isinstance(error, AMQPConnectionWorkflowFailed) and error.exceptions):
        return error
    last: BaseException = error.exceptions[-1]
    if isinstance(last, AMQPConnectorSocketConnectError):
        wrapped: BaseException = pika.exceptions.AMQPConnectionError(last)
        return wrapped
    if isinstance(last, AMQPConnectorPhaseErrorBase):
        phase: BaseException = last.exception
        return phase
    return last


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
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker):
        return f"{exc.reply_code} {exc.reply_text}"  # args[0] alone dropped the reason
    text = str(exc.args[0]) if exc.args else str(exc)
    # "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - Login was refused …'"
    return text.removeprefix("ConnectionClosedByBroker: ") or type(exc).__name__
