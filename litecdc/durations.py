"""Go's time.Duration as text, both ways: rqlite's clients and configuration speak it
(``db_timeout=2s`` in a URL, ``"transmit_timeout": "5s"`` in a CDC config, ``node.uptime``
in /status)."""

from __future__ import annotations

import re

#: Go's duration units in nanoseconds (time.ParseDuration: "µs" is U+00B5, "μs" U+03BC)
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_GO_MAX_DURATION_NS = 2**63 - 1
_DIGITS = re.compile(r"[0-9]*")
_UNIT = re.compile(r"[^0-9.]*")  # as Go reads a unit: up to the next digit or "."


class DurationOutOfRange(ValueError):
    """A duration past Go's limit (about 292 years)."""


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a duration in Go's syntax, exactly as ``time.ParseDuration`` reads it:
    an optional sign, then ``0`` or one or more decimal numbers (fraction allowed, "1.5h",
    ".5s", "1.s") each with a unit (ns, us, µs, μs, ms, s, m, h), as in "1h2m3.5s". Raises
    ValueError with Go's reason."""
    s, negative = text, False
    if s[:1] in ("-", "+"):
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError("invalid duration")
    total, pos = 0, 0
    while pos < len(s):
        whole = _DIGITS.match(s, pos)
        assert whole is not None  # [0-9]* always matches
        pos = whole.end()
        fraction = ""
        if s.startswith(".", pos):
            digits = _DIGITS.match(s, pos + 1)
            assert digits is not None
            fraction, pos = digits.group(), digits.end()
        if not whole.group() and not fraction:
            raise ValueError("invalid duration")  # no digits ("." or "s")
        unit_match = _UNIT.match(s, pos)
        assert unit_match is not None
        unit, pos = unit_match.group(), unit_match.end()
        if not unit:
            raise ValueError("missing unit in duration")
        if unit not in _UNIT_NS:
            raise ValueError(f"unknown unit {unit!r} in duration")
        scale = _UNIT_NS[unit]
        total += int(whole.group() or "0") * scale
        if fraction:  # truncated to whole nanoseconds, as Go does
            fraction = fraction[:30]
            total += int(fraction) * scale // 10 ** len(fraction)
        if total > _GO_MAX_DURATION_NS:
            raise DurationOutOfRange("invalid duration: out of range")
    return -total if negative else total


def format_go_duration(seconds: float) -> str:
    """A duration as Go's time.Duration.String() writes it (``1h2m3.5s``, ``1.5ms``):
    rqlite's ``node.uptime``, which clients parse with time.ParseDuration."""
    nanos = round(seconds * 1e9)
    if nanos == 0:
        return "0s"
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    if nanos < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if nanos >= size or unit == "ns":
                return sign + _go_decimal(nanos, size) + unit
    hours, rest = divmod(nanos, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _go_decimal(rest, 1_000_000_000) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _go_decimal(value: int, unit: int) -> str:
    """``value / unit`` with the fraction's trailing zeros dropped, exactly."""
    whole, fraction = divmod(value, unit)
    if not fraction:
        return str(whole)
    digits = len(str(unit)) - 1
    return f"{whole}.{str(fraction).rjust(digits, '0').rstrip('0')}"
