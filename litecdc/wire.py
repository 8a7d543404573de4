"""How the pull source's data travels: Arrow IPC streams, and keys as JSON text.

Shared by the node (``db/source``, ``http/``) and the pipeline's client, so both ends
agree on one encoding.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from litecdc.errors import RequestError
from litecdc.results import INT64_MAX, INT64_MIN

ARROW_STREAM = "application/vnd.apache.arrow.stream"

#: Columns litecdc adds to mirrored rows and change events.
CID_COLUMN = "_litecdc_cid"  # the version: commit id of the change, or cid a chunk was read at
SEQ_COLUMN = "_litecdc_seq"  # order of the change inside its transaction
OP_COLUMN = "_litecdc_op"  # 'upsert' or 'delete' (an update of the key = delete + upsert)
#: The key of a rowid table that declares no primary key (its rowid).
ROWID_COLUMN = "_litecdc_rowid"
OP_UPSERT = "upsert"
OP_DELETE = "delete"


def unicode_fold(name: str) -> str:
    """``name`` as Spark and delta-rs compare names regardless of letter case: Unicode's
    lowercase (Java's toLowerCase(Locale.ROOT), Rust's to_lowercase: İ is i + dot, a
    final Σ is ς)."""
    return name.lower()


def by_letter_fold(name: str) -> str:
    """``name`` as MariaDB compares names regardless of letter case: letter by letter
    (measured on MariaDB 10.11: İ is i; a capital sigma is the small one even at the end
    of a word, which Unicode's lowercase makes the final form; K, Ω, ǅ fold as in
    Unicode). Letters whose case Unicode defined after MariaDB's tables (Georgian
    Mtavruli) fold here and not there: refused, they could have been taken."""
    return "".join("i" if ch == "\u0130" else ch.lower() for ch in name)


def name_folds(name: str) -> frozenset[str]:
    """Every form a server that takes names regardless of letter case may take ``name``
    as. Where SQLite (ASCII only) keeps two names apart, these may not (idents QA:
    columns é and É, k and the Kelvin sign)."""
    return frozenset({unicode_fold(name), by_letter_fold(name)})


def same_name_to_case_blind(
    names: Sequence[str], fold: Callable[[str], str]
) -> tuple[str, str] | None:
    """The first two of ``names`` that a server comparing names by ``fold`` takes as one,
    or None."""
    seen: dict[str, str] = {}
    for name in names:
        folded = fold(name)
        if folded in seen:
            return seen[folded], name
        seen[folded] = name
    return None


#: A subscriber's name is one segment of /cdc/subscriptions/{name}/…: a "/" (or "..")
#: could never be addressed there again, so its hold could not be moved or released.
SUBSCRIBER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def subscriber_name_problem(name: object) -> str | None:
    """What is wrong with a subscriber name, or None when it is fine."""
    if isinstance(name, str) and SUBSCRIBER_NAME.fullmatch(name) and name.strip(".") != "":
        return None
    return (
        "a subscriber name is 1 to 200 letters, digits, '_', '-' or '.' (not only dots), "
        f"got {name!r}"
    )


#: The Arrow type of each name a column's mirrored type can have.
ARROW_TYPES: dict[str, pa.DataType] = {
    "int64": pa.int64(),
    "float64": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
}


def to_ipc(table: pa.Table) -> bytes:
    """``table`` (schema metadata included) as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


class _Written:
    """A file the Arrow IPC writer writes to, handing on what it got so far."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        part = bytes(data)
        self._parts.append(part)
        return len(part)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


def ipc_chunks(table: pa.Table) -> Iterator[bytes]:
    """``table`` as one Arrow IPC stream, a record batch at a time: a change page holds
    whole transactions, and serving one of 1.5M rows as one bytes object took three
    copies of it at once (scale QA)."""
    sink = _Written()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
            yield sink.take()
    yield sink.take()  # the schema when there was no batch, and the end of the stream


def release_unused_memory() -> None:
    """Hand back to the system what Arrow's allocator keeps of freed buffers (it keeps
    them for reuse: after a 1.5M-event change page the node stayed ~115 MB bigger)."""
    pa.default_memory_pool().release_unused()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


#: what a key value that is not a finite float is written as: JSON has no number for it
#: (a key is never NaN: SQLite stores NaN as NULL)
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf}


def _key_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    return value


def encode_key(key: Sequence[Any] | None) -> str:
    """A key as JSON text (valid JSON): blobs as ``{"base64": "…"}`` so they stay blobs on
    the way back, ±infinity as ``{"float": "inf"}`` / ``{"float": "-inf"}`` (a REAL key
    can hold one; JSON has no number for it, and ``null`` would be a NULL key)."""
    if key is None:
        return "null"
    return json.dumps([_key_value(v) for v in key], allow_nan=False)


def decode_key(text: str | None, what: str) -> list[Any] | None:
    """A key sent back as JSON text (``encode_key``); None when absent or null."""
    if text is None or text in ("", "null"):
        return None
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except _KeyValueError as exc:
        raise RequestError(f"{what}: {exc}") from None
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise RequestError(
            f"{what} must be a JSON list of key values, got {text[:200]!r}"
        ) from None
    if not isinstance(value, list):
        raise RequestError(f"{what} must be a JSON list of key values, got {text!r}")
    out: list[Any] = []
    for v in value:
        if isinstance(v, dict):
            if set(v) == {"float"} and isinstance(v["float"], str) and v["float"] in _NON_FINITE:
                out.append(_NON_FINITE[v["float"]])
                continue
            if set(v) != {"base64"} or not isinstance(v["base64"], str):
                raise RequestError(
                    f'{what}: a blob key value is {{"base64": "…"}} and an infinite one '
                    f'{{"float": "inf"}} or {{"float": "-inf"}}, got {v!r}'
                )
            try:
                out.append(base64.b64decode(v["base64"], validate=True))
            except ValueError:
                raise RequestError(f"{what}: invalid base64 in {v!r}") from None
        elif isinstance(v, list):
            raise RequestError(f"{what}: key values are numbers, strings or blobs, got {v!r}")
        elif type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            # (fuzz QA: a 500 from binding it) no key holds one: SQLite's integers are 64-bit
            raise RequestError(f"{what}: {v} is outside SQLite's 64-bit integer range")
        else:
            out.append(v)
    return out


class _KeyValueError(ValueError):
    """A number in a key that no SQLite key can hold (decode_key says which)."""


def _no_constant(name: str) -> float:
    # (fuzz QA: NaN was taken, and answered an empty page "done": SQLite stores NaN as NULL)
    raise _KeyValueError(
        f'{name} is not a key value (an infinite one is {{"float": "inf"}} or '
        '{"float": "-inf"}; SQLite keeps no NaN)'
    )


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _KeyValueError(f"{text} is beyond a 64-bit float's range")
    return value


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return repr(value)
    return value


def table_to_json(page: pa.Table) -> dict[str, Any]:
    """A page as JSON-friendly columns and rows (blobs as base64, like rqlite)."""
    columns = page.schema.names
    rows = [list(jsonable(tuple(r.values()))) for r in page.to_pylist()]
    return {"columns": columns, "rows": rows}
