"""Message sinks: RabbitMQ's and NATS's write_changes against their clients publishing directly.

Each sink publishes one message per change event and counts a batch applied once the
broker confirmed every message. What the sink itself costs shows against a baseline
measured in the same run: the same broker client publishing the same encoded messages
(same ids, bodies and properties) straight away, with the same number of publishes in
flight (``IN_FLIGHT`` of each sink module), set up before the clock starts.

Cases, each timed from the start of the call to the last confirm (connections are made
before the clock starts; the sinks' ``prepare`` too):

* **RabbitMQ, pika with confirms in flight** (baseline): pika's ``AsyncioConnection`` in
  confirm mode, ``basic_publish(mandatory=True)`` of every message, waiting for confirms
  only when ``IN_FLIGHT`` are outstanding and at the end;
* **RabbitMQ, pika, a confirm per message**: ``BlockingConnection`` with
  ``confirm_delivery()``, each publish waiting for its confirm — how the sink published
  before it kept messages in flight (on ``--blocking-events`` events: it is slow);
* **RabbitMQ sink** ``write_changes`` (``?queue=``: durable queue, default exchange);
* **NATS, nats-py with acks in flight** (baseline): ``js.publish`` with ``Nats-Msg-Id``,
  ``IN_FLIGHT`` tasks gathered at a time;
* **NATS sink** ``write_changes`` (its KV progress record included);
* **messages only**: the sink's own work without a broker — events (Arrow) to JSON
  bodies and scoped ids, as both sinks do per message.

The events are ``--events`` changes in 1000-event transactions (500 inserts, 350 updates,
150 deletes) of ``items(id INTEGER PRIMARY KEY, name TEXT, price REAL, payload BLOB,
qty INTEGER)`` with 10-40 characters of text and a 32-160 byte blob per row (bench/common),
about 290 bytes of JSON per message. After every run the queue or stream must hold exactly
the events sent (checked, then purged); each run uses ids of its own, so JetStream's
duplicate window drops nothing. Every case runs once to warm up, then ``--repeats``
times, all cases interleaved in a rotating order; the median run is reported.

RabbitMQ and NATS are throwaway servers from Debian's binaries on free ports of 127.0.0.1
(``litecdc.localservers``), stopped at the end, also on error.

    .venv/bin/python bench/bench_message_sinks.py
    .venv/bin/python bench/bench_message_sinks.py --events 100000 --repeats 5 --json
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import pika
import pyarrow as pa
from common import (
    JSON_HELP,
    TABLE,
    load_note,
    make_rows,
    new_parser,
    platform_json,
    platform_line,
    process_cpu_seconds,
    process_table,
    require_at_least_one,
)
from nats.js.api import StreamConfig
from pika.adapters.asyncio_connection import AsyncioConnection

from litecdc.localservers import NATSServer, RabbitMQServer
from litecdc.pipeline.sinks import nats as nats_sink
from litecdc.pipeline.sinks import rabbitmq as rabbitmq_sink
from litecdc.pipeline.sinks.base import ChangeBatch
from litecdc.pipeline.sinks.messages import encode, event_messages
from litecdc.pipeline.sinks.nats import NatsSink
from litecdc.pipeline.sinks.rabbitmq import RabbitMQSink
from litecdc.pipeline.tables import CID_COLUMN, OP_COLUMN, SEQ_COLUMN, Column, TableSpec

SPEC = TableSpec(
    TABLE,
    (
        Column("id", "INTEGER", "int64", not_null=True),
        Column("name", "TEXT", "string", not_null=True),
        Column("price", "REAL", "float64", not_null=True),
        Column("payload", "BLOB", "binary"),
        Column("qty", "INTEGER", "int64", not_null=True),
    ),
    ("id",),
)
EVENTS_PER_TXN = 1000  # 500 inserts, 350 updates, 150 deletes
QUEUE = "bench"
STREAM, SUBJECT = "BENCH", "bench"
WARMUP_RUNS = 1
BROKERS = {"beam.smp": "RabbitMQ", "nats-server": "NATS"}  # process name -> broker

Message = tuple[str, bytes]  # scoped id, JSON body


# -- the events --------------------------------------------------------------------------------
def make_events(count: int) -> pa.Table:
    """``count`` change events in 1000-event transactions, each event on a key of its own."""
    rows = make_rows(count, seed=7)
    seeded = -(-count // EVENTS_PER_TXN) * 500  # keys the updates and deletes touch
    picked: list[dict[str, Any]] = []
    for i, (name, price, payload, qty) in enumerate(rows):
        txn, seq = divmod(i, EVENTS_PER_TXN)
        if seq < 500:
            op, key = "upsert", seeded + 500 * txn + seq + 1
        elif seq < 850:
            op, key = "upsert", 350 * txn + seq - 500 + 1
        else:
            op, key = "delete", seeded - 150 * txn - (seq - 850)
        picked.append(
            {CID_COLUMN: txn + 1, SEQ_COLUMN: seq, OP_COLUMN: op, "id": key, "name": name}
            | {"price": price, "payload": payload, "qty": qty}
        )
    return pa.Table.from_pylist(picked, schema=SPEC.change_schema())


def encoded(events: pa.Table, scope: Callable[[str], str]) -> list[Message]:
    return [(scope(msg_id), encode(doc)) for msg_id, doc in event_messages(events, SPEC)]


# -- timing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """One timed run: wall seconds and this process's CPU seconds over the same stretch."""

    seconds: float
    cpu: float


class Stopwatch:
    """Starts at construction; ``stop()`` gives the Span."""

    def __init__(self) -> None:
        self.cpu = process_cpu_seconds(os.getpid()) or 0.0
        self.started = time.perf_counter()

    def stop(self) -> Span:
        seconds = time.perf_counter() - self.started
        return Span(seconds, (process_cpu_seconds(os.getpid()) or 0.0) - self.cpu)


@dataclass
class Case:
    """``prepare(i)`` sets up run ``i`` (connections, messages: not timed) and returns the
    run, which times itself; ``check`` verifies what arrived, and clears it, after every
    run; ``broker``: whose CPU to count (a key of BROKERS' values, or '' for none)."""

    name: str
    events: int
    broker: str
    prepare: Callable[[int], Callable[[], Span]]
    check: Callable[[], None]
    runs: list[Span] = field(default_factory=list)
    broker_cpu_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:  # events/s of the median run
        return self.events / statistics.median(r.seconds for r in self.runs)

    @property
    def spread(self) -> tuple[float, float]:
        times = [r.seconds for r in self.runs]
        return self.events / max(times), self.events / min(times)

    @property
    def client_us(self) -> float:  # this process's CPU per event, median
        return statistics.median(r.cpu for r in self.runs) / self.events * 1e6

    @property
    def broker_cores(self) -> float:
        return statistics.median(
            cpu / r.seconds for cpu, r in zip(self.broker_cpu_s, self.runs, strict=True)
        )


def broker_cpu(broker: str) -> float:
    """CPU seconds so far of the broker's processes (Linux /proc; 0 elsewhere)."""
    return sum(cpu for _, name, cpu in process_table().values() if BROKERS.get(name) == broker)


def measure(cases: Sequence[Case], repeats: int) -> None:
    """``WARMUP_RUNS`` (not counted) and then ``repeats`` runs of every case, interleaved
    in a rotating order, so a change in the machine's load falls on every case alike."""
    for i in range(WARMUP_RUNS + repeats):
        shift = i % len(cases)
        for case in [*cases[shift:], *cases[:shift]]:
            run = case.prepare(i)
            before = broker_cpu(case.broker) if case.broker else 0.0
            span = run()
            used = (broker_cpu(case.broker) if case.broker else 0.0) - before
            case.check()
            if i >= WARMUP_RUNS:
                case.runs.append(span)
                case.broker_cpu_s.append(used)


# -- RabbitMQ ----------------------------------------------------------------------------------
async def pika_in_flight(url: str, messages: Sequence[Message], in_flight: int) -> Span:
    """pika's asyncio connection publishing ``messages`` to QUEUE in confirm mode, at most
    ``in_flight`` awaiting their confirm, timed to the last confirm (connecting before)."""
    loop = asyncio.get_running_loop()

    def answer(start: Callable[[Callable[..., None]], object]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()
        start(lambda *args: None if future.done() else future.set_result(args[0]))
        return future

    conn = await answer(
        lambda done: AsyncioConnection.create_connection(
            [pika.URLParameters(url)], on_done=done, custom_ioloop=loop
        )
    )
    if isinstance(conn, BaseException):
        raise conn
    channel = await answer(lambda done: conn.channel(on_open_callback=done))
    unconfirmed: set[int] = set()
    lowest = [1]  # every delivery tag below is confirmed
    failed: list[str] = []
    waiters: list[asyncio.Future[None]] = []

    def on_confirm(frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            failed.append(f"nack of delivery tag {method.delivery_tag}")
        if method.multiple:  # every tag up to this one
            for tag in range(lowest[0], method.delivery_tag + 1):
                unconfirmed.discard(tag)
            lowest[0] = max(lowest[0], method.delivery_tag + 1)
        else:
            unconfirmed.discard(method.delivery_tag)
        while waiters:
            waiter = waiters.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def settle(at_most: int) -> None:
        while len(unconfirmed) > at_most and not failed:
            waiters.append(loop.create_future())
            await waiters[-1]

    await answer(lambda done: channel.confirm_delivery(on_confirm, done))
    channel.add_on_return_callback(lambda *_: failed.append("a message returned"))
    await answer(lambda done: channel.queue_declare(QUEUE, durable=True, callback=done))
    watch = Stopwatch()
    for tag, (msg_id, body) in enumerate(messages, 1):  # the broker numbers them so
        properties = pika.BasicProperties(
            message_id=msg_id, delivery_mode=2, content_type="application/json"
        )
        channel.basic_publish("", QUEUE, body, properties, mandatory=True)
        unconfirmed.add(tag)
        if len(unconfirmed) >= in_flight:
            await settle(in_flight // 2)
    await settle(0)
    span = watch.stop()
    closed = answer(conn.add_on_close_callback)
    conn.close()
    await closed
    if failed:
        raise RuntimeError(f"pika baseline: the broker did not take every message: {failed[0]}")
    return span


def pika_blocking(url: str, messages: Sequence[Message]) -> Callable[[], Span]:
    """Each publish waits for its own confirm (``BlockingConnection.confirm_delivery``)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare(QUEUE, durable=True)

    def run() -> Span:
        try:
            watch = Stopwatch()
            for msg_id, body in messages:
                properties = pika.BasicProperties(
                    message_id=msg_id, delivery_mode=2, content_type="application/json"
                )
                channel.basic_publish("", QUEUE, body, properties, mandatory=True)
            return watch.stop()
        finally:
            conn.close()

    return run


def queue_check(url: str, events: int) -> Callable[[], None]:
    def check() -> None:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = conn.channel()
            held = channel.queue_declare(QUEUE, durable=True, passive=True).method.message_count
            if held != events:
                raise RuntimeError(f"queue {QUEUE} holds {held} messages, not {events}")
            channel.queue_purge(QUEUE)
        finally:
            conn.close()

    return check


def rabbitmq_cases(url: str, events: pa.Table, blocking: int) -> list[Case]:
    count, end_cid = events.num_rows, int(events[CID_COLUMN][-1].as_py())
    in_flight = rabbitmq_sink.IN_FLIGHT

    def baseline(i: int) -> Callable[[], Span]:
        messages = encoded(events, lambda m: f"bench:base{i}:{m}")
        return lambda: asyncio.run(pika_in_flight(url, messages, in_flight))

    def sink(i: int) -> Callable[[], Span]:
        s = RabbitMQSink(f"{url}?queue={QUEUE}", SPEC, "bench")
        s.registration = f"sink{i}"
        s.prepare()

        def run() -> Span:
            try:
                watch = Stopwatch()
                s.write_changes(events, ChangeBatch("bench", 0, end_cid))
                return watch.stop()
            finally:
                s.close()

        return run

    few = events.slice(0, min(blocking, count))

    def one_by_one(i: int) -> Callable[[], Span]:
        return pika_blocking(url, encoded(few, lambda m: f"bench:block{i}:{m}"))

    check = queue_check(url, count)
    return [
        Case(
            f"RabbitMQ: pika, {in_flight} confirms in flight (baseline)",
            *(count, "RabbitMQ", baseline, check),
        ),
        Case("RabbitMQ sink write_changes", count, "RabbitMQ", sink, check),
        Case(
            "RabbitMQ: pika, a confirm per message (the sink before)",
            *(few.num_rows, "RabbitMQ", one_by_one, queue_check(url, few.num_rows)),
        ),
    ]


# -- NATS --------------------------------------------------------------------------------------
async def nats_in_flight(url: str, messages: Sequence[Message], in_flight: int) -> Span:
    """nats-py publishing ``messages`` to the stream, ``in_flight`` acks gathered at a time,
    timed to the last ack (connecting before)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        subject = f"{SUBJECT}.{TABLE}"
        watch = Stopwatch()
        pending: list[asyncio.Future[Any]] = []
        for msg_id, body in messages:
            pending.append(
                asyncio.ensure_future(
                    js.publish(subject, body, stream=STREAM, headers={"Nats-Msg-Id": msg_id})
                )
            )
            if len(pending) >= in_flight:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return watch.stop()
    finally:
        await nc.close()


async def nats_stream_count(url: str, purge: bool) -> int:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        held = int((await js.stream_info(STREAM)).state.messages)
        if purge:
            await js.purge_stream(STREAM)
        return held
    finally:
        await nc.close()


def ensure_stream(url: str) -> None:
    """The stream both NATS cases publish to (as the sink would create it)."""

    async def create() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(StreamConfig(name=STREAM, subjects=[f"{SUBJECT}.>"]))
        finally:
            await nc.close()

    asyncio.run(create())


def nats_cases(url: str, events: pa.Table) -> list[Case]:
    count, end_cid = events.num_rows, int(events[CID_COLUMN][-1].as_py())
    in_flight = nats_sink.IN_FLIGHT
    sink_url = f"{url}?stream={STREAM}&subject={SUBJECT}"

    def sink(i: int) -> Callable[[], Span]:
        # a subscription name per run: its progress record in the KV bucket starts at 0
        s = NatsSink(sink_url, SPEC, f"bench{i}")
        s.prepare()

        def run() -> Span:
            try:
                watch = Stopwatch()
                s.write_changes(events, ChangeBatch(f"bench{i}", 0, end_cid))
                return watch.stop()
            finally:
                s.close()

        return run

    def baseline(i: int) -> Callable[[], Span]:
        messages = encoded(events, lambda m: f"bench:base{i}:{m}")
        return lambda: asyncio.run(nats_in_flight(url, messages, in_flight))

    def check() -> None:
        held = asyncio.run(nats_stream_count(url, purge=True))
        if held != count:
            raise RuntimeError(f"stream {STREAM} holds {held} messages, not {count}")

    return [
        Case(
            f"NATS: nats-py, {in_flight} acks in flight (baseline)", count, "NATS", baseline, check
        ),
        Case("NATS sink write_changes", count, "NATS", sink, check),
    ]


# -- the sinks' own work -----------------------------------------------------------------------
def messages_only(events: pa.Table) -> Case:
    """Events to (scoped id, JSON body) as the sinks make them, no broker."""
    sink = RabbitMQSink("amqp://guest:guest@127.0.0.1:1/?queue=unused", SPEC, "bench")

    def prepare(_: int) -> Callable[[], Span]:
        def run() -> Span:
            watch = Stopwatch()
            encoded(events, sink.message_id)
            return watch.stop()

        return run

    name = "messages only: Arrow -> JSON bodies and ids, no broker"
    return Case(name, events.num_rows, "", prepare, lambda: None)


# -- output ------------------------------------------------------------------------------------
def print_cases(cases: Iterable[Case], baseline: Case | None) -> None:
    print(
        f"{'case':<58} {'events':>8} {'events/s':>10} {'min-max':>17} "
        f"{'CPU us/event':>12} {'broker cores':>12} {'vs baseline':>11}"
    )
    for case in cases:
        low, high = case.spread
        ratio = f"{case.rate / baseline.rate:.2f}" if baseline is not None else ""
        print(
            f"{case.name:<58} {case.events:>8,} {case.rate:>10,.0f} "
            f"{f'{low:,.0f}-{high:,.0f}':>17} {case.client_us:>12.1f} "
            f"{case.broker_cores:>12.2f} {ratio:>11}"
        )


def case_json(case: Case, baseline: Case | None) -> dict[str, Any]:
    low, high = case.spread
    return {
        "name": case.name,
        "events": case.events,
        "events_per_s": round(case.rate),
        "min_max": [round(low), round(high)],
        "client_cpu_us_per_event": round(case.client_us, 2),
        "broker_cores": round(case.broker_cores, 2),
        **({"vs_baseline": round(case.rate / baseline.rate, 3)} if baseline else {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = new_parser(__doc__)
    parser.add_argument(
        "--events", type=int, default=20_000, help="events per write_changes (default 20000)"
    )
    parser.add_argument(
        "--blocking-events",
        type=int,
        default=5_000,
        help="events of the confirm-per-message case, which is slow (default 5000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed runs per case, after one warm-up (default 5)"
    )
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    args = parser.parse_args(argv)
    require_at_least_one(parser, args, ("events", "blocking_events", "repeats"))

    versions = {name: importlib.metadata.version(name) for name in ("pika", "nats-py")}
    print(platform_line("litecdc message sinks benchmark", versions))
    print(load_note())
    events = make_events(args.events)
    print(
        f"{args.events:,} change events in {EVENTS_PER_TXN}-event transactions; median of "
        f"{args.repeats} runs after {WARMUP_RUNS} warm-up run; 'vs baseline': events/s over "
        "the same broker's baseline"
    )
    doc: dict[str, Any] = {**platform_json(versions), "events": args.events}
    with RabbitMQServer() as mq, NATSServer() as ns:
        print(f"RabbitMQ at {mq.url} (started in {mq.startup_seconds:.1f} s), NATS at {ns.url}\n")
        ensure_stream(ns.url)
        rabbit = rabbitmq_cases(mq.url, events, args.blocking_events)
        nats_ = nats_cases(ns.url, events)
        own = messages_only(events)
        measure([*rabbit, *nats_, own], args.repeats)
    print_cases(rabbit, rabbit[0])
    print_cases(nats_, nats_[0])
    print_cases([own], None)
    sink_rate, before_rate = rabbit[1].rate, rabbit[2].rate
    print(
        f"\nRabbitMQ sink: {sink_rate:,.0f} events/s = {sink_rate / rabbit[0].rate:.2f}x its "
        f"baseline, {sink_rate / before_rate:.1f}x publishing with a confirm per message; "
        f"NATS sink: {nats_[1].rate:,.0f} events/s = {nats_[1].rate / nats_[0].rate:.2f}x its "
        "baseline"
    )
    print(
        f"the sinks' own work per event: {1e6 / own.rate:.1f} us of the RabbitMQ sink's "
        f"{1e6 / sink_rate:.1f} us and the NATS sink's {1e6 / nats_[1].rate:.1f} us"
    )
    if args.json:
        doc["rabbitmq"] = [case_json(c, rabbit[0]) for c in rabbit]
        doc["nats"] = [case_json(c, nats_[0]) for c in nats_]
        doc["messages_only"] = case_json(own, None)
        print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
