"""Reading the JSON files litecdc is configured with (``--cdc-config``, ``--auth``).

One set of rules for both: a regular file of at most :data:`MAX_CONFIG_BYTES` (a device
such as /dev/zero was read until memory ran out, a FIFO waited forever), UTF-8 JSON, a
key given twice refused (json keeps the last silently: which one the author meant cannot
be told), and input that would crash the parser (nesting that exhausts the stack, a number
with thousands of digits) refused as invalid JSON — each with a one-line ConfigError.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from litecdc.errors import ConfigError

#: the largest configuration file read: far more than any real one
MAX_CONFIG_BYTES = 1 << 20


def read_config_file(path: Path, option: str, shown: str | None = None) -> bytes:
    """The bytes of ``option``'s file; ``shown`` is how messages name it (default: as given)."""
    name = repr(shown if shown is not None else str(path))
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ConfigError(f"{option}: {name} is {kind}; give a JSON file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{option}: {name} holds {info.st_size} bytes, more than a configuration "
                f"file may ({MAX_CONFIG_BYTES})"
            )
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{option}: cannot read {name}: {exc.strerror}") from None


def decode_json(text: str, what: str) -> Any:
    """``text`` as JSON; ``what`` starts every message (``--auth: FILE``)."""

    def refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for key, value in pairs:
            if key in doc:
                raise ConfigError(f"{what}: key {key!r} is given twice")
            doc[key] = value
        return doc

    try:
        doc = json.loads(text, object_pairs_hook=refuse_repeated_keys)
    except RecursionError:
        raise ConfigError(f"{what} is not valid JSON: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and ints past Python's digit limit
        raise ConfigError(f"{what} is not valid JSON: {exc}") from None
    check_text(doc, what)
    return doc


def check_text(value: Any, what: str, where: str = "") -> None:
    """Every string in ``value`` is text UTF-8 can carry. JSON's "\\ud800" (and a command
    line's bytes that are not UTF-8) decode to lone surrogates, which fail later, where
    they are encoded: a password compared (HTTP 500 on every login), an envelope sent
    (CDC delivery stalled for good) — QA."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = value.encode("utf-8", "backslashreplace").decode("ascii", "replace")
            raise ConfigError(
                f"{what}: {where or 'a value'} must be UTF-8 text, got {shown!r}"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, what, f"a key in {where}" if where else "a key")
            check_text(item, what, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for position, item in enumerate(value, 1):
            check_text(item, what, f"{where}[{position}]" if where else f"entry {position}")
