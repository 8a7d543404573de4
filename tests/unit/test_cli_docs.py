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


def _commands(group: click.Group, prefix: str) -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in group.commands.items():
        found.append((f"{prefix} {name}", command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix} {name}")
    return found


def test_every_command_and_option_is_documented() -> None:
    docs = _documentation()
    assert isinstance(cli, click.Group)
    commands = _commands(cli, "litecdc")
    assert "litecdc pipeline verify" in dict(commands)  # subcommands are checked too
    for name, command in commands:
        assert name in docs, f"`{name}` is not documented"
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option.startswith("--") and option != "--help":
                    assert option in docs, f"`{name} {option}` is not documented"
