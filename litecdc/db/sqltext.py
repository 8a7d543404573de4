"""Render a statement and its bound parameters as self-contained SQL text.

The journal keeps each transaction as SQL text that a replica (or plain
``sqlite3``) can re-execute alone, so every bound parameter is written as a
literal that SQLite reads back as exactly the same value:

* integers as decimal digits, floats as Python's shortest round-trip ``repr``
  (SQLite parses it back to the same 64-bit pattern; verified by a property
  test), ±infinity as ``±9e999``, NaN as NULL (SQLite binds NaN as NULL);
* text as a quoted literal, or quoted literals joined by ``||char(0)||`` when it
  holds a NUL character (a NUL would end the literal);
* blobs as ``X'…'``; None as ``NULL``.

Negative numbers are parenthesised so that ``5-?`` never becomes a ``--`` comment.

Placeholders follow SQLite's numbering rules (``?`` takes the largest index so far
plus one, ``?NNN`` its number, a named parameter the next index on its first use)
and, like APSW, a SQL string holding several statements consumes a positional
binding sequence statement by statement.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from litecdc.errors import StatementError
from litecdc.results import Params, SQLValue


@dataclass(frozen=True, slots=True)
class Placeholder:
    #: 1-based index within the whole SQL string's binding sequence (offsets applied).
    index: int
    #: name without its prefix character, or None for ``?``/``?NNN``.
    name: str | None
    #: inside an ORDER BY / GROUP BY term, where SQLite reads an integer literal — also
    #: ``(2)``, ``+2`` or ``-(-2)`` — as a column number (a bound integer is a constant),
    #: so integers render as (SELECT n)
    term: bool = False


@dataclass(frozen=True, slots=True)
class Template:
    """SQL text cut at its placeholders: ``parts[0] p0 parts[1] p1 … parts[n]``."""

    parts: tuple[str, ...]
    placeholders: tuple[Placeholder, ...]
    #: how many positional bindings the whole string consumes
    positional_count: int
    #: 0-based index into a positional binding sequence, per placeholder
    positions: tuple[int, ...]
    #: how many SQL statements the string holds (by its semicolons)
    statements: int
    #: what to append to the right-stripped text so that it ends its last statement and
    #: nothing it leaves open (a ``--`` or ``/*`` comment) can swallow the next one
    terminator: str = ";"
    #: the first word of each statement, in capitals (``("SELECT", "VACUUM")``)
    leading_words: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        """The names of the named parameters (without their prefix)."""
        return frozenset(p.name for p in self.placeholders if p.name is not None)


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$" or ord(ch) >= 0x80


#: characters next to which a literal needs no space: anything else (a letter, a digit,
#: a quote, a dot) could fuse with it into another token — ``id=?AND`` with 1 would read
#: ``1AND``, ``?e5`` with 2 ``2e5``, ``?'a'`` with 'x' ``'x''a'`` (QA)
_SEPARATING = frozenset(" \t\n\r\f\v(),;+-*/%<>=!|&~")


def _variable_end(sql: str, i: int) -> int:
    """Where the named parameter starting at ``sql[i]`` (``:``, ``@``, ``$`` or ``#``)
    ends, as SQLite's tokenizer reads it: name characters, ``::`` pairs and one
    Tcl-style ``(suffix)`` after the name; ``i`` when it is no parameter (no name)."""
    n, j, named = len(sql), i + 1, 0
    while j < n:
        ch = sql[j]
        if _is_ident_char(ch):
            named += 1
        elif ch == "(" and named:
            j += 1
            while j < n and not sql[j].isspace() and sql[j] != ")":
                j += 1
            if j < n and sql[j] == ")":
                j += 1
            else:
                return i  # SQLite: an illegal token
            break
        elif ch == ":" and sql.startswith("::", j):
            j += 1
        else:
            break
        j += 1
    return j if named else i


#: keywords after which an ORDER BY / GROUP BY clause is over
_CLAUSE_ENDS = frozenset(
    {
        "LIMIT",
        "OFFSET",
        "HAVING",
        "WINDOW",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "SELECT",
        "FROM",
        "WHERE",
        "ON",
        "RETURNING",
        "VALUES",
        "SET",
        "DO",
    }
)
#: keywords that start a window's frame (inside OVER (…) or WINDOW w AS (…)), whose
#: offsets must be constants — a (SELECT n) there is refused — and are not column numbers
_FRAME_STARTS = frozenset({"ROWS", "RANGE", "GROUPS"})
#: tokens after which a word is a name, not a keyword (``s.rows``, ``ORDER BY offset``,
#: ``a, groups``, ``x + range``): SQLite lets most keywords above name columns
_NAME_POSITIONS = frozenset({".", ",", "BY", "op"})
_OPERATOR_CHARS = frozenset("+-*/%<>=!|&~")


@lru_cache(maxsize=4096)
def parse_template(sql: str) -> Template:
    """Find every parameter in ``sql``, skipping quotes, identifiers and comments."""
    parts: list[str] = []
    placeholders: list[Placeholder] = []
    i, start, n = 0, 0, len(sql)
    stripped = len(sql.rstrip())
    offset = 0  # bindings consumed by earlier statements in this string
    max_index = 0  # largest index in the current statement
    names: dict[str, int] = {}
    statements, last_end = 0, 0
    depth = 0  # parentheses
    # the clauses we are in, innermost last: ("by", depth) an ORDER BY / GROUP BY,
    # ("frame", depth) a window's frame (which may sit inside an ORDER BY term)
    contexts: list[tuple[str, int]] = []
    window_specs: set[int] = set()  # depths of parentheses holding a window definition
    window_clauses: set[int] = set()  # depths where a WINDOW clause was seen
    # last significant token: a word in capitals, ",", ".", ";", "op" (an operator) or "x"
    previous = ""
    word = ""  # last word, for "ORDER BY"
    open_comment = ""  # a comment still open at the end: "--" or "/*"
    leading_words: list[str] = []
    pad_next = False  # the text after the last placeholder must start with a space
    while i < n:
        ch = sql[i]
        if ch in "'\"`":
            end = i + 1
            while True:
                end = sql.find(ch, end)
                if end == -1:
                    end = n
                    break
                if end + 1 < n and sql[end + 1] == ch:  # doubled quote
                    end += 2
                    continue
                break
            i = end + 1
            previous = word = "x"
        elif ch == "[":
            end = sql.find("]", i + 1)
            i = n if end == -1 else end + 1
            previous = word = "x"
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            if end == -1 or end >= stripped:
                open_comment = "--"
            i = n if end == -1 else end + 1
        elif ch == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end == -1:
                open_comment = "/*"
            i = n if end == -1 else end + 2
        elif ch == ";":
            offset += max_index
            max_index = 0
            names = {}
            if sql[last_end:i].strip():
                statements += 1
            i += 1
            last_end = i
            depth, previous, word = 0, ";", ""
            contexts.clear()
            window_specs.clear()
            window_clauses.clear()
        elif ch == "?" or (ch in ":@$#" and _variable_end(sql, i) > i):
            j = i + 1
            if ch == "?":
                while j < n and sql[j].isdigit():
                    j += 1
                index = int(sql[i + 1 : j]) if j > i + 1 else max_index + 1
                max_index = max(max_index, index)
                name = None
            else:
                j = _variable_end(sql, i)
                token = sql[i:j]  # SQLite tells ":a" and "@a" apart; APSW binds both from "a"
                if token not in names:
                    max_index += 1
                    names[token] = max_index
                index = names[token]
                name = token[1:]
            # anywhere in an ORDER BY / GROUP BY term, nested expressions included
            term = bool(contexts) and contexts[-1][0] == "by"
            before = sql[start:i]
            if pad_next:
                before = " " + before
            if i and sql[i - 1] not in _SEPARATING:
                before += " "
            parts.append(before)
            pad_next = j < n and sql[j] not in _SEPARATING
            placeholders.append(Placeholder(offset + index, name, term))
            i = start = j
            previous = word = "x"
        elif ch.isalpha() or ch == "_":
            j = i + 1
            while j < n and _is_ident_char(sql[j]):
                j += 1
            current = sql[i:j].upper()
            if previous in ("", ";"):
                leading_words.append(current)
            keyword = previous not in _NAME_POSITIONS
            if current == "BY" and word in ("ORDER", "GROUP"):
                contexts.append(("by", depth))
            elif keyword and current in _FRAME_STARTS and depth in window_specs:
                while contexts and contexts[-1][1] == depth:
                    contexts.pop()  # the window's ORDER BY ends where its frame starts
                contexts.append(("frame", depth))
            elif keyword and current in _CLAUSE_ENDS:
                if contexts and contexts[-1] == ("by", depth):
                    contexts.pop()
                if current == "WINDOW":
                    window_clauses.add(depth)
            previous = word = current
            i = j
        elif ch.isspace():
            i += 1
        else:
            if ch == "(":
                depth += 1
                if word == "OVER" or (word == "AS" and depth - 1 in window_clauses):
                    window_specs.add(depth)
            elif ch == ")":
                depth -= 1
                while contexts and contexts[-1][1] > depth:
                    contexts.pop()
                window_specs.discard(depth + 1)
                window_clauses.discard(depth + 1)
            previous = word = ch if ch in ",." else "op" if ch in _OPERATOR_CHARS else "x"
            i += 1
    parts.append((" " if pad_next else "") + sql[start:])
    needs_semicolon = previous not in (";", "")
    if open_comment == "/*":
        terminator = " */" + (";" if needs_semicolon else "")
    elif open_comment == "--":
        terminator = "\n" + (";" if needs_semicolon else "")
    else:
        terminator = ";" if needs_semicolon else ""
    return Template(
        tuple(parts),
        tuple(placeholders),
        offset + max_index,
        tuple(p.index - 1 for p in placeholders),
        statements + (1 if sql[last_end:].strip() else 0),
        terminator,
        tuple(leading_words),
    )


#: the characters a named parameter starts with in SQL; a value's name may carry it too
NAMED_PREFIXES = ":@$#"


def named_values(params: Mapping[str, Any], names: Collection[str]) -> Mapping[str, Any]:
    """Named values keyed by the names of the statement's parameters (``names``, as
    ``Placeholder.name``): a key may also carry the parameter's prefix (``:a``, ``@a``,
    ``$a`` or ``#a`` for the name ``a``), as rqlite's clients send them. StatementError
    when one name is given twice (``a`` and ``:a``): which value wins would be a guess,
    and would differ between the node and its replicas (QA)."""
    if all(key in names for key in params):
        return params
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = key
        if key not in names and key[:1] in NAMED_PREFIXES and key[1:] in names:
            name = key[1:]
        if name in out:
            raise StatementError(
                f"parameter {name!r} is given more than one value (as {key!r} and another "
                "spelling of the name): give it once"
            )
        out[name] = value
    return out


def _int_literal(value: int) -> str:
    return str(int(value)) if value >= 0 else f"({int(value)})"


def _text_literal(text: str) -> str:
    if "\x00" in text:
        # the text with a stand-in for each NUL, put back by one replace(): SQLite builds
        # the same value in any database encoding (QA: CAST(X'…' AS TEXT) reads the bytes
        # in the database's, UTF-16 too), and the expression is as shallow for a thousand
        # NULs as for one (scale QA: text around each char(0) joined by || was as deep as
        # the NULs were many; SQLite refuses an expression over 1000 deep, so the entry
        # could not be replayed, a follower skipped it, and a backup did not load)
        stand_in = _absent_character(text)
        if stand_in is not None:
            quoted = text.replace("\x00", stand_in).replace("'", "''")
            return f"replace('{quoted}','{stand_in}',char(0))"
        parts = ("'" + p.replace("'", "''") + "'" for p in text.split("\x00"))
        return "(" + "||char(0)||".join(parts) + ")"  # (a text holding every one of them)
    return "'" + text.replace("'", "''") + "'"


def _absent_character(text: str) -> str | None:
    """A private-use character ``text`` does not hold, if any."""
    present = set(text)
    for code in itertools.chain(range(0xE000, 0xF900), range(0xF0000, 0x110000)):
        if chr(code) not in present:
            return chr(code)
    return None


#: +0.0 as SQL text: SQLite folds a minus before the literal 0.0 into -0.0, while the
#: bound value negates to +0.0 (0 - x) — `-?` stored 0.0 on the node, -0.0 on replay
#: (engine QA); an expression is negated at run time, as the bound value was
POSITIVE_ZERO = "(0.0+0)"


def _float_literal(number: float) -> str:
    if number != number:  # NaN
        return "NULL"
    if math.isinf(number):
        return "9e999" if number > 0 else "(-9e999)"
    text = repr(number)
    if text == "0.0":
        return POSITIVE_ZERO
    return f"({text})" if text.startswith("-") else text  # -0.0 too


def _blob_literal(value: bytes | bytearray | memoryview) -> str:
    return f"X'{bytes(value).hex()}'"


#: exact-type dispatch for the common cases (the hot path of bulk writes)
_LITERALS: dict[type, Callable[[Any], str]] = {
    int: _int_literal,
    bool: _int_literal,
    str: _text_literal,
    float: _float_literal,
    bytes: _blob_literal,
    type(None): lambda _: "NULL",
}


def sql_literal(value: SQLValue) -> str:
    """One value as an SQL literal that SQLite reads back as exactly ``value``."""
    fast = _LITERALS.get(type(value))
    if fast is not None:
        return fast(value)
    # subclasses of the basic types, and the other buffer types APSW binds as blobs
    if isinstance(value, int):
        return _int_literal(value)
    if isinstance(value, float):
        return _float_literal(value)
    if isinstance(value, str):
        return _text_literal(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _blob_literal(value)
    raise StatementError(f"unsupported parameter type {type(value).__name__}")


def _term_literal(value: SQLValue) -> str:
    """A literal for a whole ORDER BY / GROUP BY term: integers as a constant expression."""
    if isinstance(value, int):
        return f"(SELECT {int(value)})"
    return sql_literal(value)


def render(sql: str, params: Params) -> str:
    """``sql`` with every placeholder replaced by the literal of its bound value."""
    template = parse_template(sql)
    if not template.placeholders:
        return sql
    if isinstance(params, Mapping):
        params = named_values(params, template.names)
        literals = []
        for placeholder in template.placeholders:
            if placeholder.name is None:
                raise StatementError(
                    f"positional parameter ?{placeholder.index} needs positional values, "
                    "got named values"
                )
            if placeholder.name in params:
                value = params[placeholder.name]
            else:
                raise StatementError(f"no value for parameter :{placeholder.name}")
            literals.append(_term_literal(value) if placeholder.term else sql_literal(value))
    else:
        values: Sequence[SQLValue] = params
        if len(values) < template.positional_count:
            raise StatementError(
                f"not enough args to execute query: want {template.positional_count} got "
                f"{len(values)}"
            )
        literals = [
            _term_literal(values[i]) if p.term else sql_literal(values[i])
            for i, p in zip(template.positions, template.placeholders, strict=True)
        ]
    out = [template.parts[0]]
    for literal, part in zip(literals, template.parts[1:], strict=True):
        out.append(literal)
        out.append(part)
    return "".join(out)


def _column_literals(column: Sequence[SQLValue]) -> list[str]:
    """Literals for one placeholder's values across many rows, converted column by column
    (one type check per column instead of one dispatch per value)."""
    kinds = set(map(type, column))
    if kinds == {int}:
        ints = cast("Sequence[int]", column)
        if min(ints) >= 0:
            return list(map(str, ints))
        return [str(v) if v >= 0 else f"({v})" for v in ints]
    if kinds == {float}:
        texts = list(map(repr, column))
        if not any(t[-1] in "fn" for t in texts):  # inf, nan
            return [POSITIVE_ZERO if t == "0.0" else f"({t})" if t[0] == "-" else t for t in texts]
    elif kinds == {str}:
        strings = cast("Sequence[str]", column)
        if not any("\x00" in v for v in strings):
            return ["'" + v.replace("'", "''") + "'" for v in strings]
    elif kinds == {bytes}:
        return [f"X'{v.hex()}'" for v in cast("Sequence[bytes]", column)]
    return list(map(sql_literal, column))


_SEQUENCE_TYPES = {tuple, list}


def render_many(sql: str, many: Sequence[Params]) -> list[str]:
    """:func:`render` for many parameter sets of one statement (the bulk-write path).

    Equivalent to ``[render(sql, p).rstrip() for p in many]``, about three times faster.
    """
    template = parse_template(sql)
    if not many:
        return []
    if not template.placeholders:
        return [sql.rstrip()] * len(many)
    if (
        (
            not set(map(type, many)) <= _SEQUENCE_TYPES
            and any(isinstance(params, Mapping) for params in many)
        )
        or template.statements != 1
        or any(p.term for p in template.placeholders)
    ):
        return [render(sql, params).rstrip() for params in many]
    needed = template.positional_count
    if min(map(len, many)) < needed:
        short = min(map(len, many))
        raise StatementError(f"not enough args to execute query: want {needed} got {short}")
    sequences = cast("Sequence[Sequence[SQLValue]]", many)  # no mapping, checked above
    columns = list(zip(*(params[:needed] for params in sequences), strict=True))
    literal_columns = [_column_literals(columns[position]) for position in template.positions]
    parts = [part.replace("%", "%%") for part in template.parts]
    parts[-1] = parts[-1].rstrip()
    pattern = "%s".join(parts)
    return [pattern % row for row in zip(*literal_columns, strict=True)]
