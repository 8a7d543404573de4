"""`make run`'s demo runs against a real node process and checks what it shows."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import pytest

from litecdc.demo import run_demo


def test_demo_runs_and_its_checks_hold(tmp_path: Path) -> None:
    lines: list[str] = []
    assert run_demo(lines.append, tmp_path / "node") == 0
    text = "\n".join(lines)
    assert "cid  3  snapshot  2  INSERT INTO orders(customer, amount) VALUES('ada', 12.5);" in text
    assert "delete orders  before=" in text
    assert "NOT NULL constraint failed: orders.customer" in text
    assert (tmp_path / "node" / "db.sqlite").exists()


@pytest.mark.slow
def test_cluster_demo_fails_over_and_its_checks_hold(tmp_path: Path) -> None:
    if shutil.which("etcd") is None:  # pragma: no cover - the set-up installs it
        pytest.skip("etcd is not installed: run `bash scripts/setup-system.sh` (as root)")
    lines: list[str] = []
    assert run_demo(lines.append, tmp_path / "cluster", cluster=True) == 0
    text = "\n".join(lines)
    assert '"is_leader": true' in text and '"mode": "follower"' in text
    killed = re.search(r"kill -9 the leader (n\d)", text)
    new = re.search(r"new leader: (n\d)", text)
    assert killed and new and killed.group(1) != new.group(1)
    assert re.search(
        r"journal entries identical on n\d and n\d: yes; captured changes identical: yes", text
    )
    assert "update orders  before=" in text
    assert text.endswith("the survivors hold identical journal entries and changes")
    # every process was stopped: nothing listens on etcd's and the nodes' ports any more
    ports = re.findall(r"(?:--http-addr|started etcd on) 127\.0\.0\.1:(\d+)", text)
    assert len(ports) == 4
    for port in ports:
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", int(port))) != 0
