"""rqlite wire format: request parsing, URL flags and result bodies (no server)."""

from __future__ import annotations

import pytest

from litecdc.errors import RequestError
from litecdc.http.rqlite import format_results, parse_options, parse_statements
from litecdc.results import Statement, StatementResult


def test_simple_parameterized_and_named_statements() -> None:
    body = (
        b'["CREATE TABLE t (a)", ["INSERT INTO t VALUES(?, ?)", 1, "x"],'
        b' ["INSERT INTO t VALUES(:a)", {"a": 2.5}], ["SELECT 1"]]'
    )
    assert parse_statements(body) == [
        Statement("CREATE TABLE t (a)"),
        Statement("INSERT INTO t VALUES(?, ?)", (1, "x")),
        Statement("INSERT INTO t VALUES(:a)", {"a": 2.5}),
        Statement("SELECT 1"),
    ]


def test_parameter_conversions() -> None:
    body = (
        b'[["SELECT ?,?,?,?,?,?,?", true, false, null, [0, 255], 9223372036854775807, '
        b"9223372036854775808, 1.0]]"
    )
    (stmt,) = parse_statements(body)
    assert stmt.params == (1, 0, None, b"\x00\xff", 2**63 - 1, float(2**63), 1.0)
    assert type(stmt.params[-1]) is float  # type: ignore[index]


def test_two_objects_merge_into_one_set_of_named_parameters() -> None:
    (stmt,) = parse_statements(b'[["S :a :b", {"a": 1}, {"b": 2}]]')
    assert stmt.params == {"a": 1, "b": 2}
    # a name in both is as ambiguous as ``a`` and ``:a`` in one (fuzz QA: the last won)
    with pytest.raises(RequestError, match="'a' is given more than one value"):
        parse_statements(b'[["S :a", {"a": 1}, {"a": 2}]]')


def test_text_plain_body_is_one_statement() -> None:
    assert parse_statements(b"SELECT 1; SELECT 2", "text/plain; charset=utf-8") == [
        Statement("SELECT 1; SELECT 2")
    ]


def test_a_json_array_sent_as_text_plain_is_json() -> None:
    """rqlite parses every body as JSON; a browser's fetch() with a string body says
    text/plain;charset=UTF-8 (litecdc ran '["SELECT 1"]' as SQL: a syntax error)."""
    for content_type in ("text/plain;charset=UTF-8", "text/plain"):
        assert parse_statements(b' ["SELECT 1", ["SELECT ?", 2]]', content_type) == [
            Statement("SELECT 1"),
            Statement("SELECT ?", (2,)),
        ]


def test_empty_statements_get_no_result_entry_as_in_rqlite() -> None:
    """rqlite's db.go skips a statement whose SQL is "" (no result entry): a client
    matching results to statements by position was off by one."""
    assert parse_statements(b'["", "SELECT 1", "   ", ["", 1]]') == [
        Statement("SELECT 1"),
        Statement("   "),
    ]
    assert parse_statements(b'[""]') == []


def test_parameters_bind_as_rqlite_binds_them() -> None:
    """go-sqlite3 (rqlite) ignores values past the statement's parameters and binds NULL
    for a named parameter given no value; litecdc failed both statements."""
    (extra, none, named, prefixed, two) = parse_statements(
        b'[["SELECT ?", 1, 2], ["SELECT 1", 5], ["SELECT :a, :b", {"b": 1}],'
        b' ["SELECT :a", {":a": 3}], ["SELECT ?; SELECT ?", 1, 2, 3]]'
    )
    assert extra == Statement("SELECT ?", (1,))
    assert none == Statement("SELECT 1", ())
    assert named == Statement("SELECT :a, :b", {"b": 1, "a": None})
    # a prefixed name is the name: the node and a cluster's render bind it alike (QA: a
    # cluster answered 400 'no value for parameter :a')
    assert prefixed == Statement("SELECT :a", {"a": 3})
    assert two == Statement("SELECT ?; SELECT ?", (1, 2))
    with pytest.raises(RequestError, match="statement 1: parameter 'a' is given more than one"):
        parse_statements(b'[["SELECT :a", {"a": 21, ":a": 22}]]')


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[", "invalid JSON body: "),
        (b"{}", "invalid request: the body must be a JSON array of statements, got an object"),
        (
            b'"SELECT 1"',
            "invalid request: the body must be a JSON array of statements, got a string",
        ),
        (b"[1]", "invalid request: statement 1 is a number;"),
        (b'["a", {"sql": "b"}]', "invalid request: statement 2 is an object;"),
        (b"[[]]", "invalid request: statement 1 is an empty array"),
        (b"[[null]]", "invalid request: statement 1 must start with the SQL string, got null"),
        (b"[]", "no statements: the array of statements is empty"),
        (b"  ", "no statements: the request body is empty"),
        (b'[["S", [1, "a"]]]', "unsupported type: statement 1 parameter 1 is an array"),
        (b'[["S", [256]]]', "unsupported type: statement 1 parameter 1 is an array"),
        (b'[["S", {"a": [true]}]]', "unsupported type: statement 1 named parameter 'a'"),
        (
            b'[["S", {"a": {"b": 1}}]]',
            "unsupported type: statement 1 named parameter 'a' is an object",
        ),
        (b'[["S", 1, {"a": 1}]]', "invalid request: statement 1 mixes positional and named"),
    ],
)
def test_malformed_bodies(body: bytes, message: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_statements(body)
    assert str(info.value).startswith(message)
    assert info.value.http_status == 400


DEEP = b"[" * 100_000 + b"]" * 100_000
UNPAIRED = "invalid JSON body: a string holds an unpaired surrogate escape"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            b"[\"INSERT INTO foo(name) VALUES('\xff')\"]",
            "invalid JSON body: the body is not UTF-8 text (a string holds byte 0xff)",
        ),
        (b'["\xed\xa0\x80"]', "invalid JSON body: the body is not UTF-8 text"),  # CESU-8
        (DEEP, "invalid JSON body: arrays or objects are nested too deeply"),
        (b'[{"a":' * 5000 + b"1" + b"}]" * 5000, "invalid JSON body: arrays or objects are"),
        (b'["SELECT \\ud800"]', UNPAIRED),  # msgspec: "Input data was truncated"
        (b'["SELECT \\ud800x"]', UNPAIRED),
        (b'["SELECT \\udc00"]', UNPAIRED),
        (b'[["S", {"\\ud83d": 1}]]', UNPAIRED),
        (b'["SELECT \\ud800', "invalid JSON body: Input data was truncated"),  # it is
        (b'["SELECT \\ud83d\\ude00", NaN]', "invalid JSON body: JSON is malformed"),
    ],
)
def test_bodies_that_do_not_decode_are_invalid_json(body: bytes, message: str) -> None:
    """Decoder failures other than syntax errors (UnicodeDecodeError, RecursionError, and
    msgspec's "Input data was truncated" for a lone surrogate) are clear 400s too."""
    with pytest.raises(RequestError) as info:
        parse_statements(body)
    assert str(info.value).startswith(message), str(info.value)
    assert info.value.http_status == 400


def test_escaped_backslash_and_surrogate_pairs_are_valid_text() -> None:
    assert parse_statements(b"[\"SELECT '\\\\ud800'\", \"SELECT '\\ud83d\\ude00'\"]") == [
        Statement("SELECT '\\ud800'"),
        Statement("SELECT '\U0001f600'"),
    ]


def test_options_are_flags_by_presence() -> None:
    opts = parse_options({"transaction": "false", "timings": "", "level": "LINEARIZABLE"})
    assert opts.transaction and opts.timings and not opts.pretty
    assert opts.level == "linearizable"
    assert parse_options({"level": "bogus"}).level == "weak"
    assert parse_options({}).level == "weak"


@pytest.mark.parametrize("value", ["1s", "1.5h", "2m3s", "300ms", "0", "10us", "-1s"])
def test_valid_durations(value: str) -> None:
    parse_options({"timeout": value, "freshness": value, "db_timeout": value})


@pytest.mark.parametrize("value", ["", "1", "s", "1x", "soon", "1 s", "9999999999999h", "."])
def test_invalid_durations(value: str) -> None:
    # (an out-of-range duration passed the old pattern check; Go refuses it)
    with pytest.raises(RequestError, match=rf'^time: invalid duration "{value}"'):
        parse_options({"freshness": value})


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("500ms", 0.5), ("1m30s", 90.0), ("1.5s", 1.5), ("0", None), ("-2s", None), (None, None)],
)
def test_db_timeout_in_seconds_zero_or_negative_is_no_limit(
    value: str | None, seconds: float | None
) -> None:
    params = {} if value is None else {"db_timeout": value}
    assert parse_options(params).db_timeout == seconds


def _read(
    columns: list[str], decltypes: list[str | None], rows: list[tuple[object, ...]]
) -> StatementResult:
    return StatementResult(columns=columns, decltypes=decltypes, rows=rows)  # type: ignore[arg-type]


def test_write_results_omit_zero_fields() -> None:
    results = [
        StatementResult(last_insert_id=0, rows_affected=0, seconds=0.5),
        StatementResult(last_insert_id=3, rows_affected=2, seconds=0.25),
        StatementResult(error="boom", seconds=0.1),
    ]
    assert format_results(results) == [
        {},
        {"last_insert_id": 3, "rows_affected": 2},
        {"error": "boom"},
    ]
    assert format_results(results, timings=True) == [
        {"time": 0.5},
        {"last_insert_id": 3, "rows_affected": 2, "time": 0.25},
        {"error": "boom"},  # rqlite times only what ran: an error has no time
    ]


def test_types_from_declaration_or_first_row() -> None:
    r = _read(
        ["a", "b", "c", "d", "e", "f"],
        ["INTEGER", "VarChar(10)", None, None, None, None],
        [(1, "x", 2.5, None, b"\x01", "t"), (2, "y", 3, 4, None, None)],
    )
    assert format_results([r]) == [
        {
            "columns": ["a", "b", "c", "d", "e", "f"],
            "types": ["integer", "varchar(10)", "real", "", "blob", "text"],
            "values": [[1, "x", 2.5, None, b"\x01", "t"], [2, "y", 3, 4, None, None]],
        }
    ]


def test_no_rows_omits_values_and_associative_sorts_keys() -> None:
    empty = _read(["b", "a"], ["TEXT", None], [])
    assert format_results([empty]) == [{"columns": ["b", "a"], "types": ["text", ""]}]
    # rqlite's AssociativeRows.rows has no omitempty: no rows is [] (command/encoding/json.go)
    assert format_results([empty], associative=True) == [
        {"types": {"a": "", "b": "text"}, "rows": []}
    ]
    rows = _read(["b", "a"], ["TEXT", "INT"], [("x", 1)])
    (assoc,) = format_results([rows], associative=True)
    assert assoc == {"types": {"a": "int", "b": "text"}, "rows": [{"a": 1, "b": "x"}]}
    assert list(assoc["rows"][0]) == ["a", "b"]


def test_associative_with_a_name_given_twice_keeps_the_last_column_as_rqlite() -> None:
    """Fuzz QA: a join's two ``id`` columns made the sort compare values (a 500 for None
    against text, after a /db/request write had committed) or kept the largest value.
    rqlite fills its map column by column: the last column of a name wins, type too."""
    joined = _read(
        ["id", "name", "id", "name"], ["INTEGER", "TEXT", "INT", "TEXT"], [(1, "ann", 10, None)]
    )
    (out,) = format_results([joined], associative=True, endpoint="request")
    assert out == {"types": {"id": "int", "name": "text"}, "rows": [{"id": 10, "name": None}]}
    mixed = _read(["a", "a"], ["INTEGER", "REAL"], [(3, 2.5), (b"x", "t")])
    (out,) = format_results([mixed], associative=True, endpoint="query")
    assert out == {"types": {"a": "real"}, "rows": [{"a": 2.5}, {"a": "t"}]}


def test_blobs_booleans_and_times_as_rqlite_sends_them() -> None:
    r = _read(
        ["blob", "txt", "flag", "d", "dt", "ts"],
        ["BLOB", "TEXT", "BOOLEAN", "DATE", "DATETIME", "TIMESTAMP"],
        [
            (
                b"hi",
                b"text\xff",
                2,
                "2026-09-30",
                "2026-09-30 12:34:56.789",
                "2026-09-30T12:34:56+05:30",
            ),
            (None, "t", 0, "garbage", 1727699696, 1727699696789),
            (b"", None, 1.5, 2.5, "2026-09-30 12:34", "2026-09-30T12:34:56.000000000Z"),
            # digits other than ASCII's are no time to Go's parser (fuzz QA)
            (None, None, None, "٢٠٢٦-٠٩-٣٠", "2026-09-30 ١٢:34", "2026-09-30T12:34:56"),
        ],
    )
    (out,) = format_results([r])
    assert out["values"] == [
        [
            b"hi",
            "text\ufffd",
            True,
            "2026-09-30T00:00:00Z",
            "2026-09-30T12:34:56.789Z",
            "2026-09-30T12:34:56+05:30",
        ],
        [
            None,
            "t",
            False,
            "0001-01-01T00:00:00Z",
            "2024-09-30T12:34:56Z",
            "2024-09-30T12:34:56.789Z",
        ],
        [b"", None, 1.5, 2.5, "2026-09-30T12:34:00Z", "2026-09-30T12:34:56Z"],
        [None, None, None, "0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z", "2026-09-30T12:34:56Z"],
    ]
    (arrays,) = format_results([r], blob_array=True)
    assert arrays["values"][0][0] == [104, 105]
    assert arrays["values"][2][0] == []


def test_associative_answers_as_rqlite_8_encodes_them() -> None:
    """command/encoding/json.go: a /db/request write carries "rows": null (so clients tell
    it from a read), a /db/query error "rows": [], a /db/request error only its error."""
    write = StatementResult(last_insert_id=2, rows_affected=1)
    error = StatementResult(error="no such table: nosuch", seconds=0.1)
    read = _read(["a"], ["INT"], [])
    assert format_results([write, read, error], associative=True, endpoint="request") == [
        {"last_insert_id": 2, "rows_affected": 1, "rows": None},
        {"types": {"a": "int"}, "rows": []},
        {"error": "no such table: nosuch"},
    ]
    assert format_results([read, error], associative=True, endpoint="query") == [
        {"types": {"a": "int"}, "rows": []},
        {"rows": [], "error": "no such table: nosuch"},
    ]
    # /db/execute answers writes as ExecuteResults: associative changes nothing there
    assert format_results([write], associative=True) == [{"last_insert_id": 2, "rows_affected": 1}]
    # without associative nothing changes
    assert format_results([write, error], endpoint="request") == [
        {"last_insert_id": 2, "rows_affected": 1},
        {"error": "no such table: nosuch"},
    ]


def test_a_write_returning_rows_keeps_its_counts() -> None:
    """rqlite 8 answers ``… RETURNING`` as a query (rows only); pyrqlite then returns no
    rows for an UPDATE … RETURNING (it reads up to rows_affected): litecdc keeps both."""
    returning = StatementResult(
        last_insert_id=7,
        rows_affected=1,
        columns=["id"],
        decltypes=["INTEGER"],
        rows=[(7,)],
        seconds=0.5,
    )
    counts = {"last_insert_id": 7, "rows_affected": 1}
    assert format_results([returning], timings=True) == [
        {**counts, "columns": ["id"], "types": ["integer"], "values": [[7]], "time": 0.5}
    ]
    assert format_results([returning], associative=True, endpoint="request") == [
        {**counts, "types": {"id": "integer"}, "rows": [{"id": 7}]}
    ]


def test_blobs_are_text_in_rqlites_text_types_only() -> None:
    """rqlite's db.go isTextType, not SQLite's affinity: a BLOB is text in TEXT, JSON,
    VARCHAR…, NCHAR…, NVARCHAR…, CLOB… columns, base64 in CHARACTER(10), TEXT(5), TINYTEXT."""
    decls = ["TEXT", "JSON", "VarChar(3)", "NCHAR(2)", "nvarchar", "CLOB", "native character"]
    decls += ["varying character(4)", "CHARACTER(10)", "TEXT(5)", "TINYTEXT", "BLOB", "INT"]
    r = _read([f"c{i}" for i in range(len(decls))], decls, [tuple(b"hi" for _ in decls)])
    (out,) = format_results([r])
    assert out["values"] == [["hi"] * 8 + [b"hi"] * 5]
