"""`pipeline run`'s scheduler (PipelineServer._dispatch) on its own: which subscriptions'
steps it queues when sink servers fail or do not answer. No processes: the rules are
about the server's own bookkeeping (tests/pipeline/test_hung_sinks.py runs them against
frozen PostgreSQL/MariaDB servers)."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace
from typing import Any

import pytest

from litecdc.errors import SinkUnreachableError
from litecdc.pipeline.server import PipelineServer, SubscriptionState, _Running, _Scheduled

PG = "127.0.0.1:5432"
MY = "127.0.0.1:3306"


def scheduler(parallel: int, subs: dict[str, str | None]) -> PipelineServer:
    """A server (no store, no Spark: _dispatch touches neither) with ``subs``: name → the
    host:port of its sink (None: files)."""
    server = PipelineServer(None, None, parallel=parallel)  # type: ignore[arg-type]
    for name, where in subs.items():
        sub: Any = None  # _dispatch never reads the subscription itself
        server._scheduled[name] = _Scheduled(sub, server=where)
        server.states[name] = SubscriptionState(name)
    return server


def fail(server: PipelineServer, name: str, *, unreachable: bool) -> None:
    state = server.states[name]
    state.last_error = "cannot connect" if unreachable else "a value the column cannot take"
    state.unreachable = unreachable


def queued(server: PipelineServer) -> list[str]:
    names = []
    while not server._queue.empty():
        item = server._queue.get_nowait()
        assert item is not None
        names.append(next(n for n, s in server._scheduled.items() if s is item))
    return names


def test_healthy_subscriptions_are_all_queued() -> None:
    server = scheduler(2, {"a": PG, "b": PG, "c": None})
    server._dispatch(give_up=False)
    assert queued(server) == ["a", "b", "c"]  # two threads take them in turn


def test_failing_subscriptions_retry_one_at_a_time_per_server() -> None:
    server = scheduler(4, {"a": PG, "b": PG, "c": MY, "d": PG})
    fail(server, "a", unreachable=False)
    fail(server, "b", unreachable=False)
    server._dispatch(give_up=False)
    assert queued(server) == ["a", "c", "d"]  # b after a's retry; d is healthy
    server._dispatch(give_up=False)
    assert queued(server) == []  # a still in flight


def test_a_server_found_not_answering_takes_one_step_at_a_time_even_a_healthy_ones() -> None:
    """QA: a subscription of a server already known not to answer started a fresh step
    there, which hung as long as the first had (40 s each, one after the other)."""
    server = scheduler(4, {"a": PG, "b": PG, "c": None})
    fail(server, "a", unreachable=True)
    server._dispatch(give_up=False)
    assert queued(server) == ["a", "c"]
    server._scheduled["a"].in_flight = False  # its retry failed: due after its back-off
    server._scheduled["a"].due_at = time.monotonic() + 60
    server._dispatch(give_up=False)
    assert queued(server) == ["b"]


def test_servers_not_answering_leave_a_thread_to_the_others() -> None:
    """QA: with as many frozen servers as threads, their retries held every thread."""
    server = scheduler(2, {"pg": PG, "my": MY, "lake": None})
    fail(server, "pg", unreachable=True)
    fail(server, "my", unreachable=True)
    server._dispatch(give_up=False)
    assert queued(server) == ["pg", "lake"]  # my waits: one thread stays for the lake


def test_a_server_not_answering_is_tried_again_after_its_own_back_off() -> None:
    """Its subscriptions take turns at it: without a back-off of the server's own it was
    asked back to back, a thread held by it all the time."""
    server = scheduler(4, {"a": PG, "b": PG})
    fail(server, "a", unreachable=True)
    fail(server, "b", unreachable=True)
    server._server_heard(PG, server.states["a"], was_unreachable=True)
    next_due = server._dispatch(give_up=False)
    assert queued(server) == []
    assert next_due == pytest.approx(server._server_retry_at[PG])
    server._server_retry_at[PG] = time.monotonic() - 1
    server._dispatch(give_up=False)
    assert queued(server) == ["a"]
    # one that found it not answering gets through: the server's back-off is over
    server.states["a"].last_error = None
    server._server_heard(PG, server.states["a"], was_unreachable=True)
    assert PG not in server._server_retry_at


def test_a_step_that_wrote_nothing_does_not_end_the_servers_back_off() -> None:
    server = scheduler(4, {"a": PG, "idle": PG})
    fail(server, "a", unreachable=True)
    server._server_heard(PG, server.states["a"], was_unreachable=True)
    server._server_heard(PG, server.states["idle"], was_unreachable=False)
    assert PG in server._server_retry_at


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("postgresql://u:p@127.0.0.1:5432/db?table=x", "127.0.0.1:5432"),
        ("mysql://root@db1:3306/app", "db1:3306"),
        ("nats://127.0.0.1:4222?stream=S", "127.0.0.1:4222"),
        ("amqp://g:g@mq:5672/?queue=q", "mq:5672"),
        ("https://hooks.example/in", "hooks.example:443"),
        ("delta:/lake/orders", None),  # files: no server to wait on
        ("parquet:/lake/log", None),
        ("not a url", None),
    ],
)
def test_the_sink_server_a_url_writes_to(url: str, server: str | None) -> None:
    from litecdc.pipeline.sinks.registry import sink_server

    assert sink_server(url) == server


class FakeSink:
    """What the stall watch uses of a sink: its probe (answering or not) and abort."""

    probes = True
    label = "postgresql sink"
    probe_timeout = 5.0

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.aborted = 0

    def probe(self) -> None:
        if not self.answers:
            raise SinkUnreachableError("postgresql sink: the server does not answer")

    def abort(self) -> None:
        self.aborted += 1


def running(server: PipelineServer, name: str, sink: FakeSink, *, in_step: bool) -> _Running:
    made = _Running(SimpleNamespace(name=name), None, None, sink, server.states[name])  # type: ignore[arg-type]
    server._running[name] = made
    if in_step:
        server._scheduled[name].step_started = time.monotonic() - 40
    return made


def test_a_server_found_not_answering_breaks_every_step_waiting_on_it() -> None:
    """QA: steps already waiting on a frozen server each held their thread until their own
    probe; with more of them than threads, every other sink waited as long."""
    server = scheduler(4, {"a": PG, "b": PG, "c": PG, "d": MY})
    probed = running(server, "a", FakeSink(answers=False), in_step=True)
    waiting = running(server, "b", FakeSink(answers=False), in_step=True)
    between_steps = running(server, "c", FakeSink(answers=False), in_step=False)
    elsewhere = running(server, "d", FakeSink(answers=False), in_step=True)
    server._probe(probed, time.monotonic() - 40, PG)
    assert [r.sink.aborted for r in (probed, waiting, between_steps, elsewhere)] == [1, 1, 0, 0]  # type: ignore[union-attr]
    assert probed.stalled is not None and "(asked for" not in probed.stalled
    assert waiting.stalled is not None and "does not answer (asked for a)" in waiting.stalled
    assert between_steps.stalled is None and elsewhere.stalled is None


def test_a_server_that_answers_breaks_nothing() -> None:
    server = scheduler(4, {"a": PG, "b": PG})
    probed = running(server, "a", FakeSink(answers=True), in_step=True)
    other = running(server, "b", FakeSink(answers=True), in_step=True)
    server._probe(probed, time.monotonic() - 40, PG)
    assert (probed.sink.aborted, other.sink.aborted) == (0, 0)  # type: ignore[union-attr]
    assert probed.stalled is None and other.stalled is None


def test_a_subscription_removed_while_its_step_ran_stops_without_a_retry(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Pipeline QA: unsubscribed mid-snapshot, its step met "unknown subscription" and the
    log said it would retry (it did not: the subscription is gone)."""
    from litecdc.errors import UnknownSubscriptionError

    server = scheduler(2, {"big": PG})

    def vanished(sub: Any, state: Any) -> Any:
        raise UnknownSubscriptionError("big")

    monkeypatch.setattr(server, "_start", vanished)
    with socket.socket() as unused:  # (a source nobody listens on)
        unused.bind(("127.0.0.1", 0))
        source = f"http://127.0.0.1:{unused.getsockname()[1]}"
    sub: Any = SimpleNamespace(name="big", cancel=False, sources=[source], options={})
    with caplog.at_level("INFO", logger="litecdc.pipeline"):
        assert server._step_one(sub, server.states["big"], None) is None  # retired
    state = server.states["big"]
    assert state.last_error is None and state.failures == 0
    assert "removed while a step ran" in caplog.text and "retrying" not in caplog.text
    # the hold its step may have placed is released — or said to be left, here
    assert "its hold on the source may be left there" in caplog.text


def test_schema_reads_ask_a_node_as_far_as_the_last_description_read() -> None:
    """Review: a table's description read from a follower behind the one the mirror's
    came from lacks a column the mirror already took — as if dropped (the run then
    failed, saying to rebuild the mirror). Each schema read asks for at least the head
    cid of the last one (min_cid): a node behind it waits, or the next is asked. A fake
    client records what is asked (the source API's min_cid: tests/unit/test_http_app.py,
    a real lagging follower: tests/system/test_cluster_source.py)."""
    from litecdc.pipeline.source_client import TableInfo
    from litecdc.pipeline.tables import Column, TableSpec

    spec = TableSpec("t", (Column("id", "INTEGER", "int64", not_null=True),), ("id",))
    asked: list[int | None] = []
    heads = iter([40, 35, 52])  # (the second answer from a node behind the first)

    class Client:
        def table_info(self, table: str, *, min_cid: int | None = None) -> TableInfo:
            asked.append(min_cid)
            return TableInfo(spec, None, next(heads))

    server = PipelineServer(None, None)  # type: ignore[arg-type]
    sub: Any = SimpleNamespace(name="s", table_name="t")
    running = _Running(sub, Client(), spec, None, SubscriptionState("s"))  # type: ignore[arg-type]
    for _ in range(3):
        assert server._check_schema(running) is False
    assert asked == [None, 40, 40]  # never less than the furthest head seen
    assert running.spec_cid == 52
