"""CDC service configuration: rqlite's CDC keys, validated, with named defaults.

``litecdc serve --cdc-config X`` takes:

* an ``http://`` or ``https://`` URL — the webhook, every other setting at its default;
* ``stdout`` — print each batch as one JSON line (for trying things out);
* a path to a JSON file with rqlite's CDC keys, so existing rqlite configurations work,
  plus litecdc's additions (``format``, ``hmac_secret``, ``headers``).

Anything wrong is refused at start-up with a message that names the key.
"""

from __future__ import annotations

import json
import math
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from litecdc.errors import ConfigError

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

FORMATS = ("rqlite", "debezium")
RETRY_POLICIES = ("linear", "exponential")
STDOUT = "stdout"

#: the longest duration any key takes: a day
MAX_DURATION_S = 86_400.0
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object, key: str) -> float:
    """A duration in seconds from "200ms", "5s", "1m30s" (Go's syntax) or a JSON number of
    nanoseconds (how rqlite's Go code reads a time.Duration)."""
    if isinstance(value, bool):
        raise ConfigError(f'cdc config: {key} must be a duration like "5s", got {value!r}')
    if isinstance(value, (int, float)):
        seconds = float(value) / 1e9
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        pos, seconds = 0, 0.0
        while pos < len(text):
            match = _DURATION_PART.match(text, pos)
            if match is None:
                raise ConfigError(
                    f'cdc config: {key} must be a duration like "200ms", "5s" or "1m30s", '
                    f"got {value!r}"
                )
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
    else:
        raise ConfigError(f'cdc config: {key} must be a duration like "5s", got {value!r}')
    if seconds < 0:
        raise ConfigError(f"cdc config: {key} must not be negative, got {value!r}")
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        # (longer waits overflow the service's clock arithmetic and nothing is delivered)
        raise ConfigError(f"cdc config: {key} must be at most 24h, got {value!r}")
    return seconds


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
    #: timeout of one POST; default 5s
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

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), as rqlite."""
        if self.transmit_retry_policy == "exponential":
            delay = self.transmit_min_backoff * (2 ** min(attempt, 62))
        else:
            delay = self.transmit_min_backoff
        return float(min(delay, self.transmit_max_backoff))


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


def parse_cdc_config(
    value: str, *, known_schemes: tuple[str, ...] = ("http", "https")
) -> CDCConfig:
    """``--cdc-config``: a URL, "stdout" or a JSON file path, into a validated CDCConfig."""
    text = value.strip()
    if not text:
        raise ConfigError('--cdc-config must be a URL, "stdout" or a JSON file path')
    if text == STDOUT:
        return _validated({"endpoint": STDOUT}, known_schemes)
    if "://" in text:
        return _validated({"endpoint": text}, known_schemes)
    path = Path(text)
    try:
        raw = path.read_text()
    except OSError as exc:
        raise ConfigError(f"--cdc-config: cannot read {text!r}: {exc.strerror}") from None
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--cdc-config: {text!r} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--cdc-config: {text!r} must hold a JSON object")
    return _validated(doc, known_schemes)


def _validated(doc: dict[str, Any], known_schemes: tuple[str, ...]) -> CDCConfig:
    for key, refusal in _RQLITE_FALSE_KEYS.items():
        if key in doc and _typed(doc, key, bool):
            raise ConfigError(f"cdc config: {refusal}")
    unknown = sorted(set(doc) - _KEYS - set(_RQLITE_FALSE_KEYS))
    if unknown:
        raise ConfigError(
            f"cdc config: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(_KEYS))})"
        )
    endpoint = doc.get("endpoint")
    if not isinstance(endpoint, str) or not endpoint:
        raise ConfigError('cdc config: endpoint is required: an http(s) URL or "stdout"')
    if endpoint != STDOUT:
        _check_url(endpoint)
        parts = urlsplit(endpoint)
        if not parts.scheme or not parts.netloc:
            raise ConfigError(f"cdc config: endpoint {endpoint!r} is not a URL")
        if parts.scheme.lower() not in known_schemes or parts.scheme.lower() == STDOUT:
            schemes = ", ".join(s for s in known_schemes if s != STDOUT)
            raise ConfigError(
                f"cdc config: endpoint scheme {parts.scheme!r} is not supported "
                f'(supported: {schemes}, or "stdout")'
            )
        try:
            _ = parts.port
        except ValueError:
            raise ConfigError(f"cdc config: endpoint {endpoint!r} has an invalid port") from None
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
        for name, text in headers.items():
            _check_header(name, text)
        kwargs["headers"] = dict(headers)
    if doc.get("tls") is not None:
        kwargs["tls"] = _tls(doc["tls"])
    config = CDCConfig(**kwargs)
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
    one with characters no host name has."""
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        httpx.URL(endpoint)  # what the HTTP client itself refuses ("http://[::1]x/")
    except (ValueError, httpx.InvalidURL) as exc:
        raise ConfigError(f"cdc config: endpoint {endpoint!r} is not a valid URL: {exc}") from None
    if parts.netloc and (not host or any(c.isspace() or c in '<>"{}|^`' for c in host)):
        raise ConfigError(f"cdc config: endpoint {endpoint!r} has an invalid host {host!r}")


def _check_header(name: str, value: str) -> None:
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
    if name.lower() == "content-type":
        raise ConfigError(
            "cdc config: headers: Content-Type is set by litecdc (application/json: the "
            "body is always JSON)"
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
