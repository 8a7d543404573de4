"""NATS JetStream sink: one message per row/event (kind 'log').

Messages go to ``<subject>.<table>`` (``?subject=``, default ``litecdc``; characters a
subject cannot hold become '_') in stream ``?stream=`` (default ``LITECDC``), created
if missing with subjects ``<subject>.>``. The body is the event's JSON
(``litecdc.pipeline.sinks.messages``); header ``Nats-Msg-Id`` =
``<subscription>:<registration>:`` + ``message_id(cid, seq, op)`` (snapshot rows:
``snapshot_message_id``; the end of a snapshot: ``<init_cid>-snapshot-done``), so
JetStream drops a replayed publish within the stream's duplicate window (2 minutes by
default). The subscription's name keeps sources
publishing into one stream apart; its registration (``Sink.registration``, set by the
server: ``registration_id``) keeps a subscription re-created under an earlier one's name
apart from it — the earlier one's ids would otherwise drop its messages for 2 minutes.
Both stay the same on every retry of a batch. Every publish is acked before a batch
counts as applied.

``applied_cid`` lives in the KV bucket ``litecdc_sinks`` (key: stream + subscription),
written after the batch's last ack. A crash between the two re-publishes the batch,
which the duplicate window drops — exactly once while the retry comes within the
window, at least once after it. The record outlives the subscription, so it is
forgotten when a subscription of that name registers (``forget_progress``): a new
subscription reusing an old one's name, perhaps on another source, starts from nothing.

nats-py is asyncio; the sink runs its own event loop in a private thread
(``loop_thread.LoopThread``) so its API stays synchronous.

Example::

    sink = NatsSink("nats://127.0.0.1:4222?stream=ORDERS&subject=shop", spec, "orders-nats")
    sink.prepare()
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pyarrow as pa
import pyarrow.compute as pc
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import StreamConfig
from nats.js.kv import KeyValue

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
    NatsOptions,
    mask_url,
    parse_sink_url,
    scrub_url_password,
)
from litecdc.pipeline.tables import CID_COLUMN, TableSpec

log = logging.getLogger("litecdc.pipeline")

STATE_BUCKET = "litecdc_sinks"
IN_FLIGHT = 1000  # publishes awaiting their ack at once
PUBLISH_TIMEOUT = 10.0
_SUBJECT_TOKEN = re.compile(r"[^A-Za-z0-9_-]")
T = TypeVar("T")


class NatsSink(Sink):
    kind = "log"

    def __init__(self, url: str, spec: TableSpec, subscription: str) -> None:
        super().__init__(url, spec, subscription)
        options = parse_sink_url(url)
        if not isinstance(options, NatsOptions):
            raise SinkError(f"nats sink: {mask_url(url)} is not a nats:// URL")
        self.options = options
        self.subject = f"{options.subject}.{_SUBJECT_TOKEN.sub('_', spec.name) or '_'}"
        token = base64.urlsafe_b64encode(subscription.encode()).decode().rstrip("=")
        self.state_key = f"{options.stream}.{token}"
        self._safe = mask_url(url)
        self._loop: LoopThread | None = None
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._kv: KeyValue | None = None

    def _run(self, coro: Coroutine[Any, Any, T], doing: str, timeout: float = 120.0) -> T:
        if self._loop is None:
            self._loop = LoopThread("litecdc-nats-sink")
        try:
            return self._loop.run(coro, timeout)
        except SinkError:
            raise
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            detail = scrub_url_password(str(exc) or type(exc).__name__, self.url)
            # (sinks QA: the hint came after the server's own refusals too — overlapping
            # subjects, a message over the stream's size limit — which say what is wrong)
            hint = (
                "" if isinstance(exc, nats.js.errors.APIError)
                else ": check the server is up and has JetStream enabled"
            )  # fmt: skip
            raise SinkError(f"nats sink: {doing} ({self._safe}) failed: {detail}{hint}") from exc

    # -- set-up -----------------------------------------------------------------------

    def prepare(self) -> None:
        self._run(self._prepare(), "connecting", timeout=self.options.connect_timeout + 30)

    async def _prepare(self) -> None:
        if self._nc is None or self._nc.is_closed:
            self._nc = await nats.connect(
                servers=[self.options.server],
                connect_timeout=self.options.connect_timeout,
                allow_reconnect=False,  # a lost server fails the write; the pipeline retries
                # nats-py retries the first connect forever with 0; 1 = give up after 2 tries
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=_quiet,  # errors surface as SinkError, not tracebacks on stderr
                name=f"litecdc-{self.subscription}",
            )
            self._js = self._nc.jetstream(timeout=PUBLISH_TIMEOUT)
        js = self._js
        assert js is not None
        pattern = f"{self.options.subject}.>"
        try:
            info = await js.stream_info(self.options.stream)
            subjects = list(info.config.subjects or [])
            if not any(_covers(s, self.subject) for s in subjects):
                raise SinkError(
                    f"nats sink: stream {self.options.stream} takes subjects {subjects}, not "
                    f"{self.subject}: choose ?subject= to match or another ?stream="
                )
        except nats.js.errors.NotFoundError:
            await js.add_stream(StreamConfig(name=self.options.stream, subjects=[pattern]))
            log.info("nats sink: created stream %s for %s", self.options.stream, pattern)
        try:
            self._kv = await js.key_value(STATE_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            self._kv = await js.create_key_value(bucket=STATE_BUCKET, history=1)

    def _ready(self) -> tuple[JetStreamContext, KeyValue]:
        if self._js is None or self._kv is None or self._nc is None or self._nc.is_closed:
            self.prepare()
        assert self._js is not None and self._kv is not None
        return self._js, self._kv

    # -- writes -----------------------------------------------------------------------

    async def _publish_all(
        self, js: JetStreamContext, messages: Iterable[tuple[str, dict[str, Any]]]
    ) -> int:
        pending: list[asyncio.Future[Any]] = []
        count = 0

        async def drain() -> None:
            acks = await asyncio.gather(*pending)
            pending.clear()
            for ack in acks:
                if ack.stream != self.options.stream:
                    raise SinkError(
                        f"nats sink: {self.subject} was stored in stream {ack.stream}, not "
                        f"{self.options.stream}: streams overlap; fix their subjects"
                    )

        limit = self._nc.max_payload if self._nc is not None else 0
        for msg_id, doc in messages:
            payload = encode(doc)
            headers = {
                "Nats-Msg-Id": scoped_id(self.subscription, self.registration, msg_id),
                # (what nats-py adds for stream=, written here to be counted)
                "Nats-Expected-Stream": self.options.stream,
            }
            size = len(payload) + _header_bytes(headers)
            if limit and size > limit:
                await asyncio.gather(*pending, return_exceptions=True)  # none left behind
                raise self._too_large(doc, size, limit)
            # tasks start in order, so messages reach the stream in (cid, seq) order
            pending.append(
                asyncio.ensure_future(
                    js.publish(
                        self.subject,
                        payload,
                        stream=self.options.stream,
                        headers=headers,
                    )
                )
            )
            count += 1
            if len(pending) >= IN_FLIGHT:
                await drain()
        await drain()
        return count

    def _too_large(self, doc: dict[str, Any], size: int, limit: int) -> SinkError:
        """Sinks QA: a row over the server's max_payload failed every batch with "nats:
        maximum payload exceeded", naming neither the row nor the limit (and a hint to
        check the server was up)."""
        what = "the snapshot row" if doc.get("seq") is None else f"the {doc.get('op')} event"
        return SinkError(
            f"nats sink: {what} of {self.spec.name} with key {doc.get('key')} (cid "
            f"{doc.get('cid')}) is a {size:,}-byte message, over the NATS server's "
            f"max_payload of {limit:,} bytes ({self._safe}): the subscription stops here "
            "until the server takes larger messages (max_payload in nats-server's "
            "configuration, at most 64 MB; the stream's max_msg_size too)"
        )

    def write_snapshot(self, rows: pa.Table) -> None:
        if rows.num_rows == 0:
            return
        js, _ = self._ready()
        self._run(self._publish_all(js, snapshot_messages(rows, self.spec)), "publishing a chunk")

    def write_changes(self, events: pa.Table, batch: ChangeBatch) -> bool:
        js, kv = self._ready()
        applied = self.applied_cid()
        if batch.end_cid <= applied:
            return False
        if applied and events.num_rows:
            events = events.filter(pc.greater(events[CID_COLUMN], applied))
        doing = f"publishing changes up to cid {batch.end_cid}"
        self._run(self._publish_all(js, event_messages(events, self.spec)), doing)
        self._run(kv.put(self.state_key, str(batch.end_cid).encode()), "recording progress")
        return True

    def forget_progress(self) -> None:
        """The KV record is keyed by stream and subscription name, and outlives the
        subscription: a new one of the same name (on another source, whose cids start
        lower) would skip its changes up to the old cid."""
        _, kv = self._ready()

        async def forget() -> None:
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await kv.delete(self.state_key)

        self._run(forget(), "forgetting an earlier subscription's progress")

    def finish_snapshot(self, init_cid: int) -> int:
        """A log keeps no rows to sweep: consumers get a 'snapshot_done' message and drop
        the rows whose last message is older (``messages`` module)."""
        js, _ = self._ready()
        marker = [snapshot_done_message(self.spec, init_cid)]
        self._run(self._publish_all(js, marker), "publishing the end of the snapshot")
        return 0

    def applied_cid(self) -> int:
        _, kv = self._ready()

        async def get() -> int:
            try:
                entry = await kv.get(self.state_key)
            except nats.js.errors.KeyNotFoundError:
                return 0
            return int(entry.value or b"0")

        return self._run(get(), "reading progress")

    def close(self) -> None:
        if self._loop is None:
            return
        if self._nc is not None and not self._nc.is_closed:
            nc = self._nc
            try:
                self._loop.run(nc.close(), 10)
            except Exception as exc:  # closing a dead connection: nothing left to do
                log.debug("nats sink: close: %s", exc)
        self._nc = self._js = self._kv = None
        self._loop.stop()
        self._loop = None


def _header_bytes(headers: dict[str, str]) -> int:
    """Bytes of a message's headers as NATS sends them (HPUB): the server counts them
    into max_payload with the payload."""
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return len(f"NATS/1.0\r\n{lines}\r\n".encode())


async def _quiet(exc: Exception) -> None:
    log.debug("nats sink: %s", exc)


def _covers(pattern: str, subject: str) -> bool:
    """Whether a stream subject pattern (with * and >) matches a subject."""
    want = subject.split(".")
    for i, token in enumerate(pattern.split(".")):
        if token == ">":
            return len(want) > i
        if i >= len(want) or (token != "*" and token != want[i]):
            return False
    return len(pattern.split(".")) == len(want)
