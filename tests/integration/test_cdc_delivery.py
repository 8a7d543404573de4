"""The CDC push service against real HTTP(S) webhook receivers on 127.0.0.1.

A standalone node (store + CDC service, in process) writes rows; a real receiver
(tests/fakes) records what arrives and can fail, delay or drop requests.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest
from fakes import WebhookReceiver, make_certs, reserve_port

from litecdc import NodeConfig, Statement, Store
from litecdc.cdc import CDCConfig, TransmitError, parse_cdc_config
from litecdc.cdc.sinks import WebhookSink
from litecdc.db.schema import CREATE_CDC_STATE, high_watermark_sql
from litecdc.node import Node

S = Statement
FAST = {  # small waits so the suite stays quick
    "max_batch_delay": "20ms",
    "high_watermark_interval": "50ms",
    "transmit_timeout": "2s",
    "transmit_min_backoff": "10ms",
    "transmit_max_backoff": "50ms",
}
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def make_node(tmp_path: Path, endpoint: str, *, node_id: str = "node-1", **settings: Any) -> Node:
    doc = {"endpoint": endpoint, **FAST, **settings}
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"cdc-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(doc))
    config = NodeConfig(
        data_dir=tmp_path / "node", node_id=node_id, cdc=parse_cdc_config(str(path))
    )
    node = Node(config)
    node.start()
    return node


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    nodes: list[Node] = []

    def start(endpoint: str, **settings: Any) -> Node:
        node = make_node(tmp_path, endpoint, **settings)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.close()


def delivered(receiver: WebhookReceiver) -> list[tuple[int, int]]:
    """(cid, position in its transaction) of every event received, duplicates included."""
    out = []
    for batch in receiver.batches:
        for element in batch["payload"]:
            out.extend((element["index"], i) for i in range(len(element["events"])))
    return out


def events(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    return [e for b in receiver.batches for p in b["payload"] for e in p["events"]]


def wait_delivered(
    receiver: WebhookReceiver, expected: set[tuple[int, int]], timeout: float = 30
) -> None:
    receiver.wait_for(lambda _: expected <= set(delivered(receiver)), timeout=timeout)


def write_rows(node: Node, count: int, table: str = "t") -> list[int]:
    cids = []
    for i in range(count):
        out = node.store.execute([S(f"INSERT INTO {table}(v) VALUES(?)", (i,))])
        assert out.cid is not None
        cids.append(out.cid)
    return cids


def expected_for(cids: list[int]) -> set[tuple[int, int]]:
    return {(cid, 0) for cid in cids}


def test_single_event_in_rqlite_envelope(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    node = started(receiver.url, service_id="svc-1")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    [cid] = write_rows(node, 1)
    wait_delivered(receiver, {(cid, 0)})
    body = receiver.batches[0]
    timestamp = node.store.journal_page(cid - 1, 1).entries[0].timestamp_ms
    assert body == {
        "service_id": "svc-1",
        "node_id": "node-1",
        "payload": [
            {
                "index": cid,
                "commit_timestamp": timestamp,
                "events": [
                    {"op": "INSERT", "table": "t", "new_row_id": 1, "after": {"id": 1, "v": 0}}
                ],
            }
        ],
    }
    request = receiver.requests[0]
    assert request.method == "POST" and request.headers["content-type"] == "application/json"


def test_500_events_all_delivered_in_commit_order(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    node = started(receiver.url, max_batch_size=50)
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 500)
    wait_delivered(receiver, expected_for(cids))
    got = [cid for cid, _ in delivered(receiver)]
    assert got == sorted(got) and set(got) == set(cids)
    assert all(len(b["payload"]) <= 50 for b in receiver.batches)


def test_batches_hold_at_most_max_batch_size_transactions(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    # a backlog written before the service starts is sent in full batches
    node = make_node(tmp_path, receiver.url, max_batch_size=3)
    node.close()
    from litecdc import Store

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    big = store.execute([S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(7)], transaction=True)
    cids = [store.execute([S("INSERT INTO t(v) VALUES(1)")]).cid for _ in range(9)]
    store.close()
    node = make_node(tmp_path, receiver.url, max_batch_size=3)
    try:
        expected = {(big.cid, i) for i in range(7)} | expected_for(cids)  # type: ignore[arg-type]
        wait_delivered(receiver, expected)  # type: ignore[arg-type]
        sizes = [len(b["payload"]) for b in receiver.batches]
        assert max(sizes) == 3 and sum(sizes) == 10
        # a transaction is never split across batches
        first = receiver.batches[0]["payload"][0]
        assert first["index"] == big.cid and len(first["events"]) == 7
    finally:
        node.close()


def test_batch_waits_up_to_max_batch_delay_to_fill(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    node = started(receiver.url, max_batch_size=100, max_batch_delay="2s")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 3)
    wait_delivered(receiver, expected_for(cids))
    # the three commits arrived within the delay, so they travel together
    assert [len(b["payload"]) for b in receiver.batches] == [3]


def test_every_op_and_value_type(started: Callable[..., Node], receiver: WebhookReceiver) -> None:
    node = started(receiver.url)
    node.store.execute([S("CREATE TABLE v(id INTEGER PRIMARY KEY, i, f, s, b, n)")])
    row = (1, -(2**63), 0.1, "é'\"", b"\x00\xffbin", None)
    node.store.execute([S("INSERT INTO v VALUES(?, ?, ?, ?, ?, ?)", row)])
    node.store.execute([S("UPDATE v SET s = 'new', f = 2.5 WHERE id = 1")])
    last = node.store.execute([S("DELETE FROM v WHERE id = 1")])
    receiver.wait_for(
        lambda _: any(p["index"] == last.cid for b in receiver.batches for p in b["payload"]),
        timeout=30,
    )
    blob = base64.b64encode(b"\x00\xffbin").decode()
    image = {"id": 1, "i": -(2**63), "f": 0.1, "s": "é'\"", "b": blob, "n": None}
    updated = {**image, "s": "new", "f": 2.5}
    assert events(receiver) == [
        {"op": "INSERT", "table": "v", "new_row_id": 1, "after": image},
        {
            "op": "UPDATE",
            "table": "v",
            "new_row_id": 1,
            "old_row_id": 1,
            "before": image,
            "after": updated,
        },
        {"op": "DELETE", "table": "v", "old_row_id": 1, "before": updated},
    ]


def test_table_filter_sends_matching_tables_only(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    node = started(receiver.url, table_filter="keep.*")
    node.store.execute([S("CREATE TABLE keep_me(v)"), S("CREATE TABLE other(v)")])
    node.store.execute([S("INSERT INTO other VALUES(1)")])
    last = node.store.execute(
        [S("INSERT INTO keep_me VALUES(2)"), S("INSERT INTO other VALUES(3)")]
    )
    receiver.wait_for(lambda _: len(events(receiver)) >= 1, timeout=30)
    assert node.cdc is not None
    deadline = time.monotonic() + 30
    while node.cdc.status()["hwm"] != last.cid and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(e["table"], e["after"]) for e in events(receiver)] == [("keep_me", {"v": 2})]
    status = node.cdc.status()
    assert status["hwm"] == last.cid and status["skipped_events"] == 2


def test_row_ids_only(started: Callable[..., Node], receiver: WebhookReceiver) -> None:
    node = started(receiver.url, row_ids_only=True)
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    node.store.execute([S("INSERT INTO t VALUES(5, 'x')")])
    last = node.store.execute([S("UPDATE t SET id = 6")])
    receiver.wait_for(
        lambda _: any(p["index"] == last.cid for b in receiver.batches for p in b["payload"]),
        timeout=30,
    )
    assert events(receiver) == [
        {"op": "INSERT", "table": "t", "new_row_id": 5},
        {"op": "UPDATE", "table": "t", "new_row_id": 6, "old_row_id": 5},
    ]


def test_debezium_envelope(started: Callable[..., Node], receiver: WebhookReceiver) -> None:
    node = started(receiver.url, format="debezium", service_id="shop")
    node.store.execute([S("CREATE TABLE a(id INTEGER PRIMARY KEY, v)"), S("CREATE TABLE b(k)")])
    out = node.store.execute(
        [
            S("INSERT INTO a VALUES(1, 'x')"),
            S("INSERT INTO b VALUES(2)"),
            S("UPDATE a SET v = 'y'"),
            S("DELETE FROM b"),
        ]
    )
    receiver.wait_for(lambda batches: sum(len(b) for b in batches) >= 4, timeout=30)
    got = [e for batch in receiver.batches for e in batch]
    ts = node.store.journal_page(out.cid - 1, 1).entries[0].timestamp_ms  # type: ignore[operator]
    assert [(e["op"], e["before"], e["after"]) for e in got] == [
        ("c", None, {"id": 1, "v": "x"}),
        ("c", None, {"k": 2}),
        ("u", {"id": 1, "v": "x"}, {"id": 1, "v": "y"}),
        ("d", {"k": 2}, None),
    ]
    assert got[0]["source"] == {
        "connector": "litecdc",
        "name": "shop",
        "db": "main",
        "table": "a",
        "cid": out.cid,
        "ts_ms": ts,
    }
    assert [
        (e["transaction"]["total_order"], e["transaction"]["data_collection_order"]) for e in got
    ] == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert all(e["transaction"]["id"] == str(out.cid) and e["ts_ms"] >= ts for e in got)


def test_retry_forever_until_a_late_endpoint_starts(started: Callable[..., Node]) -> None:
    port = reserve_port()
    late = WebhookReceiver(port=port)
    node = started(late.url)  # nobody listens yet
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 20)
    assert node.cdc is not None
    deadline = time.monotonic() + 30
    while node.cdc.status()["failed_requests"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.cdc.status()["failed_requests"] >= 3
    assert node.store.queue_stats()[0] == 20  # still queued on disk
    with late:
        wait_delivered(late, expected_for(cids))
        assert node.cdc.status()["dropped_events"] == 0


def test_changes_pruned_while_the_webhook_was_off_are_reported_not_silently_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """QA: a node run without --cdc-config prunes by --retention-cids (documented); back
    with its webhook, it said "sending everything above cid 0", sent only what was left
    and counted nothing. The gap is now logged and counted, and passed like a drop."""
    port = reserve_port()
    node = make_node(tmp_path, f"http://127.0.0.1:{port}/hook")  # nobody listens
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 30)
    node.close()
    plain = Store(NodeConfig(data_dir=tmp_path / "node", retention_cids=5))  # no webhook
    assert plain.retention_due()
    plain.prune_changes()
    pruned = plain.pruned_cid()
    plain.close()
    assert cids[0] < pruned < cids[-1]
    kept = [cid for cid in cids if cid > pruned]
    with WebhookReceiver(port=port) as receiver, caplog.at_level(logging.INFO, "litecdc.cdc"):
        node = make_node(tmp_path, receiver.url)
        try:
            wait_delivered(receiver, expected_for(kept))
            assert {cid for cid, _ in delivered(receiver)} == set(kept)
            assert node.cdc is not None
            assert node.cdc.status()["pruned_unsent_cids"] == pruned
            warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(
                f"the changes of cids 1 to {pruned} were pruned before this webhook sent them" in m
                for m in warned
            ), warned
            deadline = time.monotonic() + 30
            while node.store.cdc_high_watermark() != cids[-1] and time.monotonic() < deadline:
                time.sleep(0.02)
            assert node.store.cdc_high_watermark() == cids[-1]
        finally:
            node.close()


def test_a_webhook_configured_first_on_a_pruned_node_reports_no_loss(
    tmp_path: Path, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """Review: a webhook's first start on a node that had pruned by --retention-cids took
    the pruned history for changes it had lost. It records where it starts instead."""
    plain = Store(NodeConfig(data_dir=tmp_path / "node", retention_cids=5))
    plain.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    for i in range(20):
        plain.execute([S("INSERT INTO t(v) VALUES(?)", (i,))])
    plain.prune_changes()
    pruned = plain.pruned_cid()
    assert pruned > 0
    plain.close()
    with caplog.at_level(logging.INFO, "litecdc.cdc"):
        node = make_node(tmp_path, receiver.url)
        try:
            cids = write_rows(node, 3)
            wait_delivered(receiver, expected_for(cids))
            assert node.cdc is not None
            assert node.cdc.status()["pruned_unsent_cids"] == 0
        finally:
            node.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"CDC: leading; sending everything above cid {pruned}" in caplog.text


def test_retry_limit_drops_and_counts_then_continues(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    receiver.fail_share = 1.0
    node = started(receiver.url, transmit_max_retries=2)
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    lost = write_rows(node, 1)
    assert node.cdc is not None
    deadline = time.monotonic() + 30
    while node.cdc.status()["dropped_batches"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    receiver.fail_share = 0.0
    kept = write_rows(node, 3)
    wait_delivered(receiver, expected_for(kept))
    status = node.cdc.status()
    assert (status["dropped_batches"], status["dropped_events"]) == (1, 1)
    assert status["failed_requests"] == 2 and status["retries"] == 1
    assert lost[0] not in {cid for cid, _ in delivered(receiver)}


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_failing_endpoint_still_gets_every_event(
    started: Callable[..., Node], receiver: WebhookReceiver, share: float
) -> None:
    receiver.fail_share = share
    node = started(receiver.url, max_batch_size=1)  # one request per transaction
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 60)
    wait_delivered(receiver, expected_for(cids), timeout=60)
    assert receiver.rejected, "the receiver should have failed some requests"
    assert node.cdc is not None and node.cdc.status()["dropped_events"] == 0


def test_timeouts_and_dropped_connections_are_retried(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    receiver.drop_next(2)
    node = started(receiver.url, transmit_timeout="200ms")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    receiver.delay_seconds = 0.5  # past the timeout
    cids = write_rows(node, 2)
    assert node.cdc is not None
    deadline = time.monotonic() + 30
    while node.cdc.status()["failed_requests"] < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    receiver.delay_seconds = 0.0
    wait_delivered(receiver, expected_for(cids))
    assert "timed out" in str(node.cdc.status()["last_error"] or "timed out")


def test_https_with_a_private_ca(started: Callable[..., Node], tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    with WebhookReceiver(tls=certs) as secure:
        node = started(secure.url, tls={"ca_cert_file": str(certs.ca_cert)})
        node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        cids = write_rows(node, 3)
        wait_delivered(secure, expected_for(cids))
        assert secure.requests[0].tls


def test_mutual_tls_requires_the_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    with WebhookReceiver(tls=certs, require_client_cert=True) as secure:
        without = make_node(tmp_path / "a", secure.url, tls={"ca_cert_file": str(certs.ca_cert)})
        try:
            without.store.execute([S("CREATE TABLE t(v)"), S("INSERT INTO t VALUES(1)")])
            assert without.cdc is not None
            deadline = time.monotonic() + 30
            while without.cdc.status()["failed_requests"] < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert without.cdc.status()["failed_requests"] >= 2
            assert secure.accepted == [] and secure.tls_failures
        finally:
            without.close()
        with_cert = make_node(
            tmp_path / "b",
            secure.url,
            tls={
                "ca_cert_file": str(certs.ca_cert),
                "cert_file": str(certs.client_cert),
                "key_file": str(certs.client_key),
            },
        )
        try:
            with_cert.store.execute([S("CREATE TABLE t(v)")])
            out = with_cert.store.execute([S("INSERT INTO t VALUES(1)")])
            wait_delivered(secure, {(out.cid, 0)})  # type: ignore[arg-type]
            assert "litecdc-test-client" in (secure.accepted[0].client_cert_subject or "")
        finally:
            with_cert.close()


def test_requests_are_signed_per_standard_webhooks(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    receiver.fail_next(1)
    # a real node id has dots, and so have the message ids made from it (QA: the fake
    # refused them)
    node = started(
        receiver.url, node_id="127.0.0.1:14002", hmac_secret=SECRET, headers={"X-Team": "data"}
    )
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 3)
    wait_delivered(receiver, expected_for(cids))
    assert all(receiver.verify_standard_webhooks(SECRET))
    assert not any(receiver.verify_standard_webhooks("whsec_" + "A" * 32))
    first, retry = receiver.requests[0], receiver.requests[1]
    assert first.headers["webhook-id"] == retry.headers["webhook-id"]  # stable across retries
    for request in receiver.requests:  # NODE-FIRST-LAST-MS (the last commit's time)
        payload = request.json_body["payload"]
        first_cid, last = payload[0]["index"], payload[-1]
        assert request.headers["webhook-id"] == (
            f"127.0.0.1:14002-{first_cid}-{last['index']}-{last['commit_timestamp']}"
        )
    assert first.headers["x-team"] == "data"


def test_high_watermark_is_persisted_through_the_journal_and_prunes(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    node = started(receiver.url)
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 10)
    wait_delivered(receiver, expected_for(cids))
    deadline = time.monotonic() + 30
    while node.store.cdc_high_watermark() != cids[-1] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.store.cdc_high_watermark() == cids[-1]
    assert node.store.queue_stats() == (0, None)  # delivered changes pruned
    internal = [e for e in node.store.journal_page(0, 1000).entries if e.internal]
    assert internal and "_litecdc_cdc_state" in (internal[0].query or "")
    status = node.cdc.status() if node.cdc else {}
    assert status["hwm_persisted"] == cids[-1] and status["queue_length"] == 0


def test_max_batch_events_bounds_a_request_without_splitting_transactions(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    from litecdc import Store

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    sizes = [3, 3, 3, 8, 1]
    for size in sizes:
        store.execute(
            [S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(size)], transaction=True
        )
    store.close()
    node = make_node(tmp_path, receiver.url, max_batch_size=100, max_batch_events=7)
    try:
        receiver.wait_for(lambda _: len(events(receiver)) >= sum(sizes), timeout=30)
        per_request = [[len(p["events"]) for p in b["payload"]] for b in receiver.batches]
        assert per_request == [[3, 3], [3], [8], [1]]
    finally:
        node.close()


def test_a_transaction_larger_than_max_batch_events_goes_whole_read_in_pages(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """A transaction of more changes than max_batch_events goes alone, whole, in one
    request, its body built a page of max_batch_events changes at a time (QA: read whole
    as Python objects, a 600,000-row one took 1.9 GB); table_filter applies to every page,
    and the transactions around it travel as usual."""
    from litecdc import Store

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)"), S("CREATE TABLE u(v)")])
    before = store.execute([S("INSERT INTO t(v) VALUES('before')")]).cid
    rows = [S("INSERT INTO t(v) VALUES(?)", (i,)) for i in range(25)]
    rows[3:3] = [S("INSERT INTO u(v) VALUES(?)", (i,)) for i in range(5)]
    large = store.execute(rows, transaction=True).cid
    after = store.execute([S("INSERT INTO t(v) VALUES('after')")]).cid
    store.close()
    node = make_node(
        tmp_path, receiver.url, max_batch_size=100, max_batch_events=7, table_filter="t"
    )
    try:
        receiver.wait_for(lambda _: len(events(receiver)) >= 27, timeout=30)
        assert [[p["index"] for p in b["payload"]] for b in receiver.batches] == [
            [before],
            [large],
            [after],
        ]
        sent = receiver.batches[1]["payload"][0]["events"]
        assert [e["after"]["v"] for e in sent] == list(range(25))
        assert {e["table"] for e in sent} == {"t"}
        status = wait_status(node, lambda s: s["hwm"] == after)
        assert status["skipped_events"] == 5 and status["sent_events"] == 27
    finally:
        node.close()


def test_a_large_body_gets_transmit_timeout_per_8_mib_started(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    """A request of large rows takes longer than a few seconds to send and read: it gets
    transmit_timeout per started 8 MiB of body (QA: 288 MB in one request failed at 5 s
    on every attempt, and delivery stopped behind it)."""
    receiver.delay_seconds = 2.5  # past transmit_timeout, well within 3 of them
    node = started(receiver.url, transmit_timeout="2s")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, b BLOB)")])
    blob = os.urandom(100_000)  # 133 KB as base64: 150 rows, about 19 MiB of JSON
    cid = node.store.execute(
        [S("INSERT INTO t(b) VALUES(?)", (blob,)) for _ in range(150)], transaction=True
    ).cid
    wait_delivered(receiver, {(cid, i) for i in range(150)})
    status = wait_status(node, lambda s: s["sent_batches"] >= 1)
    assert status["failed_requests"] == 0, status
    assert 16 * 2**20 < len(receiver.requests[0].body) <= 24 * 2**20


def test_a_large_body_past_its_allowance_says_how_much_it_had(
    receiver: WebhookReceiver,
) -> None:
    receiver.delay_seconds = 5.0
    sink = WebhookSink(CDCConfig(endpoint=receiver.url, transmit_timeout=0.2))
    body = b'{"payload": "' + b"x" * (9 * 2**20) + b'"}'
    try:
        with pytest.raises(TransmitError) as info:
            sink.send(body, "m-1")
    finally:
        sink.close()
    assert str(info.value) == (
        "timed out: no complete answer within transmit_timeout (0.2s; 0.4s for this 9 MiB "
        "body: one per 8 MiB started)"
    )


def test_a_body_the_endpoint_finds_too_large_says_what_to_change(
    receiver: WebhookReceiver,
) -> None:
    """Scale QA: a 100k-row transaction's body refused with 413 was retried for good, and
    "endpoint answered HTTP 413" said neither why nor what to change."""
    receiver.status_code = 413
    sink = WebhookSink(CDCConfig(endpoint=receiver.url))
    try:
        with pytest.raises(TransmitError) as info:
            sink.send(b'{"payload": "' + b"x" * (3 * 2**20) + b'"}', "m-1")
    finally:
        sink.close()
    assert str(info.value) == (
        "endpoint answered HTTP 413 (Payload Too Large) to this 3.0 MiB body: lower "
        "max_batch_events, or raise the endpoint's body limit — a transaction is never "
        "split, so its limit must hold the largest one"
    )


class SwitchableLeadership:
    """The Leadership interface with leadership switched by the test, standing in for the
    cluster's etcd election (issue 4): the service must send only while leading."""

    def __init__(self, node: Any) -> None:
        self.leader = False
        self._listeners: list[Callable[[bool], None]] = []
        self._journal = node.journal

    def is_leader(self) -> bool:
        return self.leader

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        self._listeners.append(callback)

    def write_internal(self, query: str) -> None:
        self._journal.commit_internal(query)

    def set(self, leader: bool) -> None:
        self.leader = leader
        for callback in self._listeners:
            callback(leader)


def test_only_the_leader_sends_and_a_new_leader_resends_above_the_watermark(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = SwitchableLeadership(store)
    config = parse_cdc_config(receiver.url)
    service = CDCService(config, store, leadership, node_id="n1")
    service.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        first = write_rows_store(store, 5)
        time.sleep(0.5)  # a follower must not send, however long it waits
        assert receiver.requests == []
        assert service.status()["is_leader"] is False
        leadership.set(True)  # gains leadership: sends everything above the watermark
        wait_delivered(receiver, expected_for(first))
        deadline = time.monotonic() + 30
        while store.cdc_high_watermark() != first[-1] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.cdc_high_watermark() == first[-1]
        leadership.set(False)
        second = write_rows_store(store, 3)
        time.sleep(0.5)
        assert {cid for cid, _ in delivered(receiver)} == set(first)
        leadership.set(True)  # leads again: resends from the persisted watermark, no gaps
        wait_delivered(receiver, expected_for(second))
        assert sorted({cid for cid, _ in delivered(receiver)}) == first + second
    finally:
        service.stop()
        store.close()


def test_a_node_that_lost_the_lead_shows_no_stale_error(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """QA: a leader whose deliveries failed, once another node led, kept showing the
    failure in /status for good, while the new leader delivered everything."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = SwitchableLeadership(store)
    config = CDCConfig(endpoint=receiver.url, **FAST_FIELDS)  # type: ignore[arg-type]
    service = CDCService(config, store, leadership, node_id="n1")
    receiver.status_code = 503
    service.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        write_rows_store(store, 1)
        leadership.set(True)
        failing = wait_status(service, lambda s: s["failed_requests"] >= 1)
        assert failing["last_error"] == "endpoint answered HTTP 503", failing
        leadership.set(False)
        follower = service.status()
        assert (follower["is_leader"], follower["last_error"]) == (False, None), follower
        assert follower["failed_requests"] >= 1  # (the counters stay)
    finally:
        service.stop()
        store.close()


def write_rows_store(store: Any, count: int) -> list[int]:
    return [store.execute([S("INSERT INTO t(v) VALUES(?)", (i,))]).cid for i in range(count)]


def test_credentials_in_the_url_are_sent_but_never_logged(
    started: Callable[..., Node], receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """httpx logs every request's URL: the password used to be in every log line (QA)."""
    caplog.set_level("DEBUG")  # every logger, httpx's included
    url = receiver.url.replace("http://", "http://alice:s%3Acr3t@")
    node = started(url)
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 2)
    wait_delivered(receiver, expected_for(cids))
    expected = "Basic " + base64.b64encode(b"alice:s:cr3t").decode()
    assert {r.header("authorization") for r in receiver.requests} == {expected}
    # (the receiver records a request before its answer reaches the client, which logs
    # it then: wait for that, or the close below can cut it off, unlogged)
    sent = wait_status(node, lambda s: s["sent_events"] >= len(cids))
    assert sent["sent_events"] >= len(cids)
    node.close()  # every request answered and logged
    assert "cr3t" not in caplog.text
    assert "HTTP Request: POST" in caplog.text  # (the check above saw httpx's lines)


# --- QA round: every failure of a send is a failed delivery; transmit_timeout is total ---


def wait_status(
    node_or_service: Any, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The CDC status once ``predicate`` holds (within 30 s, else the last one)."""
    service = getattr(node_or_service, "cdc", node_or_service)
    deadline = time.monotonic() + 30
    status = service.status()
    while not predicate(status) and time.monotonic() < deadline:
        time.sleep(0.02)
        status = service.status()
    return status  # type: ignore[no-any-return]


def node_with(tmp_path: Path, config: CDCConfig) -> Node:
    """A node whose CDC config was built in code, not read and checked from a file."""
    node = Node(NodeConfig(data_dir=tmp_path / "node", node_id="node-1", cdc=config))
    node.start()
    return node


#: FAST as CDCConfig fields (seconds)
FAST_FIELDS = {
    "max_batch_delay": 0.02,
    "high_watermark_interval": 0.05,
    "transmit_timeout": 2.0,
    "transmit_min_backoff": 0.01,
    "transmit_max_backoff": 0.05,
}


def test_any_failure_of_a_send_is_a_transmit_error(receiver: WebhookReceiver) -> None:
    """A Content-Length header (refused at start-up now) made h11 raise its own
    LocalProtocolError, which is no httpx error: it escaped the sink (QA)."""
    config = CDCConfig(endpoint=receiver.url, headers={"Content-Length": "1"})
    sink = WebhookSink(config)
    try:
        with pytest.raises(TransmitError, match="LocalProtocolError"):
            sink.send(b'{"payload": []}', "m-1")
    finally:
        sink.close()


def test_an_unexpected_send_failure_follows_the_retry_policy(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    config = CDCConfig(
        endpoint=receiver.url,
        headers={"Content-Length": "1"},
        transmit_max_retries=2,
        **FAST_FIELDS,  # type: ignore[arg-type]
    )
    node = node_with(tmp_path, config)
    try:
        node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        write_rows(node, 1)
        status = wait_status(node, lambda s: s["dropped_batches"] >= 1)
        assert (status["dropped_batches"], status["dropped_events"]) == (1, 1)
        assert (status["failed_requests"], status["retries"]) == (2, 1)
        assert "LocalProtocolError" in str(status["last_error"])
        assert status["reader_errors"] == 0
    finally:
        node.close()


def test_a_closed_stdout_is_a_failed_delivery(tmp_path: Path) -> None:
    """``litecdc serve --cdc-config stdout | head -c 10``: once head exits, every write
    raises BrokenPipeError, which escaped the sink (QA)."""
    from litecdc import Store
    from litecdc.cdc import CDCService
    from litecdc.cdc.sinks import StdoutSink

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone
    stream = os.fdopen(write_end, "w")
    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = SwitchableLeadership(store)
    leadership.leader = True
    config = CDCConfig(endpoint="stdout", transmit_max_retries=3, **FAST_FIELDS)  # type: ignore[arg-type]
    service = CDCService(
        config, store, leadership, node_id="n1", sink=StdoutSink(config, stream=stream)
    )
    service.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        write_rows_store(store, 1)
        status = wait_status(service, lambda s: s["dropped_batches"] >= 1)
        assert (status["failed_requests"], status["dropped_batches"]) == (3, 1)
        assert str(status["last_error"]).startswith("stdout: BrokenPipeError")
    finally:
        service.stop()
        store.close()
        with contextlib.suppress(OSError):
            stream.close()


class FailingFeed:
    """The store as the service's change feed, failing its next ``failures`` reads."""

    def __init__(self, store: Any, failures: int) -> None:
        self._store = store
        self.failures = failures

    def read_transactions(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("disk on fire")
        return self._store.read_transactions(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_an_unexpected_reader_error_is_counted_shown_and_retried(
    tmp_path: Path, receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """An error outside a request used to be logged with a traceback every 0.1 s, with
    nothing in /status (QA)."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows_store(store, 2)
    leadership = SwitchableLeadership(store)
    leadership.leader = True
    feed = FailingFeed(store, failures=3)
    config = CDCConfig(endpoint=receiver.url, **FAST_FIELDS)  # type: ignore[arg-type]
    service = CDCService(config, feed, leadership, node_id="n1")
    caplog.set_level("ERROR", logger="litecdc.cdc")
    service.start()
    try:
        status = wait_status(service, lambda s: s["reader_errors"] >= 3)
        assert status["reader_errors"] == 3
        assert status["last_error"] == "reader failed: RuntimeError: disk on fire"
        wait_delivered(receiver, expected_for(cids))  # then it recovers
        failures = [r for r in caplog.records if "CDC reader failed" in r.getMessage()]
        assert len(failures) == 3
        assert [r.exc_info is not None for r in failures] == [True, False, False]
    finally:
        service.stop()
        store.close()


def test_transmit_timeout_bounds_the_whole_request(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    """An endpoint answering a body byte every 2 s kept one request alive 59 s with
    transmit_timeout 3s: httpx's timeouts are per read, and each byte restarts it (QA)."""
    receiver.trickle_seconds = 0.1  # well inside the per-read limit
    receiver.trickle_head = True  # the status line too: no answer within the timeout
    node = started(receiver.url, transmit_timeout="300ms")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 1)
    status = wait_status(node, lambda s: s["failed_requests"] >= 1)
    assert status["failed_requests"] >= 1
    assert str(status["last_error"]).startswith("timed out: no complete answer within")
    receiver.trickle_seconds = 0.0
    wait_delivered(receiver, expected_for(cids))
    assert node.cdc is not None and node.cdc.status()["dropped_events"] == 0


def test_a_2xx_status_delivers_however_slow_its_body(
    started: Callable[..., Node], receiver: WebhookReceiver
) -> None:
    """The status says whether the endpoint took the batch. Before, a 200 whose body
    trickled in was cut at transmit_timeout and retried, again and again: the endpoint
    got the batch every time and the queue never moved."""
    receiver.trickle_seconds = 0.1  # status and headers at once, then 4 KiB slowly
    node = started(receiver.url, transmit_timeout="300ms")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    cids = write_rows(node, 3)
    wait_delivered(receiver, expected_for(cids))
    status = wait_status(node, lambda s: s["sent_batches"] >= 1)
    assert status["failed_requests"] == 0, status
    receiver.trickle_seconds = 0.0


def test_stop_ends_a_stalled_request(tmp_path: Path, receiver: WebhookReceiver) -> None:
    """SIGTERM during a stalled request used to wait for it (11.7 s, QA)."""
    receiver.trickle_seconds = 0.1
    receiver.trickle_head = True  # no status yet when the service stops
    node = make_node(tmp_path, receiver.url, transmit_timeout="1h")
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    write_rows(node, 1)
    receiver.wait_for_requests(lambda requests: len(requests) >= 1, timeout=30)
    assert node.cdc is not None
    reader = node.cdc._thread
    assert reader is not None
    node.cdc.stop(timeout=20)  # far longer than stopping takes, far shorter than 1h
    assert not reader.is_alive()
    status = node.cdc.status()
    assert (status["failed_requests"], status["sent_batches"]) == (0, 0)  # not a failure
    node.close()


def test_stop_ends_a_batch_waiting_to_fill(tmp_path: Path, receiver: WebhookReceiver) -> None:
    """A batch waiting out a long max_batch_delay held stop() until its join timed out
    (10 s at shutdown, QA): the wait for more commits now comes round to the stop flag."""
    node = make_node(tmp_path, receiver.url, max_batch_delay="1h", max_batch_size=100)
    store: Any = node.store  # (the service's change feed)
    read = store.read_transactions
    batch_read = threading.Event()

    def spied(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        if found[0]:
            batch_read.set()
        return found

    store.read_transactions = spied
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    write_rows(node, 1)
    assert batch_read.wait(30)  # the reader has the batch, and waits to fill it
    assert node.cdc is not None
    reader = node.cdc._thread
    assert reader is not None
    node.cdc.stop(timeout=20)  # far longer than stopping takes, far shorter than 1h
    assert not reader.is_alive()
    assert receiver.batches == []  # not sent: resent after a restart
    node.close()


# --- QA round: what /status reports ---------------------------------------------------------


class PersistGate(SwitchableLeadership):
    """Leading, but writing no high watermark through the log while ``persist`` is off,
    so delivered changes stay stored (as between two high watermark entries)."""

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        self.leader = True
        self.persist = False

    def write_internal(self, query: str) -> None:
        # (the service's first start records the high watermark it starts from: 0 here)
        if not self.persist and query not in (CREATE_CDC_STATE, high_watermark_sql(0)):
            raise RuntimeError("not now")
        super().write_internal(query)


class FullDisk(SwitchableLeadership):
    """Leading, on a disk with no room for the high watermark's entry."""

    def __init__(self, node: Any) -> None:
        super().__init__(node)
        self.leader = True
        self.attempts = 0

    def write_internal(self, query: str) -> None:
        if query not in (CREATE_CDC_STATE, high_watermark_sql(0)):
            self.attempts += 1
            raise apsw.FullError("database or disk is full")
        super().write_internal(query)


def test_a_failing_high_watermark_write_is_retried_at_its_interval(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """Full-disk QA: a failed write of the high watermark was retried on every step of
    the loop — ten a second, a warning each — not once per high_watermark_interval."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = FullDisk(store)
    fields = {**FAST_FIELDS, "high_watermark_interval": 1.0}
    service = CDCService(
        CDCConfig(endpoint=receiver.url, **fields),  # type: ignore[arg-type]
        store,
        leadership,
        node_id="n1",
    )
    service.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        cids = write_rows_store(store, 3)
        wait_delivered(receiver, expected_for(cids))
        wait_status(service, lambda s: s["hwm"] == cids[-1])
        started, attempts = time.monotonic(), leadership.attempts
        time.sleep(2.0)
        # (an upper bound only: a slow machine makes fewer attempts, never more)
        elapsed = time.monotonic() - started
        assert leadership.attempts - attempts <= elapsed / 1.0 + 1, leadership.attempts
        assert service.status()["hwm_persisted"] == 0
    finally:
        service.stop()
        store.close()


def test_queue_length_counts_only_changes_still_to_deliver(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """queue_length counted every stored change, delivered ones included (QA)."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = PersistGate(store)
    config = CDCConfig(endpoint=receiver.url, **FAST_FIELDS)  # type: ignore[arg-type]
    service = CDCService(config, store, leadership, node_id="n1")
    service.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        delivered_cids = write_rows_store(store, 5)
        wait_delivered(receiver, expected_for(delivered_cids))
        status = wait_status(service, lambda s: s["hwm"] == delivered_cids[-1])
        assert store.queue_stats()[0] == 5  # still stored: no high watermark entry yet
        assert (status["queue_length"], status["oldest_queued_cid"]) == (0, None)
        assert status["hwm_persisted"] == 0
        receiver.fail_share = 1.0
        waiting = write_rows_store(store, 2)
        status = wait_status(service, lambda s: s["failed_requests"] >= 1)
        assert (status["queue_length"], status["oldest_queued_cid"]) == (2, waiting[0])
    finally:
        receiver.fail_share = 0.0
        service.stop()
        store.close()


def test_a_follower_reports_the_replicated_high_watermark(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """Followers showed hwm 0 while the replicated watermark was 1309 (QA)."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    leadership = SwitchableLeadership(store)
    leadership.leader = True
    config = CDCConfig(endpoint=receiver.url, **FAST_FIELDS)  # type: ignore[arg-type]
    leader = CDCService(config, store, leadership, node_id="n1")
    leader.start()
    try:
        store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
        cids = write_rows_store(store, 3)
        wait_delivered(receiver, expected_for(cids))
        wait_status(leader, lambda s: s["hwm_persisted"] == cids[-1])
        leader.stop()
        pending = write_rows_store(store, 2)  # in the queue, for the next leader
        # another node's service on the same replicated state, never leading
        follower = CDCService(config, store, SwitchableLeadership(store), node_id="n2")
        status = follower.status()
        assert status["is_leader"] is False
        assert (status["hwm"], status["hwm_persisted"]) == (cids[-1], cids[-1])
        assert (status["queue_length"], status["oldest_queued_cid"]) == (2, pending[0])
    finally:
        leader.stop()
        store.close()


def test_status_shows_an_ipv6_endpoint_without_credentials(tmp_path: Path) -> None:
    """The brackets were dropped: http://u:p@[::1]:9/hook showed as http://::1:9/hook (QA)."""
    from litecdc import Store
    from litecdc.cdc import CDCService

    store = Store(NodeConfig(data_dir=tmp_path / "node"))
    try:
        config = parse_cdc_config("http://u:p@[::1]:9/hook")
        service = CDCService(config, store, SwitchableLeadership(store), node_id="n1")
        assert service.status()["endpoint"] == "http://[::1]:9/hook"
    finally:
        store.close()


class _SlowHandshakeServer:
    """A real TLS server that, on each connection, first calls ``on_accept`` and then
    waits ``delay`` seconds before its side of the handshake — as a leader paused there
    would find it on waking. Records every byte the client sends after the handshake."""

    def __init__(self, certs: Any, delay: float, on_accept: Callable[[], None]) -> None:
        import socket
        import ssl

        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(certs.server_cert, certs.server_key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.received = b""
        self.handshakes = 0
        self._delay, self._on_accept = delay, on_accept
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        import ssl

        conn, _ = self._listener.accept()
        self._on_accept()
        time.sleep(self._delay)
        conn.settimeout(2.0)
        with contextlib.suppress(OSError), self._context.wrap_socket(conn, server_side=True) as tls:
            self.handshakes += 1
            with contextlib.suppress(OSError, ssl.SSLError):
                while chunk := tls.recv(65536):
                    self.received += chunk

    def close(self) -> None:
        self._thread.join(10)
        self._listener.close()


def test_a_batch_is_withdrawn_when_the_node_stops_leading_during_the_tls_handshake(
    tmp_path: Path,
) -> None:
    """Webhook QA: a cluster leader SIGSTOPped while its TLS handshake waited finished it on
    waking, 2.6 s after another node took the lead, and sent its batch anyway: leadership
    was asked only before connecting. It is asked again once the connection is ready,
    before the request's first byte (here it is lost while the server delays the
    handshake), and nothing of the batch goes out."""
    import ssl

    from litecdc.cdc.sinks import Withdrawn
    from litecdc.webhook_client import RequestExpired, WebhookClient

    certs = make_certs(tmp_path / "tls")
    leading = threading.Event()
    leading.set()
    server = _SlowHandshakeServer(certs, 0.3, on_accept=leading.clear)
    path = tmp_path / "cdc.json"
    path.write_text(
        json.dumps(
            {
                "endpoint": f"https://localhost:{server.port}/hook",
                "tls": {"ca_cert_file": str(certs.ca_cert)},
                "transmit_timeout": "5s",
            }
        )
    )
    sink = WebhookSink(parse_cdc_config(str(path)))
    try:
        with pytest.raises(Withdrawn):
            sink.send(b'{"payload": []}', "n1-2-2", may_send=leading.is_set)
    finally:
        sink.close()
        server.close()
    assert server.handshakes == 1  # the connection was made, TLS done…
    assert server.received == b""  # …and not one byte of the request sent

    # a deadline passed by the time the connection is ready (a process paused through
    # it: the deadline's timer, waking at the same moment, can lose the race) ends the
    # request there too, unsent
    server = _SlowHandshakeServer(certs, 0.3, on_accept=lambda: None)
    context = ssl.create_default_context(cafile=str(certs.ca_cert))
    client = WebhookClient(f"https://localhost:{server.port}/hook", timeout=5.0, headers={},
                           verify=context)  # fmt: skip
    original = client._before_sending

    def after_a_pause() -> None:
        client._deadline_at = time.monotonic() - 1.0
        original()

    client._before_sending = after_a_pause  # type: ignore[method-assign]
    try:
        with pytest.raises(RequestExpired):
            client.post(b"{}", {})
    finally:
        client.close()
        server.close()
    assert server.handshakes == 1 and server.received == b""


def test_retries_of_an_endpoint_that_stays_down_are_logged_in_summary(
    started: Callable[..., Node], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops QA: every failed attempt was a warning line for as long as the endpoint was
    down — 86 a second with transmit_min_backoff 0, 46 MB an hour. Three failure lines
    per interval (10 s; shortened here) at most, the next counting those left out; drops
    (a small transmit_max_retries) alike, and a delivery says how many were left out."""
    from litecdc.cdc import service as service_module

    monkeypatch.setattr(service_module, "RETRY_LOG_INTERVAL", 0.6)
    caplog.set_level("WARNING", logger="litecdc.cdc")
    node = started(f"http://127.0.0.1:{reserve_port()}/hook")  # nothing listens there
    node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    write_rows(node, 1)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "failed (attempt" in r.getMessage()]

    deadline = time.monotonic() + 30
    while len(lines()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    status = wait_status(node, lambda s: True)
    logged = lines()
    assert status["failed_requests"] > len(logged) + 10, (status, logged)
    assert len(logged) >= 5, logged  # (three, then three per 0.6 s)
    assert all("not logged since the last line" not in line for line in logged[:3])
    assert "more failure(s) not logged since the last line)" in logged[3], logged
    node.close()

    caplog.clear()  # review: drops, with a small transmit_max_retries, flooded the same way
    dropping = started(f"http://127.0.0.1:{reserve_port()}/hook", transmit_max_retries=1)
    dropping.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
    for _ in range(12):  # batches of their own (each waits for the one before to drop)
        write_rows(dropping, 1)
        wait_status(dropping, lambda s: s["dropped_events"] >= 1)
        time.sleep(0.05)
    status = wait_status(dropping, lambda s: s["dropped_events"] >= 12)
    drops = [r.getMessage() for r in caplog.records if "dropping batch" in r.getMessage()]
    assert status["dropped_batches"] >= 6, status
    assert 1 <= len(drops) < status["dropped_batches"], drops


def test_cids_numbered_again_get_new_webhook_ids(tmp_path: Path, receiver: WebhookReceiver) -> None:
    """QA: the id was NODE-FIRST-LAST alone. A node whose cids are numbered again (its data
    restored from an older backup, or started anew) sent new commits under ids it had used
    for others, and a receiver deduplicating by webhook-id (as Standard Webhooks advises)
    dropped them."""
    bodies: dict[str, bytes] = {}
    for run in ("before", "again"):  # the same node id, the same cids, other commits
        node = make_node(tmp_path / run, receiver.url, hmac_secret=SECRET)
        try:
            node.store.execute([S("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")])
            for _ in range(3):  # one commit per batch: the same cid ranges in both runs
                wait_delivered(receiver, expected_for(write_rows(node, 1)))
        finally:
            node.close()
        for request in receiver.accepted:
            seen = bodies.setdefault(request.headers["webhook-id"], request.body)
            assert seen == request.body, f"{request.headers['webhook-id']} sent twice, differently"
        receiver.reset()
    assert len(bodies) == 6, sorted(bodies)
