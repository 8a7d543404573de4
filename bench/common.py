"""What the three benchmark scripts share: the table and its rows, the machine's
description, CPU accounting from Linux ``/proc``, command-line options and cProfile
tables.

The scripts run as ``.venv/bin/python bench/bench_X.py``; Python then puts ``bench/``
first on ``sys.path``, so they import this module as ``common`` (and so do the
worker processes ``multiprocessing`` spawns, which inherit ``sys.path``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import apsw

from litecdc import WriteOutcome

# -- the table every benchmark writes -----------------------------------------------------------
TABLE = "items"
CREATE_TABLE = (
    f"CREATE TABLE {TABLE}(id INTEGER PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL, "
    "payload BLOB, qty INTEGER NOT NULL)"
)
INSERT = f"INSERT INTO {TABLE}(name, price, payload, qty) VALUES (?, ?, ?, ?)"

Row = tuple[str, float, bytes, int]


def make_rows(count: int, seed: int) -> list[Row]:
    """Rows of a realistic shape: short text, a price, a ~100-byte blob, a quantity."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz "
    return [
        (
            "".join(rng.choices(letters, k=rng.randint(10, 40))),
            round(rng.uniform(0.5, 5000.0), 2),
            rng.randbytes(rng.randint(32, 160)),
            rng.randint(0, 10_000),
        )
        for _ in range(count)
    ]


def committed_cid(outcome: WriteOutcome, failure: str) -> int:
    """The cid of a write, or RuntimeError ``"{failure}: [first error]"`` if none committed."""
    if outcome.cid is None:
        errors = [r.error for r in outcome.results if r.error]
        raise RuntimeError(f"{failure}: {errors[:1]}")
    return outcome.cid


# -- the machine --------------------------------------------------------------------------------
def sqlite_versions() -> dict[str, str]:
    """APSW's and SQLite's versions, for :func:`platform_line` and :func:`platform_json`."""
    return {"APSW": apsw.apsw_version(), "SQLite": apsw.sqlite_lib_version()}


def platform_line(title: str, versions: Mapping[str, str]) -> str:
    """``"{title}: Python 3.x, {name} {version}, …, N CPUs, {machine}"``."""
    named = "".join(f"{name} {version}, " for name, version in versions.items())
    return (
        f"{title}: Python {platform.python_version()}, {named}"
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )


def platform_json(versions: Mapping[str, str]) -> dict[str, Any]:
    """The start of a ``--json`` document: python, the lower-cased versions, cpus."""
    return {
        "python": platform.python_version(),
        **{name.lower(): version for name, version in versions.items()},
        "cpus": os.cpu_count(),
    }


# -- CPU accounting -----------------------------------------------------------------------------
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu(fields: list[str]) -> float:
    """user+system CPU seconds from the fields after ``(comm)`` of a /proc stat line."""
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def stat_cpu_seconds(stat_path: str) -> float | None:
    """user+system CPU seconds in a Linux ``/proc/…/stat`` file, or None without one."""
    try:
        fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return _stat_cpu(fields)


def process_cpu_seconds(pid: int | None) -> float | None:
    """user+system CPU seconds of a process (Linux /proc), or None elsewhere."""
    return None if pid is None else stat_cpu_seconds(f"/proc/{pid}/stat")


def process_table() -> dict[int, tuple[int, str, float]]:
    """Every process as pid -> (parent pid, command name, user+system CPU seconds), from
    Linux /proc ({} elsewhere)."""
    table: dict[int, tuple[int, str, float]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]  # may hold spaces and ")"
        fields = text.rsplit(")", 1)[1].split()
        table[int(stat.parent.name)] = (int(fields[1]), name, _stat_cpu(fields))
    return table


def descendants(table: dict[int, tuple[int, str, float]], pid: int) -> set[int]:
    """The pids below ``pid`` in a :func:`process_table`."""
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def machine_busy_idle() -> tuple[int, int] | None:
    """(busy, idle) jiffies over all CPUs since boot (Linux /proc/stat), or None."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, idle


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of all CPUs busy between two :func:`machine_busy_idle` samples, or None."""
    if before is None or after is None:
        return None
    busy = after[0] - before[0]
    idle = after[1] - before[1]
    return busy / (busy + idle) if busy + idle else None


def cpu_cores(before: float | None, after: float | None, seconds: float) -> float | None:
    """CPU seconds used between two samples, per second of ``seconds``: cores busy."""
    return None if before is None or after is None else (after - before) / seconds


def cores(value: float | None) -> str:
    """A table cell for :func:`cpu_cores`."""
    return "n/a" if value is None else f"{value:.2f}"


def load_note(seconds: float = 0.5) -> str:
    """How busy the machine is right now, warning when other processes use it."""
    before = machine_busy_idle()
    time.sleep(seconds)
    busy = busy_share(before, machine_busy_idle())
    if busy is None:
        return "machine load unknown"
    return f"machine CPU busy before the run: {busy:.0%}" + (
        " (other processes are running: expect lower, noisier figures)" if busy > 0.15 else ""
    )


# -- the command line ---------------------------------------------------------------------------
JSON_HELP = "also print the figures as one JSON object on the last line"


def new_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first line of the script's docstring."""
    return argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)


def add_output_arguments(
    parser: argparse.ArgumentParser, *, data_dir: str, json: str = JSON_HELP
) -> None:
    """``--data-dir`` (``data_dir`` says what it holds) and ``--json``."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"{data_dir} (default: a temporary directory, removed afterwards); "
        "must be empty or missing",
    )
    parser.add_argument("--json", action="store_true", help=json)


def require_at_least_one(
    parser: argparse.ArgumentParser, args: argparse.Namespace, names: Iterable[str]
) -> None:
    """Exit with a usage error unless each named option is at least 1."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")


def data_root(
    parser: argparse.ArgumentParser, data_dir: Path | None, prefix: str
) -> tuple[Path, Callable[[], None]]:
    """The folder for the databases and what removes it afterwards.

    ``--data-dir`` if given (created if missing; a usage error unless empty, and kept
    afterwards), else a new temporary directory named ``prefix…`` (removed).
    """
    if data_dir is None:
        root = Path(tempfile.mkdtemp(prefix=prefix))
        return root, lambda: shutil.rmtree(root, ignore_errors=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    if any(data_dir.iterdir()):
        parser.error(f"--data-dir {data_dir} is not empty")
    return data_dir, lambda: None


# -- cProfile tables ----------------------------------------------------------------------------
ProfileEntry = tuple[tuple[str, int, str], tuple[Any, ...]]


def profile_entries(profiler: cProfile.Profile) -> dict[tuple[str, int, str], tuple[Any, ...]]:
    """(file, line, function) -> (primitive calls, calls, own s, cumulative s, callers)."""
    raw: dict[tuple[str, int, str], tuple[Any, ...]]
    raw = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    return raw


def top_by_own_time(entries: Iterable[ProfileEntry], top: int) -> list[ProfileEntry]:
    """The ``top`` entries that took the most own time, most first."""
    return sorted(entries, key=lambda kv: kv[1][2], reverse=True)[:top]


def function_place(filename: str, line: int) -> str:
    """``file.py:line`` for a profiled function, or just its name for a built-in."""
    return f"{Path(filename).name}:{line}" if line else filename
