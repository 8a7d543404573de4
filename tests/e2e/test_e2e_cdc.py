"""``litecdc serve --cdc-config``: real node processes delivering to a real receiver."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from fakes import WebhookReceiver, reserve_port
from litecdc_node import Node

FAST = {
    "max_batch_delay": "20ms",
    "high_watermark_interval": "50ms",
    "transmit_min_backoff": "20ms",
    "transmit_max_backoff": "100ms",
}


def _config(tmp_path: Path, endpoint: str) -> str:
    path = tmp_path / "cdc.json"
    path.write_text(json.dumps({"endpoint": endpoint, **FAST}))
    return str(path)


def _indexes(receiver: WebhookReceiver) -> list[int]:
    return [p["index"] for b in receiver.batches for p in b["payload"]]


def test_events_queued_at_shutdown_are_sent_after_restart(tmp_path: Path) -> None:
    port = reserve_port()
    receiver = WebhookReceiver(port=port)  # not started: the endpoint is down
    config = _config(tmp_path, receiver.url)
    node = Node(tmp_path / "data", "--cdc-config", config).start()
    cids = []
    with node.client() as c:
        node.execute(c, ["CREATE TABLE t(id INTEGER PRIMARY KEY, v)"])
        for i in range(20):
            body = node.execute(c, [["INSERT INTO t(v) VALUES(?)", i]], raft_index="")
            cids.append(body["raft_index"])
        status = c.get("/status").json()["cdc"]
        assert status["queue_length"] == 20 and status["sent_events"] == 0
    assert node.stop() == 0, node.log()
    with receiver:
        restarted = Node(tmp_path / "data", "--cdc-config", config, port=node.port).start()
        try:
            receiver.wait_for(lambda _: set(cids) <= set(_indexes(receiver)), timeout=30)
            assert sorted(set(_indexes(receiver))) == cids  # none lost, none skipped
            with restarted.client() as c:
                deadline = time.monotonic() + 30
                while c.get("/status").json()["cdc"]["queue_length"] and (
                    time.monotonic() < deadline
                ):
                    time.sleep(0.05)
                status = c.get("/status").json()["cdc"]
                assert status["queue_length"] == 0 and status["hwm"] == cids[-1]
                metrics = c.get("/metrics").text
                assert f"litecdc_cdc_hwm {float(cids[-1])}" in metrics
                assert "litecdc_cdc_sent_events_total 20.0" in metrics
                assert "litecdc_cdc_dropped_events_total 0.0" in metrics
        finally:
            assert restarted.stop() == 0


def test_status_and_metrics_without_cdc(fresh_node: Node) -> None:
    with fresh_node.client() as c:
        assert "cdc" not in c.get("/status").json()
        metrics = c.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "litecdc_last_cid 1.0" in metrics.text


def test_invalid_cdc_config_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"endpoint": "http://127.0.0.1:9/h", "max_batch_size": -1}))
    for value, message in (
        (str(bad), "error: cdc config: max_batch_size must be at least 1, got -1"),
        ("ftp://127.0.0.1/x", "error: cdc config: endpoint scheme 'ftp' is not supported"),
        (str(tmp_path / "missing.json"), "error: --cdc-config: cannot read"),
    ):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "litecdc",
                "serve",
                "--data-dir",
                str(tmp_path / "d"),
                "--http-addr",
                f"127.0.0.1:{reserve_port()}",
                "--cdc-config",
                value,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2
        assert proc.stderr.startswith(message), proc.stderr
