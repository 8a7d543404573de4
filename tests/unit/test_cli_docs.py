"""Every CLI command and option is documented (README or docs/), like sqlite-utils does."""

from __future__ import annotations

from pathlib import Path

import click

from litecdc.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def _documentation() -> str:
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(parts)


def test_every_command_and_option_is_documented() -> None:
    docs = _documentation()
    assert isinstance(cli, click.Group)
    for name, command in cli.commands.items():
        assert f"litecdc {name}" in docs, f"`litecdc {name}` is not documented"
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option.startswith("--") and option != "--help":
                    assert option in docs, f"`litecdc {name} {option}` is not documented"
