"""rqlite's wire format: request parsing and response bodies.

Everything here is pure (no I/O, no store): the HTTP handlers in :mod:`litecdc.http.app`
call :func:`parse_statements` on a request body and :func:`format_results` on what the
store returned. The behaviour follows rqlite's ``http/request_parser.go``,
``http/query_params.go`` and ``command/encoding/json.go``, and what rqlite 9.4 / 10.3
servers were measured to send:

* A body is a JSON array. Each element is an SQL string, or an array whose first element
  is the SQL and whose other elements are its parameters: values bind positionally,
  an object binds named parameters. ``true``/``false`` bind as 1/0, an integer beyond
  int64 binds as a REAL, an array of byte values (0-255) binds as a BLOB.
* A body sent as ``Content-Type: text/plain`` is one SQL statement.
* Errors: ``invalid JSON body``, ``invalid request``, ``unsupported type`` and
  ``no statements`` (HTTP 400); litecdc appends a colon and what exactly was wrong.
  Every body that does not decode is ``invalid JSON body`` (:func:`decode_json_body`):
  bytes that are not UTF-8, an unpaired surrogate escape, nesting deeper than the decoder
  allows, as well as plain syntax errors.
* A result omits ``last_insert_id``/``rows_affected`` when zero, ``values`` when there
  are no rows, and ``time`` unless timings were asked for.
* ``types`` holds the declared type in lower case; a column without one (an expression)
  takes the storage class of its value in the first row (``""`` for NULL).
* Values of columns declared ``boolean`` are JSON booleans; ``date``, ``datetime`` and
  ``timestamp`` columns give RFC 3339 text as rqlite's SQLite driver parses it.
* BLOBs are base64 text, or arrays of byte values with ``blob_array``; a BLOB in a column
  declared with one of rqlite's text types (``text``, ``json``, ``varchar…``…) is sent as
  text, as rqlite does.

Deliberate differences from rqlite (documented in docs/http-api.md): a BLOB produced by an
expression is reported with type ``"blob"`` and base64 (rqlite mangles it into text);
a string ``x'..'`` parameter stays text; a REAL is written as ``1.0``, not ``1``; an
infinite REAL is ``null`` (rqlite fails the whole response with HTTP 500); one statement
may not mix positional and named parameters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

import msgspec

from litecdc.db.sqltext import named_values, parse_template
from litecdc.durations import parse_go_duration
from litecdc.errors import BodyTooLargeError, RequestError, StatementError
from litecdc.results import INT64_MAX, INT64_MIN, ReadLevel, SQLValue, Statement, StatementResult

__all__ = [
    "QueryOptions",
    "decode_json_body",
    "format_results",
    "format_rows",
    "parse_options",
    "parse_statements",
]

_decoder = msgspec.json.Decoder()

# -- errors, worded as rqlite words them ------------------------------------------------

ERR_INVALID_JSON = "invalid JSON body"
ERR_INVALID_REQUEST = "invalid request"
ERR_UNSUPPORTED_TYPE = "unsupported type"
ERR_NO_STATEMENTS = "no statements"


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# -- JSON bodies -------------------------------------------------------------------------

#: a \uD800-\uDFFF escape in JSON text (half of a UTF-16 surrogate pair)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def decode_json_body(body: bytes, what: str = ERR_INVALID_JSON) -> Any:
    """Decode a JSON request body; RequestError (HTTP 400) ``"{what}: reason"`` if it does not.

    The decoder's other failures are request errors too: bytes that are not UTF-8
    (UnicodeDecodeError), nesting deeper than the interpreter's recursion limit
    (RecursionError), and an unpaired surrogate escape, which msgspec reports as
    "Input data was truncated".
    """
    try:
        return _decoder.decode(body)
    except UnicodeDecodeError as exc:  # exc.object is the string being decoded
        reason = (
            f"the body is not UTF-8 text (a string holds byte 0x{exc.object[exc.start]:02x}); "
            "send JSON encoded as UTF-8"
        )
    except RecursionError:
        reason = "arrays or objects are nested too deeply"
    except msgspec.DecodeError as exc:
        reason = _unpaired_surrogate(body) or str(exc)
    raise RequestError(f"{what}: {reason}")


def _unpaired_surrogate(body: bytes) -> str | None:
    """Why ``body`` failed if the cause is an unpaired surrogate escape, else None.

    Only called once msgspec refused ``body``. Python's json module accepts a lone
    surrogate (into a string that cannot be encoded), so if it decodes ``body`` and the
    result does not encode as UTF-8, the surrogate was the one fault.
    """
    if _SURROGATE_ESCAPE.search(body) is None:
        return None
    try:
        doc = json.loads(body, parse_constant=_refuse_constant)
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return (
            "a string holds an unpaired surrogate escape (\\ud800-\\udfff), which is not "
            "valid Unicode text; write a character beyond U+FFFF as a pair "
            "(\\ud83d\\ude00) or as UTF-8"
        )
    except (ValueError, RecursionError):
        return None
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# -- statements --------------------------------------------------------------------------


#: the most statements one request may hold. Each costs about a kilobyte of Python objects
#: between parsing and answering: 5 million "SELECT 1" (52 MB, under the body limit) took
#: a node to 6.7 GB (QA); rqlite has no such cap, but Go's objects are smaller
MAX_STATEMENTS = 100_000


def parse_statements(body: bytes, content_type: str | None = None) -> list[Statement]:
    """Parse an rqlite request body into statements; RequestError (HTTP 400) if malformed."""
    if (
        content_type is not None
        and content_type.split(";", 1)[0].strip().lower() == "text/plain"
        and not body.lstrip().startswith(b"[")
    ):
        # (a JSON array sent as text/plain — a browser's fetch() with a string body — is
        # JSON, as rqlite reads every body; no SQL statement starts with "[")
        try:
            sql = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"invalid request: the text body is not UTF-8 ({exc})") from exc
        if not sql.strip():
            raise RequestError(f"{ERR_NO_STATEMENTS}: the text body is empty")
        return [Statement(sql)]
    if not body.strip():
        raise RequestError(f"{ERR_NO_STATEMENTS}: the request body is empty")
    doc = decode_json_body(body)
    if not isinstance(doc, list):
        raise RequestError(
            f"{ERR_INVALID_REQUEST}: the body must be a JSON array of statements, "
            f"got {_json_kind(doc)}"
        )
    if not doc:
        raise RequestError(f"{ERR_NO_STATEMENTS}: the array of statements is empty")
    if len(doc) > MAX_STATEMENTS:
        raise BodyTooLargeError(
            f"request body too large: {len(doc)} statements, at most {MAX_STATEMENTS} in one "
            "request; send them in several (or a SQLite file or dump to /db/load)"
        )
    statements = [_parse_statement(i, item) for i, item in enumerate(doc, start=1)]
    # rqlite skips a statement whose SQL is "" (db.go: `if ss == "" { continue }`): it gets
    # no result entry, so `[""]` answers `{"results": []}`
    return [s for s in statements if s.sql != ""]


def _parse_statement(index: int, item: object) -> Statement:
    if isinstance(item, str):
        return Statement(item)
    if not isinstance(item, list):
        raise RequestError(
            f"{ERR_INVALID_REQUEST}: statement {index} is {_json_kind(item)}; "
            'expected an SQL string or an array ["SQL", parameters...]'
        )
    if not item:
        raise RequestError(f"{ERR_INVALID_REQUEST}: statement {index} is an empty array")
    sql = item[0]
    if not isinstance(sql, str):
        raise RequestError(
            f"{ERR_INVALID_REQUEST}: statement {index} must start with the SQL string, "
            f"got {_json_kind(sql)}"
        )
    if len(item) == 1:
        return Statement(sql)
    positional: list[SQLValue] = []
    named: dict[str, SQLValue] = {}
    for pos, value in enumerate(item[1:], start=1):
        if isinstance(value, dict):
            for key, named_value in value.items():
                if key in named:
                    # (one object already refuses a name twice: ``a`` and ``:a``)
                    raise RequestError(
                        f"{ERR_INVALID_REQUEST}: statement {index}: parameter {key!r} is "
                        "given more than one value (in two objects)"
                    )
                named[key] = _parameter(index, f"named parameter {key!r}", named_value)
        else:
            positional.append(_parameter(index, f"parameter {pos}", value))
    if positional and named:
        raise RequestError(
            f"{ERR_INVALID_REQUEST}: statement {index} mixes positional and named parameters; "
            "use one kind per statement"
        )
    # as rqlite (go-sqlite3) binds them: values past the statement's parameters are
    # ignored, and a named parameter given no value is NULL
    template = parse_template(sql)
    if named:
        try:
            # one spelling per name: a node and its replicas then bind the same value
            named = dict(named_values(named, template.names))
        except StatementError as exc:
            raise RequestError(f"{ERR_INVALID_REQUEST}: statement {index}: {exc}") from None
        given = set(named)
        for placeholder in template.placeholders:
            if placeholder.name is not None and placeholder.name not in given:
                named[placeholder.name] = None
                given.add(placeholder.name)
        return Statement(sql, named)
    return Statement(sql, tuple(positional[: max(template.positional_count, 0)]))


def _parameter(index: int, where: str, value: object) -> SQLValue:
    if value is None or isinstance(value, str | float):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return value
        return float(value)
    if isinstance(value, list):
        if all(type(b) is int and 0 <= b <= 255 for b in value):
            return bytes(value)
        raise RequestError(
            f"{ERR_UNSUPPORTED_TYPE}: statement {index} {where} is an array that is not "
            "all byte values 0-255 (an array of bytes binds as a BLOB)"
        )
    raise RequestError(
        f"{ERR_UNSUPPORTED_TYPE}: statement {index} {where} is {_json_kind(value)}; "
        "a parameter is a string, a number, a boolean, null or an array of bytes"
    )


# -- query parameters --------------------------------------------------------------------

_LEVELS: dict[str, ReadLevel] = {
    "none": "none",
    "weak": "weak",
    "strong": "strong",
    "linearizable": "linearizable",
    "auto": "auto",
}
_DURATION_PARAMS = ("timeout", "freshness", "db_timeout", "linearizable_timeout")


@dataclass(frozen=True, slots=True)
class QueryOptions:
    """rqlite's URL flags. A flag is on when its key is present, whatever its value."""

    transaction: bool = False
    timings: bool = False
    pretty: bool = False
    associative: bool = False
    blob_array: bool = False
    queue: bool = False
    raft_index: bool = False
    level: ReadLevel = "weak"
    #: litecdc: wait until this node has applied this cid before reading (read-your-writes
    #: on a follower; the cid is the raft_index a write returned)
    min_cid: int | None = None
    #: seconds a read may run (``db_timeout``); None: no limit (absent, 0 or negative)
    db_timeout: float | None = None


_INTEGER_PARAMS = ("retries", "trailing_logs")
GO_INTEGER_RE = re.compile(r"[-+]?[0-9]+")  # strconv.Atoi: no spaces, no '_'
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})(.{0,2})", re.DOTALL)


def check_query_string(query_string: str) -> None:
    """What rqlite 9 checks of every request's URL parameters before it looks at the path
    (``NewQueryParams`` in its ServeHTTP): RequestError (HTTP 400) naming the problem.

    The first value of a key counts, as in Go. Durations must parse as Go durations;
    ``retries`` and ``trailing_logs`` as integers; ``freshness_strict`` needs
    ``freshness``; a ``q`` that is there must not be empty; and the query string must
    be well formed (Go's url.ParseQuery refuses a bad %-escape).
    """
    if not query_string:
        return
    if bad := _BAD_ESCAPE_RE.search(query_string):
        raise RequestError(f'invalid URL escape "{bad.group(0)}" in the query string')
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(query_string, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as exc:
        # (Starlette's parse puts U+FFFD in their place: q=SELECT '%FF' ran another
        # statement than the one sent — QA)
        raise RequestError(
            f"invalid URL escape: the query string's escapes are not UTF-8 ({exc.reason} "
            f"at byte {exc.start})"
        ) from None
    for key, value in pairs:
        params.setdefault(key, value)
    check_params(params)


def first_values_only(query_string: bytes) -> bytes:
    """``query_string`` with only the first ``key=value`` of each key: Go's
    ``Query().Get`` (rqlite's every read of a parameter) takes the first, Starlette's the
    last (QA: ``q=SELECT 1&q=SELECT 2`` ran the second). The parts kept are as sent."""
    parts = query_string.split(b"&")
    seen: set[str] = set()
    kept = []
    for part in parts:
        if not part:
            continue
        key = unquote_plus(part.split(b"=", 1)[0].decode("utf-8", "replace"))
        if key not in seen:
            seen.add(key)
            kept.append(part)
    return b"&".join(kept) if len(kept) < len(parts) else query_string


def check_params(params: Mapping[str, str]) -> None:
    """The value checks of :func:`check_query_string`, on parsed parameters."""
    if "freshness_strict" in params and "freshness" not in params:
        raise RequestError("freshness_strict requires freshness")
    for key in _DURATION_PARAMS:
        value = params.get(key)
        if value is not None:
            _duration_seconds(key, value)
    for key in _INTEGER_PARAMS:
        value = params.get(key)
        if value is not None and not GO_INTEGER_RE.fullmatch(value):
            raise RequestError(f"{key} is not a valid integer: {value!r}")
    if params.get("q") == "":
        raise RequestError("query parameter not set: q is empty; give the SQL in it")


def parse_options(params: Mapping[str, str]) -> QueryOptions:
    """Read rqlite's flags from the URL. Unknown keys are ignored, as rqlite does.

    The values are checked first (:func:`check_params`: durations must parse as Go
    durations, else HTTP 400 with Go's message); an unknown ``level`` is weak.
    """
    check_params(params)
    return QueryOptions(
        transaction="transaction" in params,
        timings="timings" in params,
        pretty="pretty" in params,
        associative="associative" in params,
        blob_array="blob_array" in params,
        queue="queue" in params,
        raft_index="raft_index" in params,
        level=_LEVELS.get(params.get("level", "weak").lower(), "weak"),
        min_cid=min_cid_param(params.get("min_cid")),
        db_timeout=_db_timeout(params.get("db_timeout")),
    )


def _duration_seconds(key: str, value: str) -> float:
    """A URL duration in seconds; RequestError with Go's message when it does not parse
    (out of range included, as time.ParseDuration refuses it)."""
    try:
        return parse_go_duration(value) / 1e9
    except ValueError:
        raise RequestError(f'time: invalid duration "{value}" (query parameter {key})') from None


def duration_param(params: Mapping[str, str], key: str, default: float) -> float:
    """A Go-duration URL parameter in seconds, ``default`` when absent."""
    value = params.get(key)
    return default if value is None else _duration_seconds(key, value)


def _db_timeout(value: str | None) -> float | None:
    """rqlite's ``db_timeout``: a read stops with "query timeout" once it has run this long;
    0 or negative is no limit, as in rqlite (``DbTimeout > 0``)."""
    if value is None:
        return None
    seconds = _duration_seconds("db_timeout", value)
    return seconds if seconds > 0 else None


def min_cid_param(text: str | None) -> int | None:
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()):  # (isdigit alone takes "²", int() does not)
        raise RequestError(f"min_cid must be a non-negative integer, got {text!r}")
    return int(text)


# -- values ------------------------------------------------------------------------------

Converter = Callable[[Any], Any]

_TIME_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})"
    r"(?:[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?([+-]\d{2}:\d{2})?)?)?",
    re.ASCII,  # (Go's parser reads ASCII digits only: "٢٠٢٦-…" is no time to it)
)
_ZERO_TIME = "0001-01-01T00:00:00Z"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _rfc3339(base: str, nanos: int, offset: str) -> str:
    frac = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{base}{frac}{offset}"


def _time_from_text(text: str) -> str:
    """What rqlite sends for text in a date/datetime/timestamp column (go-sqlite3 parsing)."""
    m = _TIME_RE.fullmatch(text.removesuffix("Z"))
    if m is None:
        return _ZERO_TIME
    year, month, day, hour, minute, second, frac, offset = m.groups()
    try:
        datetime(
            int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0)
        )
    except ValueError:
        return _ZERO_TIME
    nanos = int((frac or "").ljust(9, "0")) if frac else 0
    base = f"{year}-{month}-{day}T{hour or '00'}:{minute or '00'}:{second or '00'}"
    if offset is None or offset in ("+00:00", "-00:00"):
        return _rfc3339(base, nanos, "Z")
    return _rfc3339(base, nanos, offset)


def _time_from_int(value: int) -> str:
    """An integer in a date column: Unix seconds, or milliseconds beyond ±1e12 (go-sqlite3)."""
    try:
        if value > 10**12 or value < -(10**12):
            moment = _EPOCH + timedelta(milliseconds=value)
        else:
            moment = _EPOCH + timedelta(seconds=value)
    except OverflowError:
        return _ZERO_TIME
    return _rfc3339(moment.strftime("%Y-%m-%dT%H:%M:%S"), moment.microsecond * 1000, "Z")


def _convert_time(value: Any) -> Any:
    if isinstance(value, str):
        return _time_from_text(value)
    if isinstance(value, int):
        return _time_from_int(value)
    return value


def _convert_boolean(value: Any) -> Any:
    if isinstance(value, int):
        return value > 0
    return value


def _blob_as_text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


# rqlite's own list (db.go isTextType), not SQLite's affinity rule: a BLOB in a column
# declared CHARACTER(10), TEXT(5) or TINYTEXT stays base64 there, one in a JSON column is text
_TEXT_TYPE_PREFIXES = (
    "varchar",
    "varying character",
    "nchar",
    "native character",
    "nvarchar",
    "clob",
)


def _is_text_type(decltype: str) -> bool:
    """Whether rqlite sends a BLOB in a column declared ``decltype`` (lower case) as text."""
    return decltype in ("text", "json") or decltype.startswith(_TEXT_TYPE_PREFIXES)


def _column_converter(decltype: str) -> Converter | None:
    if decltype in ("date", "datetime", "timestamp"):
        return _convert_time
    if decltype == "boolean":
        return _convert_boolean
    if _is_text_type(decltype):
        return _blob_as_text
    return None


_STORAGE_CLASS: dict[type, str] = {
    int: "integer",
    float: "real",
    str: "text",
    bytes: "blob",
    type(None): "",
}


def _column_types(result: StatementResult) -> list[str]:
    columns = result.columns or []
    decltypes = result.decltypes or [None] * len(columns)
    first = result.rows[0] if result.rows else None
    types: list[str] = []
    for i, decl in enumerate(decltypes):
        if decl:
            types.append(decl.lower())
        elif first is not None and i < len(first):
            types.append(_STORAGE_CLASS.get(type(first[i]), ""))
        else:
            types.append("")
    return types


def format_rows(result: StatementResult, *, blob_array: bool) -> list[list[Any]]:
    """The rows of a read as rqlite sends them (conversions by declared type, blobs)."""
    rows = result.rows or []
    decltypes = result.decltypes or []
    converters = [_column_converter(decl.lower()) if decl else None for decl in decltypes]
    has_conv = any(c is not None for c in converters)
    out: list[list[Any]] = []
    for row in rows:
        values: list[Any] = list(row)
        if has_conv:
            for i, conv in enumerate(converters):
                if conv is not None and i < len(values):
                    values[i] = conv(values[i])
        if blob_array:
            values = [list(v) if isinstance(v, bytes) else v for v in values]
        out.append(values)
    return out


def format_result(
    result: StatementResult,
    *,
    timings: bool,
    associative: bool,
    blob_array: bool,
    endpoint: str = "execute",
) -> dict[str, Any]:
    """One element of rqlite's ``results`` array, as ``endpoint`` (execute, query or
    request) answers it.

    As rqlite 8 encodes them (command/encoding/json.go): an associative read always has
    ``rows`` (``[]`` when none; on /db/query an error too), an associative /db/request
    write has ``"rows": null`` so clients can tell it from a read; an error has no
    ``time``. Unlike rqlite 8, a write that returns rows (``RETURNING``) keeps its
    ``last_insert_id``/``rows_affected`` next to them: pyrqlite reads an UPDATE's
    RETURNING rows only up to ``rows_affected`` (review QA: it got none), and a request
    text ``INSERT …; SELECT 1`` lost its write's counts.
    """
    out: dict[str, Any] = {}
    if result.error is not None:
        if associative and endpoint == "query":
            out["rows"] = []
        out["error"] = result.error
        return out
    if result.last_insert_id:
        out["last_insert_id"] = result.last_insert_id
    if result.rows_affected:
        out["rows_affected"] = result.rows_affected
    if result.columns is not None:
        types = _column_types(result)
        values = format_rows(result, blob_array=blob_array)
        columns = result.columns
        if associative:
            # rqlite fills a Go map column by column (a name given twice keeps its last
            # column's value and type) and Go writes a map's keys sorted
            order = sorted({name: i for i, name in enumerate(columns)}.items())
            if columns:
                out["types"] = {name: types[i] for name, i in order}
            out["rows"] = [{name: row[i] for name, i in order} for row in values]
        else:
            if columns:
                out["columns"] = list(columns)
                out["types"] = types
            if values:
                out["values"] = values
    elif associative and endpoint == "request":
        out["rows"] = None
    if timings and result.seconds:
        out["time"] = result.seconds
    return out


def format_results(
    results: Sequence[StatementResult],
    *,
    timings: bool = False,
    associative: bool = False,
    blob_array: bool = False,
    endpoint: str = "execute",
) -> list[dict[str, Any]]:
    return [
        format_result(
            r, timings=timings, associative=associative, blob_array=blob_array, endpoint=endpoint
        )
        for r in results
    ]
