"""CDC service configuration: rqlite's CDC keys, validated, with named defaults.

``litecdc serve --cdc-config X`` takes:

* an ``http://`` or ``https://`` URL — the webhook, every other setting at its default;
* ``stdout`` — print each batch as one JSON line (for trying things out);
* a path to a JSON file with rqlite's CDC keys, so existing rqlite configurations work,
  plus litecdc's additions (``format``, ``hmac_secret``, ``headers``).

Anything wrong is refused at start-up with a message that names the key.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from litecdc.config_files import check_text, decode_json, read_config_file
from litecdc.durations import DurationOutOfRange, parse_go_duration
from litecdc.errors import ConfigError
from litecdc.webhook_client import host_problem

#: Defaults, as rqlite's (cdc/config.go); durations in seconds.
DEFAULT_MAX_BATCH_SIZE = 10
DEFAULT_MAX_BATCH_DELAY = 0.2
DEFAULT_MAX_BATCH_EVENTS = 10_000
DEFAULT_HIGH_WATERMARK_INTERVAL = 1.0
DEFAULT_TRANSMIT_TIMEOUT = 5.0
DEFAULT_TRANSMIT_MAX_RETRIES: int | None = None  # retry forever: nothing is lost
DEFAULT_TRANSMIT_RETRY_POLICY = "linear"
DEFAULT_TRANSMIT_MIN_BACKOFF = 1.0
DEFAULT_TRANSMIT_MAX_BACKOFF = 30.0
#: the shortest wait between two attempts, whatever the backoff settings say: a backoff of
#: 0 (which rqlite accepts) must not retry a failing endpoint in a loop that burns a core
MIN_RETRY_WAIT = 0.01

FORMATS = ("rqlite", "debezium")
RETRY_POLICIES = ("linear", "exponential")
STDOUT = "stdout"

#: the longest duration any key takes: a day
MAX_DURATION_S = 86_400.0
#: a JSON number (nanoseconds, as rqlite's Go reads it) below 1ms is refused: no key is
#: meant to be that short, and "5" meaning 5 seconds would otherwise be taken as 5 ns
NUMBER_FLOOR_NS = 1_000_000


def parse_duration(value: object, key: str) -> float:
    """A duration in seconds from a string in Go's syntax ("200ms", "5s", "1m30s", "0";
    see :func:`parse_go_duration`) or a JSON number of nanoseconds (how rqlite's Go code
    reads a time.Duration)."""
    if isinstance(value, bool):
        raise ConfigError(f'cdc config: {key} must be a duration like "5s", got {value!r}')
    if isinstance(value, (int, float)):
        if 0 < value < NUMBER_FLOOR_NS:
            # (QA: "transmit_timeout": 5 meant seconds, was 5 ns, and nothing was delivered)
            raise ConfigError(
                f"cdc config: {key} is {value!r}: a JSON number is nanoseconds, so that is "
                f'{value!r}ns; write a duration string like "5s" or "200ms" (numbers below '
                f"{NUMBER_FLOOR_NS:,} ns, 1ms, are refused as a likely mistake)"
            )
        seconds = float(value) / 1e9
    elif isinstance(value, str):
        try:
            seconds = parse_go_duration(value) / 1e9
        except DurationOutOfRange:
            seconds = -math.inf if value.startswith("-") else math.inf
        except ValueError as exc:
            raise ConfigError(
                f'cdc config: {key} must be a duration like "200ms", "5s" or "1m30s", '
                f"got {value!r} ({exc})"
            ) from None
    else:
        raise ConfigError(f'cdc config: {key} must be a duration like "5s", got {value!r}')
    if seconds < 0:
        raise ConfigError(f"cdc config: {key} must not be negative, got {value!r}")
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        # (longer waits overflow the service's clock arithmetic and nothing is delivered)
        raise ConfigError(f"cdc config: {key} must be at most 24h, got {value!r}")
    return seconds


def redact_endpoint(endpoint: str) -> str:
    """The endpoint without its ``user:password@`` part and with its query's values as
    ``…`` (``?token=…``: webhook services put their keys there), exactly as written
    otherwise (IPv6 brackets, port, path, parameter names) — for /status, logs and error
    messages. Works on URLs that do not parse too: the credentials are whatever precedes
    the authority's last "@", as both urllib and httpx read it."""
    scheme, separator, rest = endpoint.partition("://")
    if not separator:
        return endpoint
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter)
        if found != -1:
            end = min(end, found)
    authority, after = rest[:end], rest[end:]
    path, question, query_and_fragment = after.partition("?")
    if question:
        query, hash_sign, fragment = query_and_fragment.partition("#")
        masked = "&".join(_masked_parameter(p) for p in query.split("&"))
        after = f"{path}?{masked}{hash_sign}{fragment}"
    return f"{scheme}://{authority.rpartition('@')[2]}{after}"


def _masked_parameter(parameter: str) -> str:
    name, equals, value = parameter.partition("=")
    return f"{name}=…" if equals and value else parameter


def _shown(endpoint: str) -> str:
    """The endpoint as an error message may show it. A URL that failed a check may have
    credentials the parsers do not see as such (a password with a raw "#", "/" or "?"
    ends the authority early), so everything up to the last "@" goes."""
    shown = redact_endpoint(endpoint)
    if "@" not in shown:
        return shown
    scheme, separator, rest = shown.partition("://")
    if separator:
        return f"{scheme}://…@{rest.rpartition('@')[2]}"
    return "…@" + shown.rpartition("@")[2]


def shown_cdc_config(text: str) -> str:
    """A ``--cdc-config`` value as it may be shown (/debug/vars' command line, errors):
    a URL without its credentials — also one missing its "//" (``http:user:pass@host``)."""
    if "://" in text or (":" in text.partition("@")[0] and "@" in text):
        return _shown(text)
    return text


@dataclass(frozen=True)
class TLSConfig:
    #: PEM file of the CA that signed the endpoint's certificate (default: system CAs)
    ca_cert_file: Path | None = None
    #: client certificate and key for mutual TLS (both or neither)
    cert_file: Path | None = None
    key_file: Path | None = None
    #: skip verification of the endpoint's certificate (testing only)
    insecure_skip_verify: bool = False
    #: name to verify the endpoint's certificate against (default: the URL's host)
    server_name: str | None = None


@dataclass(frozen=True)
class CDCConfig:
    #: webhook URL (http/https, or another registered scheme) or "stdout"
    endpoint: str
    #: optional id put in every envelope ("service_id"); default none
    service_id: str = ""
    #: send only row ids and primary keys, no before/after images; default False
    row_ids_only: bool = False
    #: regular expression a table name must match (fully) to be sent; default: all tables
    table_filter: re.Pattern[str] | None = None
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: most transactions (cids; rqlite: log entries) in one batch, each with all its row
    #: events; default 10
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    #: litecdc addition: most row events in one batch, counting whole transactions (a
    #: single larger transaction still goes alone); bounds the size of a request; default
    #: 10,000
    max_batch_events: int = DEFAULT_MAX_BATCH_EVENTS
    #: longest a batch waits to fill before it is sent; default 200ms
    max_batch_delay: float = DEFAULT_MAX_BATCH_DELAY
    #: how often the leader writes the high watermark through the log; default 1s
    high_watermark_interval: float = DEFAULT_HIGH_WATERMARK_INTERVAL
    #: the longest one request may take, all of it (connecting, TLS handshake, sending,
    #: waiting for and reading the answer); default 5s
    transmit_timeout: float = DEFAULT_TRANSMIT_TIMEOUT
    #: attempts (the first included) before a batch is dropped and counted;
    #: None = retry forever (default, as rqlite)
    transmit_max_retries: int | None = DEFAULT_TRANSMIT_MAX_RETRIES
    #: "linear" (every wait is transmit_min_backoff) or "exponential" (2, 4, 8… times it,
    #: capped at transmit_max_backoff), as rqlite; default linear
    transmit_retry_policy: str = DEFAULT_TRANSMIT_RETRY_POLICY
    transmit_min_backoff: float = DEFAULT_TRANSMIT_MIN_BACKOFF
    transmit_max_backoff: float = DEFAULT_TRANSMIT_MAX_BACKOFF
    #: envelope: "rqlite" (default) or "debezium"
    format: str = "rqlite"
    #: Standard Webhooks signing secret ("whsec_<base64>"); default: unsigned
    hmac_secret: str | None = None
    #: extra HTTP headers on every request
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> str:
        return STDOUT if self.endpoint == STDOUT else urlsplit(self.endpoint).scheme.lower()

    def delivery(self) -> str:
        """Where the changes go and what is sent, one line (credentials redacted): what
        every node of a cluster must share, as whichever leads delivers. TLS files,
        batching and retries may differ from node to node."""
        parts = [redact_endpoint(self.endpoint), f"format {self.format}"]
        if self.service_id:
            parts.append(f"service_id {self.service_id!r}")
        if self.row_ids_only:
            parts.append("row_ids_only")
        if self.table_filter is not None:
            parts.append(f"table_filter {self.table_filter.pattern!r}")
        return ", ".join(parts)

    def delivery_digest(self) -> str:
        """A digest of :meth:`delivery` with what it leaves out, as secrets may be in it:
        the endpoint's credentials, the extra headers (an Authorization, a routing
        header) and the signing secret (a receiver checks the signature)."""
        headers = sorted((k.lower(), v) for k, v in self.headers.items())
        whole = json.dumps([self.delivery(), self.endpoint, headers, self.hmac_secret or ""])
        return hashlib.sha256(whole.encode()).hexdigest()[:32]

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), as rqlite, but
        never less than ``MIN_RETRY_WAIT``."""
        if self.transmit_retry_policy == "exponential":
            delay = self.transmit_min_backoff * (2 ** min(attempt, 62))
        else:
            delay = self.transmit_min_backoff
        return max(MIN_RETRY_WAIT, float(min(delay, self.transmit_max_backoff)))


_KEYS = {
    "endpoint",
    "max_batch_events",
    "service_id",
    "row_ids_only",
    "table_filter",
    "tls",
    "max_batch_size",
    "max_batch_delay",
    "high_watermark_interval",
    "transmit_timeout",
    "transmit_max_retries",
    "transmit_retry_policy",
    "transmit_min_backoff",
    "transmit_max_backoff",
    "format",
    "hmac_secret",
    "headers",
}
#: rqlite keys litecdc takes only at their defaults (false): it always sends to the
#: endpoint, and its high watermark is what prunes delivered changes
_RQLITE_FALSE_KEYS = {
    "log_only": 'log_only: true is not supported; use "endpoint": "stdout" to see the events',
    "high_watermarking_disabled": (
        "high_watermarking_disabled: true is not supported: litecdc's high watermark is "
        "what lets delivered changes be pruned"
    ),
}
#: an HTTP header name (RFC 9110 token)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_TLS_KEYS = {"ca_cert_file", "cert_file", "key_file", "insecure_skip_verify", "server_name"}
#: rqlite's JSON config spells the tls object's keys so (cdc/json_config.go)
_RQLITE_TLS_ALIASES = {
    "client_cert": "cert_file",
    "client_key": "key_file",
    "ca_cert": "ca_cert_file",
    "skip_verify": "insecure_skip_verify",
}


def _rqlite_tls_spellings(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with rqlite's other TLS spellings in litecdc's: the TLS keys at the top
    level (as one rqlite version's cdc/config.go reads them) moved into ``tls``, and the
    ``tls`` object's ``client_cert``/``client_key``/``ca_cert``/``skip_verify``
    (cdc/json_config.go) renamed. The same setting given twice is refused."""
    top = [k for k in doc if k in _TLS_KEYS]
    tls = doc.get("tls")
    if not top and not (isinstance(tls, dict) and set(tls) & set(_RQLITE_TLS_ALIASES)):
        return doc
    if tls is not None and not isinstance(tls, dict):
        raise ConfigError("cdc config: tls must be an object")
    merged: dict[str, Any] = {}
    given: dict[str, Any] = tls or {}
    for key, value in given.items():
        name = _RQLITE_TLS_ALIASES.get(key, key)
        if name in merged:
            raise ConfigError(f"cdc config: tls.{name} is given twice (as tls.{key} too)")
        merged[name] = value
    for key in top:
        if key in merged:
            raise ConfigError(f"cdc config: {key} is given twice (at the top level and in tls)")
        merged[key] = doc[key]
    return {**{k: v for k, v in doc.items() if k not in top}, "tls": merged}


def parse_cdc_config(
    value: str, *, known_schemes: tuple[str, ...] = ("http", "https")
) -> CDCConfig:
    """``--cdc-config``: a URL, "stdout" or a JSON file path, into a validated CDCConfig."""
    text = value.strip()
    if not text:
        raise ConfigError(
            f"--cdc-config is {'empty' if not value else 'blank'}: give an http(s):// URL, "
            '"stdout" or the path of a JSON file, or leave the option out for no delivery'
        )
    if text == STDOUT:
        return _validated({"endpoint": STDOUT}, known_schemes)
    if "://" in text:
        return _validated({"endpoint": text}, known_schemes)
    # (a URL missing its "//", "http:user:pass@host", lands here: no credentials shown)
    data = read_config_file(Path(text), "--cdc-config", shown_cdc_config(text))
    try:
        raw = data.decode("utf-8")  # JSON is UTF-8 (RFC 8259), whatever the locale says
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--cdc-config: {text!r} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}): save it as UTF-8"
        ) from None
    doc = decode_json(raw, f"--cdc-config: {text!r}")
    if not isinstance(doc, dict):
        raise ConfigError(f"--cdc-config: {text!r} must hold a JSON object")
    return _validated(doc, known_schemes)


#: a DNS name (labels of letters, digits, '-' and '_') or an IP address, as TLS checks it
_HOST_NAME = re.compile(
    r"(?=.{1,254}$)[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?|[0-9A-Fa-f:.]+"
)


def _validated(doc: dict[str, Any], known_schemes: tuple[str, ...]) -> CDCConfig:
    check_text(doc, "cdc config")  # (a URL from the command line: a file's were checked)
    for key, refusal in _RQLITE_FALSE_KEYS.items():
        if key in doc and _typed(doc, key, bool):
            raise ConfigError(f"cdc config: {refusal}")
    doc = _rqlite_tls_spellings(doc)
    known = _KEYS | set(_RQLITE_FALSE_KEYS)
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(
            f"cdc config: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(known))})"
        )
    endpoint = doc.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise ConfigError('cdc config: endpoint is required: an http(s) URL or "stdout"')
    if endpoint != STDOUT:
        shown = _shown(endpoint)  # never the credentials (docs/cdc.md promises it)
        if endpoint != endpoint.strip():
            # the URL parser strips it, the HTTP client does not: every request would fail
            # with "missing an 'http://' protocol" (QA)
            raise ConfigError(f"cdc config: endpoint {shown!r} has white space before or after it")
        _check_url(endpoint)
        parts = urlsplit(endpoint)
        if not parts.scheme or not parts.netloc:
            raise ConfigError(f"cdc config: endpoint {shown!r} is not a URL")
        if parts.scheme.lower() not in known_schemes or parts.scheme.lower() == STDOUT:
            schemes = ", ".join(s for s in known_schemes if s != STDOUT)
            raise ConfigError(
                f"cdc config: endpoint scheme {parts.scheme!r} is not supported "
                f'(supported: {schemes}, or "stdout")'
            )
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"cdc config: endpoint {shown!r} has an invalid port") from None
        if port == 0:  # nothing listens there: every request would fail, forever
            raise ConfigError(f"cdc config: endpoint {shown!r} has port 0")
    kwargs: dict[str, Any] = {"endpoint": endpoint}
    for key in ("service_id",):
        if key in doc:
            kwargs[key] = _typed(doc, key, str)
    for key in ("row_ids_only",):
        if key in doc:
            kwargs[key] = _typed(doc, key, bool)
    if doc.get("table_filter") not in (None, ""):
        pattern = _typed(doc, "table_filter", str)
        try:
            kwargs["table_filter"] = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                f"cdc config: table_filter is not a valid regular expression: {exc}"
            ) from None
    if "max_batch_size" in doc:
        size = _typed(doc, "max_batch_size", int)
        if size < 1:
            raise ConfigError(f"cdc config: max_batch_size must be at least 1, got {size}")
        kwargs["max_batch_size"] = size
    if "max_batch_events" in doc:
        limit = _typed(doc, "max_batch_events", int)
        if limit < 1:
            raise ConfigError(f"cdc config: max_batch_events must be at least 1, got {limit}")
        kwargs["max_batch_events"] = limit
    for key in (
        "max_batch_delay",
        "high_watermark_interval",
        "transmit_timeout",
        "transmit_min_backoff",
        "transmit_max_backoff",
    ):
        if key in doc:
            kwargs[key] = parse_duration(doc[key], key)
    if kwargs.get("transmit_timeout", 1.0) <= 0:
        raise ConfigError("cdc config: transmit_timeout must be more than zero")
    if kwargs.get("high_watermark_interval", 1.0) <= 0:
        raise ConfigError("cdc config: high_watermark_interval must be more than zero")
    if "transmit_max_retries" in doc:
        retries = doc["transmit_max_retries"]
        if retries is not None:
            retries = _typed(doc, "transmit_max_retries", int)
            if retries < 1:
                raise ConfigError(
                    "cdc config: transmit_max_retries must be at least 1, or "
                    f"null to retry forever; got {retries}"
                )
        kwargs["transmit_max_retries"] = retries
    if "transmit_retry_policy" in doc:
        kwargs["transmit_retry_policy"] = _retry_policy(doc["transmit_retry_policy"])
    if kwargs.get("transmit_min_backoff", DEFAULT_TRANSMIT_MIN_BACKOFF) > kwargs.get(
        "transmit_max_backoff", DEFAULT_TRANSMIT_MAX_BACKOFF
    ):
        raise ConfigError("cdc config: transmit_min_backoff must not exceed transmit_max_backoff")
    if "format" in doc:
        fmt = _typed(doc, "format", str).lower()
        if fmt not in FORMATS:
            raise ConfigError(
                f"cdc config: format must be one of {', '.join(FORMATS)}, got {fmt!r}"
            )
        kwargs["format"] = fmt
    if doc.get("hmac_secret") is not None:
        secret = _typed(doc, "hmac_secret", str)
        from litecdc.cdc.signing import decode_secret

        decode_secret(secret)  # raises ConfigError naming the key
        kwargs["hmac_secret"] = secret
    if doc.get("headers") is not None:
        headers = doc["headers"]
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise ConfigError("cdc config: headers must be an object of string to string")
        seen: dict[str, str] = {}
        for name, text in headers.items():
            _check_header(name, text, signed="hmac_secret" in kwargs)
            if name.lower() in seen:  # one header: the client would send either, or both
                raise ConfigError(
                    f"cdc config: headers: {name!r} is given twice (as "
                    f"{seen[name.lower()]!r} too; header names ignore case)"
                )
            seen[name.lower()] = name
        scheme = urlsplit(endpoint).scheme.lower()
        if "authorization" in seen and scheme in ("http", "https") and httpx.URL(endpoint).userinfo:
            # the webhook client sends the URL's credentials as basic auth, over the header
            # (QA); a registered sink of another scheme does with them what it does
            raise ConfigError(
                f"cdc config: headers: {seen['authorization']} is given, and the endpoint "
                "holds credentials (user:password@), which are sent as basic auth in that "
                "header: keep one of them"
            )
        kwargs["headers"] = dict(headers)
    if doc.get("tls") is not None:
        kwargs["tls"] = _tls(doc["tls"])
    config = CDCConfig(**kwargs)
    if config.tls != TLSConfig() and config.scheme in _PLAIN_SCHEMES:
        # a mistyped scheme would otherwise send in plain text without a word
        raise ConfigError(
            f"cdc config: tls is set but the endpoint {_shown(endpoint)!r} does not use "
            "TLS; use an https:// endpoint, or remove tls"
        )
    if config.tls.cert_file or config.tls.ca_cert_file:
        build_ssl_context(config.tls)  # unreadable or mismatched files fail now, not later
    return config


#: spellings of the retry policies: litecdc's names, rqlite's Go constant names and the
#: integers rqlite's code reads
_POLICY_NAMES = {
    "linear": "linear",
    "linearretrypolicy": "linear",
    "0": "linear",
    "exponential": "exponential",
    "exponentialretrypolicy": "exponential",
    "1": "exponential",
}


def _check_url(endpoint: str) -> None:
    """Refuse what the HTTP client could never send to: a host that does not parse, or
    one with characters no host name has. Messages never show credentials: with an "@"
    in the URL, not even the parsers' own words (which may quote part of a password)."""
    shown = _shown(endpoint)
    secretive = "@" in endpoint
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        httpx.URL(endpoint)  # what the HTTP client itself refuses ("http://[::1]x/")
    except (ValueError, httpx.InvalidURL) as exc:
        reason = "" if secretive else f": {exc}"
        raise ConfigError(f"cdc config: endpoint {shown!r} is not a valid URL{reason}") from None
    if parts.netloc and (not host or any(c.isspace() or c in '<>"{}|^`' for c in host)):
        named = "" if secretive else f" {host!r}"
        raise ConfigError(f"cdc config: endpoint {shown!r} has an invalid host{named}")
    if parts.netloc and (problem := host_problem(endpoint)) is not None:
        raise ConfigError(f"cdc config: endpoint {shown!r} has an invalid host {host!r}: {problem}")


#: endpoint schemes that never use the tls settings
_PLAIN_SCHEMES = ("http", STDOUT)

#: headers litecdc cannot take: those that frame the request or control the connection,
#: which the HTTP client owns (RFC 9110 §7.6.1 and §7.8, RFC 9112 §6-§9), and one that
#: would misdescribe the body. Set by hand they corrupt every request (a wrong
#: Content-Length), contradict the client's own (Transfer-Encoding next to
#: Content-Length), or ask for what it does not do (Upgrade, Expect: 100-continue).
_FRAMING = "the HTTP client sets it to frame the request body"
_HOP_BY_HOP = "a hop-by-hop header; the HTTP client manages the connection"
_CLIENT_HEADERS = {
    "content-length": _FRAMING,
    "transfer-encoding": _FRAMING,
    "trailer": "it announces trailer fields, which the HTTP client never sends",
    "host": (
        "the HTTP client sets it from the endpoint URL (tls.server_name sets the name TLS verifies)"
    ),
    "connection": _HOP_BY_HOP,
    "keep-alive": _HOP_BY_HOP,
    "proxy-connection": _HOP_BY_HOP,
    "te": _HOP_BY_HOP,
    "upgrade": _HOP_BY_HOP,
    "expect": "it asks for an interim 100 answer the HTTP client does not wait for",
    "content-encoding": "litecdc sends the body unencoded",
}
#: set on every request when hmac_secret is given
_SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


def _check_header(name: str, value: str, *, signed: bool = False) -> None:
    if not _HEADER_NAME.fullmatch(name):
        raise ConfigError(f"cdc config: headers: {name!r} is not a valid HTTP header name")
    if any(c in value for c in "\r\n\x00"):
        raise ConfigError(
            f"cdc config: headers: the value of {name} holds a line break or NUL, which "
            "HTTP does not allow"
        )
    if not all(c == "\t" or " " <= c <= "~" for c in value):
        raise ConfigError(
            f"cdc config: headers: the value of {name} must be printable ASCII "
            "(the HTTP client sends no other header text)"
        )
    lower = name.lower()
    if lower == "content-type":
        raise ConfigError(
            "cdc config: headers: Content-Type is set by litecdc (application/json: the "
            "body is always JSON)"
        )
    if lower in _CLIENT_HEADERS:
        raise ConfigError(
            f"cdc config: headers: {name} cannot be configured: {_CLIENT_HEADERS[lower]}"
        )
    if signed and lower in _SIGNATURE_HEADERS:
        raise ConfigError(
            f"cdc config: headers: {name} cannot be configured: litecdc sets it on every "
            "request when hmac_secret is given (Standard Webhooks signing)"
        )


def _retry_policy(value: object) -> str:
    valid = isinstance(value, (str, int)) and not isinstance(value, bool)
    key = str(value).lower() if valid else ""
    if key not in _POLICY_NAMES:
        raise ConfigError(
            f"cdc config: transmit_retry_policy must be one of {', '.join(RETRY_POLICIES)} "
            f"(or rqlite's 0/1), got {value!r}"
        )
    return _POLICY_NAMES[key]


def _typed(doc: dict[str, Any], key: str, kind: type) -> Any:
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = {int: "an integer", str: "a string", bool: "true or false"}[kind]
        raise ConfigError(f"cdc config: {key} must be {expected}, got {value!r}")
    return value


def _tls(value: object) -> TLSConfig:
    if not isinstance(value, dict):
        raise ConfigError("cdc config: tls must be an object")
    unknown = sorted(set(value) - _TLS_KEYS)
    if unknown:
        raise ConfigError(
            f"cdc config: unknown key tls.{unknown[0]} (known: {', '.join(sorted(_TLS_KEYS))})"
        )
    paths: dict[str, Path | None] = {}
    for key in ("ca_cert_file", "cert_file", "key_file"):
        raw = value.get(key)
        if raw in (None, ""):
            paths[key] = None
            continue
        if not isinstance(raw, str):
            raise ConfigError(f"cdc config: tls.{key} must be a file path, got {raw!r}")
        path = Path(raw)
        if not path.is_file():
            raise ConfigError(f"cdc config: tls.{key}: cannot read file {raw!r}")
        paths[key] = path
    if (paths["cert_file"] is None) != (paths["key_file"] is None):
        raise ConfigError("cdc config: tls.cert_file and tls.key_file must be given together")
    skip = value.get("insecure_skip_verify", False)
    if not isinstance(skip, bool):
        raise ConfigError(f"cdc config: tls.insecure_skip_verify must be a bool, got {skip!r}")
    server_name = value.get("server_name")
    if server_name is not None and not isinstance(server_name, str):
        raise ConfigError(f"cdc config: tls.server_name must be a string, got {server_name!r}")
    if server_name and not _HOST_NAME.fullmatch(server_name):
        # (found only when the first delivery failed its handshake: QA)
        raise ConfigError(
            f"cdc config: tls.server_name must be a host name such as hooks.example.com, "
            f"got {server_name!r}"
        )
    return TLSConfig(
        paths["ca_cert_file"], paths["cert_file"], paths["key_file"], skip, server_name or None
    )


def build_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The client-side TLS context for the webhook (CA, client certificate, verification)."""
    try:
        context = ssl.create_default_context(
            cafile=str(tls.ca_cert_file) if tls.ca_cert_file else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cdc config: tls.ca_cert_file: cannot load CA certificates: {exc}"
        ) from None
    if tls.cert_file is not None and tls.key_file is not None:
        try:
            context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cdc config: tls.cert_file/tls.key_file: cannot load the client certificate: {exc}"
            ) from None
    if tls.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
