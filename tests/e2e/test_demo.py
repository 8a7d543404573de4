"""`make run`'s demo runs against a real node process and checks what it shows."""

from __future__ import annotations

from pathlib import Path

from litecdc.demo import run_demo


def test_demo_runs_and_its_checks_hold(tmp_path: Path) -> None:
    lines: list[str] = []
    assert run_demo(lines.append, tmp_path / "node") == 0
    text = "\n".join(lines)
    assert "cid  3  snapshot  2  INSERT INTO orders(customer, amount) VALUES('ada', 12.5);" in text
    assert "delete orders  before=" in text
    assert "NOT NULL constraint failed: orders.customer" in text
    assert (tmp_path / "node" / "db.sqlite").exists()
