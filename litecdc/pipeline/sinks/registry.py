"""Sink URLs: which sink a URL names, its options, and opening it.

=========================================================  ===========================
URL                                                        sink
=========================================================  ===========================
``delta:/abs/path`` or ``delta:///abs/path``               Delta Lake table (mirror)
``postgresql://user:pw@host:port/db?table=T&schema=S``     PostgreSQL table (mirror)
``mysql://user:pw@host:port/db?table=T`` (``mariadb://``)  MariaDB/MySQL table (mirror)
``nats://host:port?stream=S&subject=P``                    NATS JetStream (log)
``amqp://user:pw@host:port/vhost?exchange=E`` (or queue=)  RabbitMQ (log)
``http(s)://host/path?litecdc_secret=whsec_…``             webhook (log)
=========================================================  ===========================

Defaults: ``table`` = the source table's name, ``schema`` = ``public``, ``stream`` =
``LITECDC``, ``subject`` = ``litecdc`` (messages go to ``<subject>.<table>``), queue =
``litecdc.<table>`` when neither exchange nor queue is given. Webhook URLs keep their own
query string; only parameters starting with ``litecdc_`` are litecdc's
(``litecdc_secret``: Standard Webhooks HMAC secret, ``litecdc_timeout``: seconds one
request may take, all of it, default 10, ``litecdc_retries``: attempts per POST, default
5).

``parse_sink_url`` validates a URL without connecting (``pipeline subscribe`` refuses a
bad sink up front); ``open_sink`` builds the sink and prepares its destination.
Passwords and secrets never appear in errors or logs: see ``mask_url``.

Example::

    sink = open_sink("delta:/data/lake/orders", spec, "orders-lake")
    sink.write_snapshot(rows)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from litecdc.errors import SinkError
from litecdc.pipeline.sinks.base import Sink
from litecdc.pipeline.tables import TableSpec

__all__ = [
    "AmqpOptions",
    "DeltaOptions",
    "NatsOptions",
    "SinkOptions",
    "SqlOptions",
    "WebhookOptions",
    "mask_url",
    "open_sink",
    "parse_sink_url",
    "scrub_password",
    "scrub_url_password",
]

DEFAULT_NATS_STREAM = "LITECDC"
DEFAULT_NATS_SUBJECT = "litecdc"
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds; a closed port fails at once anyway
DEFAULT_WEBHOOK_TIMEOUT = 10.0
DEFAULT_WEBHOOK_RETRIES = 5

_SECRET_PARAMS = {"litecdc_secret", "password", "token"}
_NATS_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # JetStream stream names: no '.', '*', '>'
_NATS_SUBJECT = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


@dataclass(frozen=True)
class DeltaOptions:
    path: str


@dataclass(frozen=True)
class SqlOptions:
    dialect: str  # 'postgresql' or 'mysql'
    host: str
    port: int
    user: str | None
    password: str | None = field(repr=False)
    database: str
    table: str | None  # None: the source table's name
    schema: str | None  # PostgreSQL only ('public' when None)
    connect_timeout: float
    sslmode: str | None = None  # PostgreSQL only


@dataclass(frozen=True)
class NatsOptions:
    server: str  # nats://[user:pw@]host:port, credentials included
    stream: str
    subject: str  # prefix; a table's messages go to <subject>.<table>
    connect_timeout: float


@dataclass(frozen=True)
class AmqpOptions:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    vhost: str
    exchange: str | None
    queue: str | None
    connect_timeout: float
    tls: bool = False


@dataclass(frozen=True)
class WebhookOptions:
    url: str  # the endpoint, without litecdc_ parameters (credentials included)
    secret: str | None = field(repr=False)
    timeout: float  # seconds one request may take, all of it (connect, send, answer)
    retries: int  # attempts per POST, the first included


SinkOptions = DeltaOptions | SqlOptions | NatsOptions | AmqpOptions | WebhookOptions


def sink_server(url: str) -> str | None:
    """The ``host:port`` of the server a sink URL writes to; None for a sink on files
    (Delta, a Parquet log) or a URL that does not parse."""
    try:
        options = parse_sink_url(url)
    except SinkError:  # a Parquet log's URL, or one the sink reports on its own
        return None
    if isinstance(options, SqlOptions | AmqpOptions):
        return f"{options.host}:{options.port}"
    if isinstance(options, NatsOptions | WebhookOptions):
        parts = urlsplit(options.server if isinstance(options, NatsOptions) else options.url)
        try:
            port = parts.port or {"https": 443, "http": 80, "tls": 4222}.get(parts.scheme, 4222)
        except ValueError:
            return None
        return f"{parts.hostname}:{port}"
    return None


def mask_url(url: str) -> str:
    """The URL with its password and secret parameters replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, has_pw, _ = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if has_pw else f"{userinfo}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
        )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def parse_sink_url(url: str) -> SinkOptions:
    """Validate a sink URL and return its options; raise SinkError naming the problem.

    Nothing is contacted: a valid URL may still name an unreachable server.
    """
    safe = mask_url(url)
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme == "delta":
            return _parse_delta(url, safe)
        if scheme in ("postgresql", "postgres"):
            return _parse_sql(url, safe, "postgresql", 5432)
        if scheme in ("mysql", "mariadb"):
            return _parse_sql(url, safe, "mysql", 3306)
        if scheme in ("nats", "tls"):
            return _parse_nats(url, safe)
        if scheme in ("amqp", "amqps"):
            return _parse_amqp(url, safe)
        if scheme in ("http", "https"):
            return _parse_webhook(url, safe)
    except ValueError as exc:  # urlsplit / port parsing
        detail = scrub_url_password(str(exc), url)
        detail = detail[:1].lower() + detail[1:]
        raise SinkError(f"sink URL {safe}: {detail}: check the host and port") from None
    # parquet: is the pipeline's own change log (pipeline.parquet_log), not a Sink
    known = "delta:, parquet:, postgresql://, mysql://, mariadb://, nats://, amqp://, http(s)://"
    if not scheme:
        raise SinkError(f"sink URL {safe!r} has no scheme: use one of {known}")
    raise SinkError(f"sink URL {safe}: unknown scheme {scheme!r}: use one of {known}")


def open_sink(url: str, spec: TableSpec, subscription: str, *, prepare: bool = True) -> Sink:
    """The sink a URL names, for one subscription of ``spec``'s table.

    With ``prepare`` (the default) the destination is contacted and created or checked
    (``Sink.prepare``), so an unreachable server or a schema clash is reported here.
    """
    options = parse_sink_url(url)
    sink: Sink
    # sink modules import their client libraries: only the one needed is loaded
    if isinstance(options, DeltaOptions):
        from litecdc.pipeline.sinks.delta import DeltaSink

        sink = DeltaSink(url, spec, subscription)
    elif isinstance(options, SqlOptions) and options.dialect == "postgresql":
        from litecdc.pipeline.sinks.postgres import PostgresSink

        sink = PostgresSink(url, spec, subscription)
    elif isinstance(options, SqlOptions):
        from litecdc.pipeline.sinks.mariadb import MariaDBSink

        sink = MariaDBSink(url, spec, subscription)
    elif isinstance(options, NatsOptions):
        from litecdc.pipeline.sinks.nats import NatsSink

        sink = NatsSink(url, spec, subscription)
    elif isinstance(options, AmqpOptions):
        from litecdc.pipeline.sinks.rabbitmq import RabbitMQSink

        sink = RabbitMQSink(url, spec, subscription)
    else:
        from litecdc.pipeline.sinks.webhook import WebhookSink

        sink = WebhookSink(url, spec, subscription)
    if prepare:
        try:
            sink.prepare()
        except BaseException:
            sink.close()
            raise
    return sink


def scrub_password(text: str, password: str | None, user: str | None = None) -> str:
    """``text`` (a driver's or broker's message) with ``password`` replaced by ``***``.

    The password goes wherever it appears, as typed or percent-encoded — except inside
    the user name: a user named like its password (``amqp://guest:guest@…``) stays
    readable where the message names the user (``user 'guest'``, ``guest:***@``), as
    the masked URL shows it anyway.
    """
    if not password:
        return text
    forms = sorted({password, quote(password, safe="")}, key=len, reverse=True)
    # a URL's credentials: the part after the user's ':' is the password, whatever its name
    userinfo = re.compile(r"(//[^\s/@:]*:)(?:" + "|".join(re.escape(f) for f in forms) + r")@")
    text = userinfo.sub(r"\1***@", text)
    names = sorted({n for n in (user, quote(user or "", safe="")) if n}, key=len, reverse=True)
    keep = [n for n in names if password in n or quote(password, safe="") in n]
    if not keep:
        return _replace_all(text, forms)
    # split on the user name (kept as it is) and mask the password in what lies between
    pieces = re.split("(" + "|".join(re.escape(n) for n in keep) + ")", text)
    return "".join(p if i % 2 else _replace_all(p, forms) for i, p in enumerate(pieces))


def _replace_all(text: str, forms: list[str]) -> str:
    for form in forms:
        text = text.replace(form, "***")
    return text


def scrub_url_password(text: str, url: str) -> str:
    """``scrub_password`` with the password and user of ``url`` (a driver may echo its
    input)."""
    try:
        parts = urlsplit(url)
        password, user = parts.password, parts.username
    except ValueError:
        return text
    return scrub_password(
        text, unquote(password) if password else None, unquote(user) if user else None
    )


def _query(parts_query: str, safe: str, allowed: Mapping[str, str]) -> dict[str, str]:
    """Query parameters, refusing unknown and repeated ones (``allowed``: name → help)."""
    params: dict[str, str] = {}
    for key, value in parse_qsl(parts_query, keep_blank_values=True):
        if key not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            raise SinkError(f"sink URL {safe}: unknown query parameter {key!r} (allowed: {names})")
        if key in params:
            raise SinkError(f"sink URL {safe}: query parameter {key!r} given twice")
        if not value:
            raise SinkError(f"sink URL {safe}: query parameter {key!r} is empty")
        params[key] = value
    return params


def _seconds(params: Mapping[str, str], name: str, default: float, safe: str) -> float:
    if name not in params:
        return default
    try:
        value = float(params[name])
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise SinkError(f"sink URL {safe}: {name} must be a number of seconds in (0, 3600]")
    return value


def _host_port(
    parts_hostname: str | None, port: int | None, default: int, safe: str
) -> tuple[str, int]:
    if not parts_hostname:
        raise SinkError(f"sink URL {safe}: missing host (e.g. //127.0.0.1:{default})")
    return parts_hostname, port if port is not None else default


def _parse_delta(url: str, safe: str) -> DeltaOptions:
    parts = urlsplit(url)
    if parts.netloc:
        raise SinkError(
            f"sink URL {safe}: a Delta table is a local path: write delta:/abs/path "
            "or delta:///abs/path"
        )
    if parts.query or parts.fragment:
        raise SinkError(f"sink URL {safe}: delta: takes no query parameters")
    path = unquote(parts.path)
    if not path or not path.startswith("/"):
        raise SinkError(f"sink URL {safe}: missing absolute path (e.g. delta:/data/lake/orders)")
    if path.rstrip("/") == "":
        raise SinkError(f"sink URL {safe}: the table path cannot be the root directory")
    if "%" in path:
        # delta-rs decodes %XX in a local path (twice, even from a file:// URL): the table
        # would go elsewhere ('a%41' is 'aA') or not open at all
        raise SinkError(
            f"sink URL {safe}: the Delta table's path {path!r} contains '%', which delta-rs "
            "reads as a %XX escape: choose a path without '%'"
        )
    return DeltaOptions(path.rstrip("/"))


def _parse_sql(url: str, safe: str, dialect: str, default_port: int) -> SqlOptions:
    parts = urlsplit(url)
    allowed = {"table": "", "connect_timeout": ""}
    if dialect == "postgresql":
        allowed |= {"schema": "", "sslmode": ""}
    params = _query(parts.query, safe, allowed)
    host, port = _host_port(parts.hostname, parts.port, default_port, safe)
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise SinkError(f"sink URL {safe}: missing database name (…:{port}/DBNAME)")
    sslmode = params.get("sslmode")
    modes = {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"}
    if sslmode is not None and sslmode not in modes:
        raise SinkError(f"sink URL {safe}: sslmode must be one of {', '.join(sorted(modes))}")
    return SqlOptions(
        dialect=dialect,
        host=host,
        port=port,
        user=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=database,
        table=params.get("table"),
        schema=params.get("schema"),
        connect_timeout=_seconds(params, "connect_timeout", DEFAULT_CONNECT_TIMEOUT, safe),
        sslmode=sslmode,
    )


def _parse_nats(url: str, safe: str) -> NatsOptions:
    parts = urlsplit(url)
    params = _query(parts.query, safe, {"stream": "", "subject": "", "connect_timeout": ""})
    host, port = _host_port(parts.hostname, parts.port, 4222, safe)
    if parts.path not in ("", "/"):
        raise SinkError(f"sink URL {safe}: nats:// takes no path (use ?stream=…&subject=…)")
    stream = params.get("stream", DEFAULT_NATS_STREAM)
    if not _NATS_NAME.match(stream):
        raise SinkError(f"sink URL {safe}: stream {stream!r} must be letters, digits, '-' or '_'")
    subject = params.get("subject", DEFAULT_NATS_SUBJECT)
    if not _NATS_SUBJECT.match(subject):
        raise SinkError(
            f"sink URL {safe}: subject {subject!r} must be dot-separated tokens of "
            "letters, digits, '-' or '_' (no wildcards)"
        )
    netloc = parts.netloc.rpartition("@")[0]
    server = f"{parts.scheme}://{netloc + '@' if netloc else ''}{host}:{port}"
    return NatsOptions(
        server=server,
        stream=stream,
        subject=subject,
        connect_timeout=_seconds(params, "connect_timeout", DEFAULT_CONNECT_TIMEOUT, safe),
    )


#: AMQP's limit on a name (a short string: vhost, exchange, queue, routing key)
AMQP_SHORT_STRING_BYTES = 255


def _parse_amqp(url: str, safe: str) -> AmqpOptions:
    parts = urlsplit(url)
    params = _query(parts.query, safe, {"exchange": "", "queue": "", "connect_timeout": ""})
    tls = parts.scheme.lower() == "amqps"
    host, port = _host_port(parts.hostname, parts.port, 5671 if tls else 5672, safe)
    vhost = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if "exchange" in params and "queue" in params:
        raise SinkError(
            f"sink URL {safe}: give exchange= or queue=, not both (an exchange routes "
            "messages to its bound queues)"
        )
    for what, value in (("vhost", vhost), ("exchange", params.get("exchange"))):
        # AMQP short strings: pika refused it at every run (review)
        if value is not None and len(value.encode()) > AMQP_SHORT_STRING_BYTES:
            raise SinkError(
                f"sink URL {safe}: the {what} name is longer than AMQP's "
                f"{AMQP_SHORT_STRING_BYTES} bytes"
            )
    return AmqpOptions(
        host=host,
        port=port,
        user=unquote(parts.username) if parts.username else "guest",
        password=unquote(parts.password) if parts.password is not None else "guest",
        vhost=vhost or "/",
        exchange=params.get("exchange"),
        queue=params.get("queue"),
        connect_timeout=_seconds(params, "connect_timeout", DEFAULT_CONNECT_TIMEOUT, safe),
        tls=tls,
    )


def _parse_webhook(url: str, safe: str) -> WebhookOptions:
    if any(ch.isspace() for ch in url):
        # (httpx sends it percent-encoded, to a path the author did not write: QA)
        raise SinkError(f"sink URL {safe}: white space is not allowed in a URL (encode it: %20)")
    parts = urlsplit(url)
    if not parts.hostname:
        raise SinkError(f"sink URL {safe}: missing host")
    _ = parts.port  # raises ValueError on a bad port
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key.startswith("litecdc_"):
            ours[key] = value
        else:
            theirs.append((key, value))
    allowed = {"litecdc_secret", "litecdc_timeout", "litecdc_retries"}
    for key in ours:
        if key not in allowed:
            raise SinkError(
                f"sink URL {safe}: unknown query parameter {key!r} "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
    retries = DEFAULT_WEBHOOK_RETRIES
    if "litecdc_retries" in ours:
        text = ours["litecdc_retries"]
        if not text.isdigit() or not 1 <= int(text) <= 100:
            raise SinkError(f"sink URL {safe}: litecdc_retries must be a whole number in 1..100")
        retries = int(text)
    secret = ours.get("litecdc_secret") or None
    if secret is not None:
        from litecdc.cdc.signing import decode_secret
        from litecdc.errors import ConfigError

        try:
            decode_secret(secret)
        except ConfigError:
            raise SinkError(
                f'sink URL {safe}: litecdc_secret must be "whsec_" followed by base64 of '
                "at least 16 bytes"
            ) from None
    endpoint = urlunsplit(
        (parts.scheme, parts.netloc, parts.path or "/", urlencode(theirs), parts.fragment)
    )
    import httpx

    try:  # what the sink will send to: refused here, not at every attempt to send
        httpx.Request("POST", endpoint)
    except (httpx.InvalidURL, ValueError) as exc:  # idna's errors are ValueErrors
        detail = scrub_url_password(str(exc), url).rstrip(".")
        raise SinkError(f"sink URL {safe}: {detail}: check the host and path") from None
    from litecdc.webhook_client import host_problem

    if (problem := host_problem(endpoint)) is not None:
        raise SinkError(f"sink URL {safe}: invalid host {parts.hostname!r}: {problem}")
    return WebhookOptions(
        url=endpoint,
        secret=secret,
        timeout=_seconds(ours, "litecdc_timeout", DEFAULT_WEBHOOK_TIMEOUT, safe),
        retries=retries,
    )
