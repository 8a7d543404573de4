"""What the etcd client logs about a member that does not answer (the client's requests
against real etcd members: tests/system/test_etcd_client.py)."""

from __future__ import annotations

import pytest

from litecdc.cluster import EtcdClient, EtcdSettings
from litecdc.cluster import etcd as etcd_module


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_member_failing_again_long_after_is_a_new_outage(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ops QA: a member that timed out once, then went unasked while the node used
    another, was said to "still not answer after 200 s" when it failed minutes later —
    and the line opening the new outage never came. gRPC channels connect only when
    used: nothing is contacted here (port 9, discard)."""
    clock = _Clock()
    monkeypatch.setattr(etcd_module, "time", clock)
    caplog.set_level("INFO", logger="litecdc.cluster")
    client = EtcdClient(EtcdSettings(endpoints=("127.0.0.1:9", "127.0.0.1:19")))
    try:
        member = client._endpoints[0]
        client._failed(member, "deadline exceeded")  # a brief timeout
        clock.now += 195.0  # unasked meanwhile: the node used the other member
        client._answered(client._endpoints[1])
        client._failed(member, "connection refused")  # a new outage
        for _ in range(2):  # which goes on (retried every few seconds)
            clock.now += 8.0
            client._failed(member, "connection refused")
    finally:
        client.close()
    # review: down all along, asked only now and then, no other member answering: one
    # outage, counted from its start
    quiet = EtcdClient(EtcdSettings(endpoints=("127.0.0.1:29", "127.0.0.1:39")))
    try:
        down = quiet._endpoints[0]
        quiet._failed(down, "connection refused")
        clock.now += 30.0
        quiet._failed(down, "connection refused")
    finally:
        quiet.close()
    later = [r.getMessage() for r in caplog.records if "127.0.0.1:29 " in r.getMessage()]
    assert later == [
        "etcd member 127.0.0.1:29 failed: connection refused",
        "etcd member 127.0.0.1:29 still does not answer after 30 s (1 more failed requests): "
        "connection refused; requests keep retrying it",
    ], later
    lines = [r.getMessage() for r in caplog.records if "127.0.0.1:9 " in r.getMessage()]
    assert lines == [
        "etcd member 127.0.0.1:9 failed: deadline exceeded",
        "etcd member 127.0.0.1:9 failed: connection refused",
        "etcd member 127.0.0.1:9 still does not answer after 16 s (2 more failed requests): "
        "connection refused; requests keep retrying it",
    ], lines
