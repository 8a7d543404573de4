"""Journal SQL text: parameters rendered as literals read back bit-for-bit."""

from __future__ import annotations

import math
import struct

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from litecdc.db.sqltext import parse_template, render, render_many, sql_literal
from litecdc.errors import StatementError

values = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
)


def _bits(value: object) -> object:
    return struct.pack("<d", value) if isinstance(value, float) else value


@settings(max_examples=500)
@given(st.lists(values, min_size=1, max_size=6))
def test_rendered_literals_read_back_exactly(params: list[object]) -> None:
    conn = apsw.Connection(":memory:")
    sql = "SELECT " + ", ".join("?" for _ in params)
    bound = conn.execute(sql, params).fetchall()[0]
    inlined = conn.execute(render(sql, params)).fetchall()[0]
    assert [type(v) for v in inlined] == [type(v) for v in bound]
    assert [_bits(v) for v in inlined] == [_bits(v) for v in bound]


def test_negative_numbers_cannot_form_a_comment() -> None:
    conn = apsw.Connection(":memory:")
    assert conn.execute(render("SELECT 5-?", (-2,))).fetchall() == [(7,)]
    assert conn.execute(render("SELECT 5-?", (-2.5,))).fetchall() == [(7.5,)]
    assert conn.execute(render("SELECT -?", (-(2**63),))).fetchall() == [(9.223372036854776e18,)]


def test_special_floats() -> None:
    conn = apsw.Connection(":memory:")
    row = conn.execute(
        render("SELECT ?, ?, ?, ?", (math.inf, -math.inf, math.nan, -0.0))
    ).fetchall()
    assert row[0][:3] == (math.inf, -math.inf, None)
    assert math.copysign(1.0, row[0][3]) == -1.0


@pytest.mark.parametrize(
    "sql", ["SELECT -?", "SELECT -(?)", "SELECT - +?", "SELECT -?*2", "SELECT ?e5", "SELECT ?"]
)
def test_a_positive_zero_stays_positive_under_a_minus(sql: str) -> None:
    """Engine QA: SQLite folds a minus before the literal 0.0 into -0.0, while the bound
    value negates to +0.0: `-?` stored 0.0 on the node and -0.0 wherever the journal was
    replayed (render and render_many alike)."""
    conn = apsw.Connection(":memory:")
    for value in (0.0, -0.0):
        bound = [_bits(v) for v in conn.execute(sql, (value,)).fetchall()[0]]
        texts = [render(sql, (value,)), *render_many(sql, [(value,), (value,)])]
        for text in texts:
            assert [_bits(v) for v in conn.execute(text).fetchall()[0]] == bound, text


def test_text_with_nul_and_quotes() -> None:
    conn = apsw.Connection(":memory:")
    text = "it's\x00here"
    assert conn.execute(render("SELECT ?", (text,))).fetchall() == [(text,)]
    assert sql_literal("a'b") == "'a''b'"


def test_placeholders_inside_quotes_and_comments_are_left_alone() -> None:
    sql = "SELECT '?', \"?\", [?], `?` -- ?\n, ? /* :x */, :x"
    template = parse_template(sql)
    assert [p.index for p in template.placeholders] == [1, 2]
    assert render(sql, (1, 2)) == "SELECT '?', \"?\", [?], `?` -- ?\n, 1 /* :x */, 2"


def test_numbered_and_named_parameters_follow_sqlite_rules() -> None:
    conn = apsw.Connection(":memory:")
    sql = "SELECT ?2, ?, :a, @a, $b, :a"
    params = (1, 2, 3, 4, 5, 6)  # ":a" and "@a" are two parameters to SQLite
    assert conn.execute(render(sql, params)).fetchall() == conn.execute(sql, params).fetchall()
    named = {"a": "x", "b": b"y"}
    sql = "SELECT :a, @b, :a"
    assert conn.execute(render(sql, named)).fetchall() == conn.execute(sql, named).fetchall()


def test_several_statements_consume_positional_values_in_turn() -> None:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(a, b)")
    sql = "INSERT INTO t VALUES(?, ?); INSERT INTO t VALUES(?2, ?1)"
    conn.execute(render(sql, (1, 2, 3, 4)))
    assert conn.execute("SELECT * FROM t").fetchall() == [(1, 2), (4, 3)]


def test_missing_values_are_errors() -> None:
    with pytest.raises(StatementError, match="not enough args to execute query: want 2 got 1"):
        render("SELECT ?, ?", (1,))
    with pytest.raises(StatementError, match="no value for parameter :b"):
        render("SELECT :a, :b", {"a": 1})


@settings(max_examples=300)
@given(st.lists(st.tuples(values, values, values), min_size=1, max_size=20))
def test_render_many_matches_render(rows: list[tuple[object, object, object]]) -> None:
    sql = "INSERT INTO t VALUES(?3, 5-?1, '%s?', ?2)  "
    assert render_many(sql, rows) == [render(sql, row).rstrip() for row in rows]  # type: ignore[arg-type]


def outcome(conn: apsw.Connection, sql: str, params: tuple[object, ...] = ()) -> object:
    try:
        return conn.execute(sql, params).fetchall()
    except apsw.SQLError as exc:
        return str(exc)  # the same error either way (a compound's ORDER BY refuses both)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a, b FROM t ORDER BY ?, b",
        "SELECT a, b FROM t ORDER BY a * 0, ? DESC",
        "SELECT a, b FROM t ORDER BY (?) LIMIT ?",
        "SELECT a, b FROM t ORDER BY +?",
        "SELECT a, b FROM t ORDER BY -?",
        "SELECT a, b FROM t ORDER BY ((?))",
        "SELECT a, b FROM t ORDER BY CASE WHEN a > 0 THEN ? END",
        "SELECT a, b FROM t ORDER BY (SELECT 1 ORDER BY 1), ?",
        "SELECT a, b FROM t WHERE a IN (SELECT a FROM t ORDER BY ?) ORDER BY ?",
        "SELECT min(a), b FROM t GROUP BY ?",
        "SELECT min(a), b FROM t GROUP BY (?)",
        "SELECT a, b FROM t UNION ALL SELECT a, b FROM t ORDER BY ?",
        "SELECT group_concat(a ORDER BY ?), 0 FROM t",
        "SELECT a, sum(a) OVER (ORDER BY ? ROWS ? PRECEDING) FROM t",
        "SELECT a, sum(a) OVER (ORDER BY a RANGE BETWEEN ? PRECEDING AND ? FOLLOWING) FROM t",
    ],
)
def test_integer_in_order_by_or_group_by_stays_a_constant(sql: str) -> None:
    """A bound integer in an ORDER BY / GROUP BY term is a constant; the same integer as
    a literal — even in parentheses or under a sign — would pick a result column."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(a, b); INSERT INTO t VALUES(1, 5), (2, 4), (3, 6)")
    count = parse_template(sql).positional_count
    for value in (1, 2, -2):
        params = (value if "-?" not in sql else -value,) + (1,) * (count - 1)
        if "PRECEDING" in sql:
            params = (2,) + (abs(value),) * (count - 1)
        rendered = render(sql, params)
        assert outcome(conn, rendered) == outcome(conn, sql, params), rendered
    assert render("SELECT a FROM t ORDER BY ? LIMIT ?", (1, 2)).endswith(
        "ORDER BY (SELECT 1) LIMIT 2"
    )
    assert render("SELECT a FROM t WHERE a = ? ORDER BY a", (1,)).endswith("a = 1 ORDER BY a")


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        # a window frame's offset inside an ORDER BY term: a constant, never (SELECT n)
        ("SELECT a, b FROM t ORDER BY sum(a) OVER (ORDER BY b ROWS ? PRECEDING), a", (1,)),
        (
            "SELECT a, b FROM t ORDER BY (SELECT sum(x) OVER "
            "(ROWS BETWEEN ? PRECEDING AND ? FOLLOWING) FROM (SELECT a AS x)), ?",
            (1, 1, 2),
        ),
        (
            "SELECT a, sum(a) OVER w FROM t WINDOW w AS (ORDER BY b GROUPS ? PRECEDING) ORDER BY ?",
            (1, 2),
        ),
        # keywords SQLite lets name columns: still inside the ORDER BY
        ("SELECT a, b FROM t AS s ORDER BY s.groups, ?", (2,)),
        ("SELECT a, b FROM t ORDER BY rows, ?", (2,)),
        ("SELECT a, b FROM t ORDER BY range + 0, ?", (2,)),
        ("SELECT a, b FROM t ORDER BY offset, ?", (2,)),
        ("SELECT a, b FROM t ORDER BY a * 0, window, ? LIMIT 5", (2,)),
    ],
)
def test_order_by_rendering_around_window_frames_and_keyword_names(
    sql: str, params: tuple[int, ...]
) -> None:
    conn = apsw.Connection(":memory:")
    conn.execute(
        'CREATE TABLE t(a, b, "groups", "rows", "range", "offset", "window");'
        "INSERT INTO t VALUES(1, 5, 0, 0, 0, 0, 0), (2, 4, 0, 0, 0, 0, 0), (3, 6, 0, 0, 0, 0, 0)"
    )
    rendered = render(sql, params)
    assert outcome(conn, rendered) == outcome(conn, sql, params), rendered
    assert not isinstance(outcome(conn, sql, params), str)  # the SQL itself is valid


def test_tcl_style_parameter_with_suffix() -> None:
    conn = apsw.Connection(":memory:")
    sql = "SELECT $a(1), $b::c"
    assert parse_template(sql).positional_count == 2
    assert conn.execute(render(sql, (5, 6))).fetchall() == conn.execute(sql, (5, 6)).fetchall()


@pytest.mark.parametrize(
    ("sql", "terminator"),
    [
        ("INSERT INTO t VALUES(1)", ";"),
        ("INSERT INTO t VALUES(1);", ""),
        ("INSERT INTO t VALUES(1) -- note", "\n;"),
        ("INSERT INTO t VALUES(1); -- note", "\n"),
        ("INSERT INTO t VALUES(1) -- note\n", "\n;"),  # the text is right-stripped first
        ("INSERT INTO t VALUES(1) /* note", " */;"),
        ("INSERT INTO t VALUES(1) /* a */", ";"),
        ("CREATE TRIGGER x AFTER INSERT ON t BEGIN SELECT 1; END", ";"),
    ],
)
def test_terminator_closes_what_the_statement_leaves_open(sql: str, terminator: str) -> None:
    assert parse_template(sql).terminator == terminator
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t(a)")
    text = sql.rstrip() + parse_template(sql).terminator + "\nINSERT INTO t VALUES(2);"
    if "TRIGGER" not in sql:
        conn.execute(text)
        assert conn.execute("SELECT a FROM t").fetchall() == [(1,), (2,)]


@settings(max_examples=300)
@given(st.text(alphabet="?:@$abc1(), ;'\"-/*\n", max_size=40))
def test_parameter_count_matches_sqlite(sql: str) -> None:
    conn = apsw.Connection(":memory:")
    seen: list[int] = []

    def count(cursor: apsw.Cursor, text: str, bindings: object) -> bool:
        seen.append(cursor.bindings_count)
        return False

    cursor = conn.cursor()
    cursor.exec_trace = count
    try:
        cursor.execute(sql.split(";")[0] if ";" in sql else sql, None)
    except apsw.ExecTraceAbort:
        pass
    except (apsw.Error, apsw.BindingsError):
        return
    if seen:
        assert parse_template(sql.split(";")[0] if ";" in sql else sql).positional_count == seen[0]


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT 5 WHERE ?AND 1", (1,)),  # 1AND: an unknown token
        ("SELECT 5 LIMIT?OFFSET?", (0, 0)),  # LIMIT0OFFSET0: an alias, 5 is read
        ("SELECT ?e5", (2,)),  # 2e5 = 200000.0; SQLite reads ? then the alias e5
        ("SELECT ?x10", (0,)),  # 0x10 = 16
        ("SELECT ?_000", (7,)),  # 7_000 = 7000
        ("SELECT ?'a'", ("x",)),  # 'x''a' = x'a
        ('SELECT ?"a"', (X := b"\x01",)),
        ("SELECT -?", (-5,)),  # --5: a comment
    ],
)
def test_literals_never_fuse_with_the_text_around_them(sql: str, params: tuple[object]) -> None:
    """QA: parameters were pasted into the journal without a separating space, so a
    replica read another statement or other values (or the whole entry failed)."""
    conn = apsw.Connection(":memory:")
    assert conn.execute(render(sql, params)).fetchall() == conn.execute(sql, params).fetchall()
    assert render_many(sql, [params]) == [render(sql, params).rstrip()]


@pytest.mark.parametrize(
    ("sql", "name"),
    [
        ("SELECT #a", "a"),
        ("SELECT :a::b", "a::b"),
        ("SELECT @x(y)", "x(y)"),
        ("SELECT :a(b)", "a(b)"),
        ("SELECT $a::b(c d)", None),  # SQLite: an illegal token (space in the suffix)
        ("SELECT $::a", "::a"),
    ],
)
def test_named_parameters_are_read_as_sqlite_reads_them(sql: str, name: str | None) -> None:
    """QA: '#a', ':a::b', '@x(y)' and ':a(b)' were cut short (or missed): the journal held
    'NULL:NULL' or an unbound '#a' and the entry was recorded empty on replay."""
    conn = apsw.Connection(":memory:")
    if name is None:
        with pytest.raises(apsw.SQLError):
            conn.execute(sql, {})
        return
    template = parse_template(sql)
    assert [p.name for p in template.placeholders] == [name]
    assert conn.execute(sql, {name: 42}).fetchall() == [(42,)]
    assert conn.execute(render(sql, {name: 42})).fetchall() == [(42,)]


def test_a_name_given_twice_is_an_error_not_a_guess() -> None:
    """QA: {'a': 21, ':a': 22} stored 22 on a standalone node, 21 in a cluster."""
    with pytest.raises(StatementError, match="'a' is given more than one value"):
        render("SELECT :a", {"a": 21, ":a": 22})
    assert render("SELECT :a + @b + $c + #d", {":a": 1, "@b": 2, "c": 3, "#d": 4}) == (
        "SELECT 1 + 2 + 3 + 4"
    )


@settings(max_examples=500, deadline=None)
@given(
    st.text(alphabet="?:@$#aex_019.()'\" ,+-*", min_size=1, max_size=24),
    st.lists(values, min_size=8, max_size=8),
)
def test_rendered_text_reads_what_the_bound_statement_reads(sql: str, pool: list[object]) -> None:
    """Whatever SQL SQLite accepts with bound parameters, the rendered text gives the
    same values (not names: SQLite names a result column after its expression's text)."""
    conn = apsw.Connection(":memory:")
    sql = "SELECT " + sql
    try:
        cursor = conn.cursor()
        cursor.exec_trace = lambda *_: False
        cursor.execute(sql, None)
    except apsw.ExecTraceAbort:
        pass
    except (apsw.Error, apsw.BindingsError):
        return
    names = cursor.bindings_names
    assert len(names) == parse_template(sql).positional_count
    if len(names) > len(pool):
        return
    if any(names):
        if not all(names):
            return  # mixed ? and :name: APSW binds only one kind
        params: object = {n[1:]: pool[i] for i, n in enumerate(names) if n}
    else:
        params = tuple(pool[: len(names)])
    try:
        bound = conn.execute(sql, params).fetchall()
    except apsw.Error:
        return
    assert [tuple(map(_bits, r)) for r in conn.execute(render(sql, params)).fetchall()] == [
        tuple(map(_bits, r)) for r in bound
    ]


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le", "UTF-16be"])
def test_text_with_nul_reads_back_in_any_database_encoding(encoding: str) -> None:
    """QA: CAST(X'<utf-8>' AS TEXT) is read in the database's encoding: a UTF-16 file (one
    adopted with /db/load or --join) stored 'ab\\0cd' as two other characters."""
    conn = apsw.Connection(":memory:")
    conn.execute(f"PRAGMA encoding='{encoding}'")
    value = "a'b\x00c\x00\x00é"
    conn.execute("CREATE TABLE t(v)")
    conn.execute(render("INSERT INTO t VALUES(?)", (value,)))
    conn.execute("INSERT INTO t VALUES(?)", (value,))
    assert conn.execute("SELECT v, typeof(v) FROM t").fetchall() == [(value, "text")] * 2
