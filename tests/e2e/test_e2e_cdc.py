"""``litecdc serve --cdc-config``: real node processes delivering to a real receiver."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
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
                assert "litecdc_cdc_reader_errors_total 0.0" in metrics
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
    plain_tls = tmp_path / "plain-tls.json"
    plain_tls.write_text(
        json.dumps({"endpoint": "http://127.0.0.1:9/h", "tls": {"insecure_skip_verify": True}})
    )
    for value, message in (
        (str(bad), "error: cdc config: max_batch_size must be at least 1, got -1"),
        ("ftp://127.0.0.1/x", "error: cdc config: endpoint scheme 'ftp' is not supported"),
        (str(tmp_path / "missing.json"), "error: --cdc-config: cannot read"),
        # QA: the password was in the message
        (
            "http://admin:s3cret@127.0.0.1:99999/h",
            "error: cdc config: endpoint 'http://127.0.0.1:99999/h' has an invalid port",
        ),
        # QA: '' silently turned delivery off, while '   ' was refused
        ("", "error: --cdc-config is empty: give an http(s):// URL"),
        (str(plain_tls), "error: cdc config: tls is set but the endpoint"),
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
        assert "s3cret" not in proc.stderr


def test_an_empty_environment_variable_counts_as_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As for every LITECDC_* variable (click's rule): LITECDC_CDC_CONFIG= is no delivery."""
    monkeypatch.setenv("LITECDC_CDC_CONFIG", "")
    node = Node(tmp_path / "data").start()
    try:
        with node.client() as c:
            assert "cdc" not in c.get("/status").json()
    finally:
        assert node.stop() == 0


def test_stdout_closed_by_its_reader_is_a_failed_delivery(tmp_path: Path) -> None:
    """``litecdc serve --cdc-config stdout | head -c 10``: a BrokenPipeError traceback
    every 0.1 s, and nothing in /status (QA)."""
    port = reserve_port()
    log_path = tmp_path / "node.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "litecdc",
                "serve",
                "--data-dir",
                str(tmp_path / "data"),
                "--http-addr",
                f"127.0.0.1:{port}",
                "--cdc-config",
                "stdout",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
        )
    try:
        assert proc.stdout is not None
        proc.stdout.close()  # the reader ("head") is gone
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            c.post("/db/execute", json=["CREATE TABLE t(v)", "INSERT INTO t VALUES(1)"])
            status: dict[str, object] = {}
            while time.monotonic() < deadline:
                status = c.get("/status").json()["cdc"]
                if status["failed_requests"] >= 1:
                    break
                time.sleep(0.05)
        assert str(status["last_error"]).startswith("stdout: BrokenPipeError"), status
        assert status["queue_length"] == 1 and status["reader_errors"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert "Traceback" not in log_path.read_text(errors="replace")
