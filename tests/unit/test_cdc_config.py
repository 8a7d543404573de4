"""--cdc-config: rqlite's keys accepted, every mistake refused with the key named."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from fakes.certs import make_certs

from litecdc.cdc.config import MIN_RETRY_WAIT, CDCConfig, parse_cdc_config, parse_duration
from litecdc.errors import ConfigError

SCHEMES = ("http", "https", "stdout")


def _file(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "cdc.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_url_and_stdout_take_the_defaults() -> None:
    config = parse_cdc_config("http://127.0.0.1:8000/hook", known_schemes=SCHEMES)
    assert config == CDCConfig(endpoint="http://127.0.0.1:8000/hook")
    assert (config.max_batch_size, config.max_batch_delay, config.transmit_max_retries) == (
        10,
        0.2,
        None,  # retry forever, as rqlite
    )
    assert parse_cdc_config("stdout", known_schemes=SCHEMES).scheme == "stdout"


def test_rqlite_config_file(tmp_path: Path) -> None:
    doc = {
        "endpoint": "https://example.test/cdc",
        "service_id": "svc",
        "row_ids_only": True,
        "table_filter": "^orders$",
        "max_batch_size": 100,
        "max_batch_delay": "50ms",
        "high_watermark_interval": "2s",
        "transmit_timeout": "1m30s",
        "transmit_max_retries": None,
        "transmit_retry_policy": "exponential",
        "transmit_min_backoff": "100ms",
        "transmit_max_backoff": "10s",
        "format": "debezium",
        "hmac_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "headers": {"X-Team": "data"},
        "tls": {"insecure_skip_verify": True, "server_name": "example.test"},
    }
    config = parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)
    assert config.table_filter == re.compile("^orders$")
    assert (config.max_batch_delay, config.transmit_timeout) == (0.05, 90.0)
    assert config.transmit_max_retries is None
    assert [config.backoff(n) for n in (1, 2, 3, 8)] == [0.2, 0.4, 0.8, 10.0]
    assert config.tls.server_name == "example.test" and config.tls.insecure_skip_verify


def test_rqlite_keys_at_their_defaults_are_taken(tmp_path: Path) -> None:
    doc = {"endpoint": "http://x/h", "log_only": False, "high_watermarking_disabled": False}
    assert parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES).endpoint == "http://x/h"


def test_nan_durations_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text('{"endpoint": "http://x/h", "max_batch_delay": NaN}')
    with pytest.raises(ConfigError, match="max_batch_delay must be at most 24h"):
        parse_cdc_config(str(path), known_schemes=SCHEMES)


def test_a_zero_backoff_still_waits_between_attempts() -> None:
    # rqlite accepts 0; retrying a refused endpoint with no wait at all burned a core
    for policy in ("linear", "exponential"):
        config = CDCConfig(
            endpoint="http://x",
            transmit_retry_policy=policy,
            transmit_min_backoff=0.0,
            transmit_max_backoff=0.0,
        )
        assert [config.backoff(n) for n in (1, 2, 30)] == [MIN_RETRY_WAIT] * 3


def test_linear_backoff() -> None:
    config = CDCConfig(endpoint="http://x", transmit_min_backoff=1.0, transmit_max_backoff=2.5)
    assert [config.backoff(n) for n in (1, 2, 3, 4)] == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"endpoint": "http://x/h", "max_batch_sizee": 3}, "unknown key 'max_batch_sizee'"),
        ({}, "endpoint is required"),
        ({"endpoint": "ftp://x/h"}, "endpoint scheme 'ftp' is not supported"),
        ({"endpoint": "not a url"}, "is not a URL"),
        ({"endpoint": "http://x:99999/h"}, "invalid port"),
        ({"endpoint": "http://x/h", "max_batch_size": 0}, "max_batch_size must be at least 1"),
        (
            {"endpoint": "http://x/h", "max_batch_size": "10"},
            "max_batch_size must be an integer, got '10'",
        ),
        (
            {"endpoint": "http://x/h", "max_batch_delay": "soon"},
            "max_batch_delay must be a duration",
        ),
        ({"endpoint": "http://x/h", "transmit_max_retries": 0}, "transmit_max_retries must be at"),
        ({"endpoint": "http://x/h", "transmit_retry_policy": "random"}, "transmit_retry_policy"),
        ({"endpoint": "http://x/h", "table_filter": "("}, "table_filter is not a valid regular"),
        ({"endpoint": "http://x/h", "format": "avro"}, "format must be one of rqlite, debezium"),
        ({"endpoint": "http://x/h", "hmac_secret": "whsec_???"}, "hmac_secret must be"),
        ({"endpoint": "http://x/h", "headers": {"a": 1}}, "headers must be an object"),
        (
            {"endpoint": "http://x/h", "tls": {"ca_cert_file": "/nonexistent.pem"}},
            "tls.ca_cert_file: cannot read file",
        ),
        (
            {"endpoint": "http://x/h", "tls": {"cert_file": "/etc/hostname"}},
            "tls.cert_file and tls.key_file must be given together",
        ),
        ({"endpoint": "http://x/h", "tls": {"verify": True}}, "unknown key tls.verify"),
        # found only when the first delivery's handshake failed (CLI QA)
        (
            {"endpoint": "https://x/h", "tls": {"server_name": "a b"}},
            "tls.server_name must be a host name such as hooks.example.com, got 'a b'",
        ),
        (
            {"endpoint": "http://x/h", "transmit_min_backoff": "5s", "transmit_max_backoff": "1s"},
            "transmit_min_backoff must not exceed",
        ),
        # found by QA: these started, then never delivered (or failed every send)
        ({"endpoint": "http://x/h", "max_batch_delay": "3000000h"}, "must be at most 24h"),
        ({"endpoint": "http://x/h", "transmit_timeout": 1e400}, "must be at most 24h"),
        ({"endpoint": "http://[::1/x"}, "is not a valid URL"),
        ({"endpoint": "http://[zz]/x"}, "is not a valid URL"),
        ({"endpoint": "http://ex ample.com/x"}, "has an invalid host"),
        ({"endpoint": "http://[::1]x/"}, "is not a valid URL"),
        ({"endpoint": "http://user@/x"}, "has an invalid host"),
        # QA: names httpx parses but cannot connect to (encoded only when connecting): the
        # node started, then failed every request
        (
            {"endpoint": "http://a..b/x"},
            "endpoint 'http://a..b/x' has an invalid host 'a..b': a label (the text between "
            "dots) is empty or longer than 63 characters",
        ),
        ({"endpoint": f"http://{'a' * 64}.example/x"}, "longer than 63 characters"),
        ({"endpoint": "http://xn--/x"}, "invalid host 'xn--': Malformed A-label"),
        # QA: the URL's credentials went as basic auth in place of the configured header
        (
            {"endpoint": "http://u:p@x/h", "headers": {"authorization": "Bearer t"}},
            "headers: authorization is given, and the endpoint holds credentials",
        ),
        (
            {"endpoint": "http://u@x/h", "headers": {"Authorization": "Bearer t"}},
            "headers: Authorization is given",
        ),
        ({"endpoint": "http://x/h", "headers": {"X-A": "\u00e9"}}, "must be printable ASCII"),
        ({"endpoint": "http://x/h", "headers": {"X-A": "a\nb"}}, "holds a line break"),
        ({"endpoint": "http://x/h", "headers": {"X A": "b"}}, "not a valid HTTP header name"),
        (
            {"endpoint": "http://x/h", "headers": {"X-Team": "a", "x-team": "b"}},
            "headers: 'x-team' is given twice (as 'X-Team' too; header names ignore case)",
        ),
        (
            {"endpoint": "http://x/h", "headers": {"content-type": "text/plain"}},
            "Content-Type is set by litecdc",
        ),
        # QA: a JSON file's endpoint was not stripped (the URL parser strips, the HTTP
        # client does not: every send failed); port 0 was taken (nothing listens there)
        ({"endpoint": " http://x/h"}, "endpoint ' http://x/h' has white space before or after"),
        ({"endpoint": "http://x/h\n"}, "has white space before or after it"),
        ({"endpoint": "http://x:0/h"}, "endpoint 'http://x:0/h' has port 0"),
        ({"endpoint": "http://x/h", "log_only": True}, "log_only: true is not supported"),
        (
            {"endpoint": "http://x/h", "high_watermarking_disabled": True},
            "high_watermarking_disabled: true is not supported",
        ),
    ],
)
def test_invalid_configurations_name_the_key(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        parse_cdc_config(str(tmp_path / "missing.json"), known_schemes=SCHEMES)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        parse_cdc_config(str(tmp_path / "bad.json"), known_schemes=SCHEMES)


def test_files_not_utf8_or_with_a_key_given_twice_are_refused(tmp_path: Path) -> None:
    """QA: a file that is not UTF-8 ended start-up in a traceback (UnicodeDecodeError), and
    a key given twice silently took the last value."""
    (tmp_path / "latin1.json").write_bytes(
        '{"endpoint": "http://x/h", "service_id": "café"}'.encode("latin-1")
    )
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 0xe9 at offset 45\)"):
        parse_cdc_config(str(tmp_path / "latin1.json"), known_schemes=SCHEMES)
    (tmp_path / "twice.json").write_text('{"endpoint": "http://a/h", "endpoint": "http://b/h"}')
    with pytest.raises(ConfigError, match="key 'endpoint' is given twice"):
        parse_cdc_config(str(tmp_path / "twice.json"), known_schemes=SCHEMES)
    (tmp_path / "nested.json").write_text(
        '{"endpoint": "http://a/h", "headers": {"X-A": "1", "X-A": "2"}}'
    )
    with pytest.raises(ConfigError, match="key 'X-A' is given twice"):
        parse_cdc_config(str(tmp_path / "nested.json"), known_schemes=SCHEMES)
    (tmp_path / "utf8.json").write_text(
        '{"endpoint": "http://x/h", "service_id": "café"}', encoding="utf-8"
    )
    assert parse_cdc_config(str(tmp_path / "utf8.json"), known_schemes=SCHEMES).service_id == (
        "café"
    )


def test_unreadable_certificate_contents_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    doc = {"endpoint": "https://x/h", "tls": {"ca_cert_file": str(tmp_path / "ca.pem")}}
    with pytest.raises(ConfigError, match=r"tls\.ca_cert_file: cannot load CA certificates"):
        parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("200ms", 0.2),
        ("5s", 5.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        (3_000_000_000, 3.0),
        ("250us", 0.00025),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text, "k") == pytest.approx(seconds)


@pytest.mark.parametrize("spelling", ["exponential", "ExponentialRetryPolicy", 1])
def test_rqlite_spellings_of_the_retry_policy(tmp_path: Path, spelling: object) -> None:
    doc = {"endpoint": "http://x/h", "transmit_retry_policy": spelling}
    assert parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES).transmit_retry_policy == (
        "exponential"
    )


# --- QA round: Go's duration syntax in full (time.ParseDuration) ---------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("+0", 0.0),
        ("-0", 0.0),
        ("+1s", 1.0),
        ("0s", 0.0),
        ("1.s", 1.0),
        (".5s", 0.5),
        ("1h2m3.5s", 3723.5),
        ("2h45m", 9900.0),
        ("100ns", 1e-7),
        ("1\u00b5s", 1e-6),  # micro sign
        ("1\u03bcs", 1e-6),  # Greek mu: Go accepts both
        ("3us", 3e-6),
        ("1.5ms500us", 0.002),
        ("0.000000001s", 1e-9),
        ("24h", 86_400.0),
    ],
)
def test_go_duration_syntax_is_accepted(text: str, seconds: float) -> None:
    assert parse_duration(text, "k") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "invalid duration"),
        ("+", "invalid duration"),
        ("5", "missing unit"),
        ("1.5", "missing unit"),
        (".s", "invalid duration"),
        ("-.s", "invalid duration"),
        ("s", "invalid duration"),
        ("1sec", "unknown unit 'sec'"),
        ("5S", "unknown unit 'S'"),
        ("1e3s", "unknown unit 'e'"),
        (" 5s", "invalid duration"),  # Go allows no spaces
        ("5s ", "unknown unit 's '"),
        ("1m 30s", "unknown unit 'm '"),
        ("\u0661s", "invalid duration"),  # an Arabic-Indic digit is not [0-9]
    ],
)
def test_what_go_refuses_is_refused(text: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"got {text!r} ({reason}")):
        parse_duration(text, "max_batch_delay")


def test_negative_durations_are_refused_and_zero_is_a_duration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transmit_min_backoff must not be negative"):
        parse_duration("-1s", "transmit_min_backoff")
    doc = {"endpoint": "http://x/h", "max_batch_delay": "0", "transmit_min_backoff": "+0"}
    config = parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)
    assert (config.max_batch_delay, config.transmit_min_backoff) == (0.0, 0.0)
    with pytest.raises(ConfigError, match="transmit_timeout must be more than zero"):
        parse_cdc_config(
            _file(tmp_path, {"endpoint": "http://x/h", "transmit_timeout": "0"}),
            known_schemes=SCHEMES,
        )


# --- QA round: headers the HTTP client owns ----------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Content-Length",
        "Transfer-Encoding",
        "host",
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Upgrade",
        "Expect",
        "Content-Encoding",
    ],
)
def test_headers_that_frame_the_request_or_control_the_connection_are_refused(
    tmp_path: Path, name: str
) -> None:
    doc = {"endpoint": "http://x/h", "headers": {"X-Team": "data", name: "1"}}
    with pytest.raises(ConfigError, match=rf"^cdc config: headers: {name} cannot be configured: "):
        parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)


def test_signature_headers_are_refused_when_litecdc_signs(tmp_path: Path) -> None:
    headers = {"Webhook-Id": "x"}
    doc = {"endpoint": "http://x/h", "hmac_secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}
    with pytest.raises(
        ConfigError, match="headers: Webhook-Id cannot be configured: litecdc sets it"
    ):
        parse_cdc_config(_file(tmp_path, {**doc, "headers": headers}), known_schemes=SCHEMES)
    unsigned = {"endpoint": "http://x/h", "headers": headers}  # then it is just a header
    assert parse_cdc_config(_file(tmp_path, unsigned), known_schemes=SCHEMES).headers == headers


# --- QA round: credentials never in a message ---------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "shown", "problem"),
    [
        ("http://admin:s3cret@127.0.0.1:99999/h", "http://127.0.0.1:99999/h", "invalid port"),
        ("http://admin:s3cret@127.0.0.1:ab/h", "http://127.0.0.1:ab/h", "not a valid URL"),
        ("http://admin:s3cret@ex ample/h", "http://ex ample/h", "invalid host"),
        ("http://admin:s3cret@[::1/h", "http://[::1/h", "not a valid URL"),
        ("http://admin:s3cret@/h", "http:///h", "invalid host"),
        ("ftp://admin:s3cret@host/h", "ftp://host/h", "scheme 'ftp' is not supported"),
        # a raw "#" or "/" in the password ends the authority early for every parser
        ("http://admin:s3#cret@host:8/h", "http://…@host:8/h", "not a valid URL"),
        ("http://admin:s3/cret@host/h", "http://…@host/h", "not a valid URL"),
        ("http:admin:s3cret@host/h", "…@host/h", "is not a URL"),
    ],
)
def test_credentials_never_appear_in_error_messages(
    tmp_path: Path, endpoint: str, shown: str, problem: str
) -> None:
    for value in (endpoint, _file(tmp_path, {"endpoint": endpoint})):
        if "://" not in value and not value.endswith(".json"):
            continue  # (without "//" the command line takes it for a file path)
        with pytest.raises(ConfigError) as caught:
            parse_cdc_config(value, known_schemes=SCHEMES)
        message = str(caught.value)
        assert problem in message and "s3" not in message and "cret" not in message
        if "scheme" not in problem:
            assert repr(shown) in message, message


def test_a_url_without_slashes_taken_for_a_file_shows_no_credentials() -> None:
    with pytest.raises(ConfigError, match="cannot read") as caught:
        parse_cdc_config("http:admin:s3cret@host/h", known_schemes=SCHEMES)
    assert "s3cret" not in str(caught.value) and "host/h" in str(caught.value)


@pytest.mark.parametrize(
    ("endpoint", "shown"),
    [
        ("http://u:p@[::1]:9/hook", "http://[::1]:9/hook"),
        ("https://u@[fe80::1%25eth0]/x?a=b@c#f", "https://[fe80::1%25eth0]/x?a=…#f"),
        # a webhook service's key in the query (security QA: it was in the log, /status)
        ("https://h/hook?token=T0KEN&flag&code=", "https://h/hook?token=…&flag&code="),
        ("http://host/users/bob@example.com", "http://host/users/bob@example.com"),
        ("http://a:b@HOST:80/", "http://HOST:80/"),
        ("stdout", "stdout"),
    ],
)
def test_redaction_keeps_the_rest_of_the_url_as_written(endpoint: str, shown: str) -> None:
    from litecdc.cdc.config import redact_endpoint

    assert redact_endpoint(endpoint) == shown


# --- QA round: an empty value, and tls without TLS ---------------------------------------


@pytest.mark.parametrize(("value", "word"), [("", "empty"), ("   ", "blank")])
def test_an_empty_cdc_config_is_refused(value: str, word: str) -> None:
    with pytest.raises(ConfigError, match=f"^--cdc-config is {word}: give an http"):
        parse_cdc_config(value, known_schemes=SCHEMES)


@pytest.mark.parametrize("endpoint", ["http://x/h", "HTTP://x/h", "stdout"])
def test_tls_settings_for_an_endpoint_without_tls_are_refused(
    tmp_path: Path, endpoint: str
) -> None:
    doc = {"endpoint": endpoint, "tls": {"insecure_skip_verify": True}}
    with pytest.raises(ConfigError, match=r"tls is set but the endpoint .* does not use TLS"):
        parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)
    # an empty section sets nothing, so nothing would be ignored
    empty = {"endpoint": endpoint, "tls": {"ca_cert_file": None}}
    assert parse_cdc_config(_file(tmp_path, empty), known_schemes=SCHEMES).endpoint == endpoint


# --- rqlite's other TLS spellings ---------------------------------------------------------


def test_rqlites_tls_spellings_are_taken(tmp_path: Path) -> None:
    """rqlite versions spell TLS settings two other ways: its JSON config's tls object
    (client_cert, client_key, ca_cert, skip_verify) and the keys at the top level. Both
    were refused as unknown keys, though docs/cdc.md says an rqlite file works unchanged."""
    certs = make_certs(tmp_path / "certs")
    files = {"ca": certs.ca_cert, "cert": certs.client_cert, "key": certs.client_key}
    ours = {"ca_cert_file": str(files["ca"]), "cert_file": str(files["cert"]),
            "key_file": str(files["key"]), "insecure_skip_verify": True}  # fmt: skip
    json_config = {"ca_cert": str(files["ca"]), "client_cert": str(files["cert"]),
                   "client_key": str(files["key"]), "skip_verify": True}  # fmt: skip
    expected = parse_cdc_config(
        _file(tmp_path, {"endpoint": "https://x/h", "tls": ours}), known_schemes=SCHEMES
    ).tls
    assert expected is not None and expected.insecure_skip_verify
    for doc in (
        {"endpoint": "https://x/h", "tls": json_config},
        {"endpoint": "https://x/h", **ours, "server_name": None},
    ):
        assert parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES).tls == expected


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls": {"ca_cert": "a", "ca_cert_file": "b"}}, "tls.ca_cert_file is given twice"),
        ({"server_name": "x", "tls": {"server_name": "y"}}, "server_name is given twice"),
        ({"cert_file": "x", "tls": "yes"}, "tls must be an object"),
        ({"serviceid": "x"}, "known keys: .*high_watermarking_disabled.*log_only"),
    ],
)
def test_tls_given_twice_or_unknown_keys_are_refused(
    tmp_path: Path, doc: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cdc_config(_file(tmp_path, {"endpoint": "https://x/h", **doc}), known_schemes=SCHEMES)


def test_files_that_would_crash_or_stall_the_parser_are_refused(tmp_path: Path) -> None:
    """CLI QA: /dev/zero was read until memory ran out, a FIFO waited forever, deep
    nesting and a 5000-digit number ended in tracebacks, and a lone surrogate in
    service_id was accepted and then stopped delivery for good."""
    with pytest.raises(ConfigError, match="'/dev/zero' is not a regular file"):
        parse_cdc_config("/dev/zero", known_schemes=SCHEMES)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=f"'{fifo}' is not a regular file"):
        parse_cdc_config(str(fifo), known_schemes=SCHEMES)
    with pytest.raises(ConfigError, match=f"'{tmp_path}' is a directory"):
        parse_cdc_config(str(tmp_path), known_schemes=SCHEMES)
    big = tmp_path / "big.json"
    big.write_text('{"endpoint": "stdout", "service_id": "' + "x" * (1 << 20) + '"}')
    with pytest.raises(ConfigError, match="more than a configuration file may"):
        parse_cdc_config(str(big), known_schemes=SCHEMES)
    deep = tmp_path / "deep.json"
    deep.write_text('{"endpoint": "stdout", "headers": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ConfigError, match="is not valid JSON: it is nested too deeply"):
        parse_cdc_config(str(deep), known_schemes=SCHEMES)
    huge = tmp_path / "huge.json"
    huge.write_text('{"endpoint": "stdout", "max_batch_size": 1' + "0" * 5000 + "}")
    with pytest.raises(ConfigError, match=r"is not valid JSON: .*digits"):
        parse_cdc_config(str(huge), known_schemes=SCHEMES)
    surrogate = tmp_path / "surrogate.json"
    surrogate.write_text('{"endpoint": "stdout", "service_id": "\\ud800"}')
    with pytest.raises(ConfigError, match=r"service_id must be UTF-8 text, got '\\\\ud800'"):
        parse_cdc_config(str(surrogate), known_schemes=SCHEMES)
    with pytest.raises(ConfigError, match="must be UTF-8 text"):
        parse_cdc_config("http://127.0.0.1:1/h\udcff", known_schemes=SCHEMES)


@pytest.mark.parametrize(
    ("key", "number", "fine", "seconds"),
    [
        ("transmit_timeout", 5, 1_000_000, 0.001),
        ("max_batch_delay", 200, 0, 0.0),
        ("transmit_max_backoff", 999_999.5, 2_000_000_000, 2.0),
    ],
)
def test_a_number_below_a_millisecond_is_refused_as_a_likely_mistake(
    tmp_path: Path, key: str, number: float, fine: int, seconds: float
) -> None:
    """QA: ``"transmit_timeout": 5`` (meant as seconds) was taken as 5 ns; the node started,
    every request timed out at once and nothing was ever delivered."""
    doc = {"endpoint": "http://x/h", key: number}
    with pytest.raises(ConfigError, match=rf"{key} is {number!r}: a JSON number is nanoseconds"):
        parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES)
    # zero, and a millisecond or more in nanoseconds, still read as rqlite reads them
    doc[key] = fine
    assert getattr(parse_cdc_config(_file(tmp_path, doc), known_schemes=SCHEMES), key) == seconds
