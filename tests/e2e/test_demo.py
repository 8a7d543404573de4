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
    assert run_demo(lines.append, tmp_path / "node", pipeline=False) == 0
    text = "\n".join(lines)
    assert re.search(
        r"cid  \d  snapshot  \d  INSERT INTO orders\(customer, amount\) VALUES\('ada', 12\.5\);",
        text,
    )
    assert "delete orders  before=" in text
    assert "NOT NULL constraint failed: orders.customer" in text
    assert "the webhook received all 5 row events" in text
    assert (tmp_path / "node" / "db.sqlite").exists()


@pytest.mark.slow
@pytest.mark.spark
def test_make_run_mirrors_into_delta_and_postgresql_exactly(tmp_path: Path) -> None:
    """The whole `make run` flow: webhook, Spark pipeline, Delta and PostgreSQL, verify."""
    lines: list[str] = []
    assert run_demo(lines.append, tmp_path / "node") == 0, "\n".join(lines)
    text = "\n".join(lines)
    for name in ("orders-lake", "orders-pg"):
        assert re.search(rf"pipeline verify {name}: .* 0 difference\(s\)", text)
    assert "incremental, applied through cid" in text
    assert re.search(r"the webhook received all [\d,]+ row events", text)
    assert text.endswith("ok: every check held")
    assert (tmp_path / "node" / "lake" / "orders" / "_delta_log").is_dir()


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


@pytest.mark.parametrize("cluster", [False, True])
def test_a_data_dir_that_is_a_file_is_refused_in_one_line(tmp_path: Path, cluster: bool) -> None:
    """CLI QA: `litecdc demo --cluster --data-dir FILE` ended in a FileExistsError traceback."""
    from click.testing import CliRunner

    from litecdc.cli import cli

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    args = ["demo", "--data-dir", str(not_a_dir), *(["--cluster"] if cluster else [])]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --data-dir {str(not_a_dir)!r} cannot be used as a directory: File exists\n"
    )
    assert not_a_dir.read_text() == "x"
