"""rqlite's auth file format and permission rules."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from litecdc.errors import ConfigError
from litecdc.http.auth import CredentialStore, parse_basic_auth

USERS = [
    {"username": "admin", "password": "pw-a", "perms": ["all"]},
    {"username": "reader", "password": "pw-r", "perms": ["query", "status"]},
    {"username": "*", "perms": ["ready"]},
]


@pytest.fixture
def creds() -> CredentialStore:
    return CredentialStore.from_json(json.dumps(USERS).encode())


def test_all_grants_everything(creds: CredentialStore) -> None:
    for perm in ("execute", "query", "load", "backup", "status", "leader-ops"):
        assert creds.allows("admin", "pw-a", perm)
    assert not creds.allows("admin", "wrong", "query")


def test_user_needs_the_permission_and_the_password(creds: CredentialStore) -> None:
    assert creds.allows("reader", "pw-r", "query")
    assert not creds.allows("reader", "pw-r", "execute")
    assert not creds.allows("reader", "pw-a", "query")
    assert not creds.allows("ghost", "pw-r", "query")
    assert not creds.allows(None, None, "query")
    assert creds.allows_all("admin", "pw-a", ("query", "execute"))
    assert not creds.allows_all("reader", "pw-r", ("query", "execute"))


def test_star_grants_to_everyone_without_checking_credentials(creds: CredentialStore) -> None:
    assert creds.allows(None, None, "ready")
    assert creds.allows("reader", "wrong password", "ready")
    assert creds.allows("ghost", "x", "ready")


def test_star_with_all() -> None:
    creds = CredentialStore.from_json(b'[{"username": "*", "perms": ["all"]}]')
    assert creds.allows(None, None, "execute")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "--auth: auth file is not valid JSON"),
        (b"{}", "--auth: auth file must be a JSON array"),
        (b"[1]", "--auth: auth file, entry 1 must be an object"),
        (b'[{"password": "x"}]', "--auth: auth file, entry 1 needs a non-empty string username"),
        (
            b'[{"username": "u", "perms": []}]',
            "--auth: auth file, entry 1 (u): a password is required",
        ),
        (
            b'[{"username": "u", "password": 1}]',
            "--auth: auth file, entry 1 (u): password must be a string",
        ),
        (
            b'[{"username": "u", "password": "p", "perms": "all"}]',
            "--auth: auth file, entry 1 (u): perms must be",
        ),
        (
            b'[{"username": "u", "password": "p", "perms": ["qurey"]}]',
            "--auth: auth file, entry 1 (u): unknown permission(s) qurey; known: all, backup",
        ),
        (
            b'[{"username": "u", "password": "p", "role": "x"}]',
            "--auth: auth file, entry 1 has unknown field(s) role",
        ),
        (  # rqlite keeps the last, and the first one's perms when the last has none
            b'[{"username": "u", "password": "p", "perms": ["all"]}, {"username": "v", '
            b'"password": "q"}, {"username": "u", "password": "p2"}]',
            "--auth: auth file: user 'u' is listed twice (entries 1 and 3): give each user "
            "one entry",
        ),
        (
            b'[{"username": "*", "perms": ["status"]}, {"username": "*", "perms": []}]',
            "--auth: auth file: user '*' is listed twice (entries 1 and 2)",
        ),
    ],
)
def test_bad_files(data: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CredentialStore.from_json(data)
    assert str(info.value).startswith(message)


def test_missing_file(tmp_path: object) -> None:
    with pytest.raises(ConfigError, match="--auth: cannot read"):
        CredentialStore.from_file("/nonexistent/auth.json")


def test_bcrypt_hash_when_bcrypt_is_installed() -> None:
    bcrypt = pytest.importorskip("bcrypt")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    creds = CredentialStore.from_json(
        json.dumps([{"username": "u", "password": hashed, "perms": ["query"]}]).encode()
    )
    assert creds.allows("u", "s3cret", "query")
    assert creds.allows("u", "s3cret", "query")  # cached
    assert not creds.allows("u", "wrong", "query")


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def test_parse_basic_auth() -> None:
    assert parse_basic_auth(_basic("u:p:with:colons")) == ("u", "p:with:colons")
    assert parse_basic_auth(_basic("u:")) == ("u", "")
    assert parse_basic_auth("basic " + base64.b64encode(b"a:b").decode()) == ("a", "b")
    # (authz QA: a non-ASCII character — the header's bytes as Latin-1 — was a 500 with
    # two tracebacks on every endpoint, even where anonymous users may read)
    for header in (None, "", "Bearer x", "Basic !!!", _basic("nocolon"), "Basic \xe9", "Basic é="):
        assert parse_basic_auth(header) == (None, None)


def test_a_user_name_with_a_colon_is_refused() -> None:
    """Authz QA: accepted, and such a user could never log in (basic auth's name ends at
    the first ':')."""
    entry = [{"username": "a:b", "password": "x", "perms": ["all"]}]
    with pytest.raises(ConfigError, match="a user name cannot hold ':'"):
        CredentialStore.from_json(json.dumps(entry).encode())


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'[{"username": "\xff", "password": "x", "perms": ["all"]}]', "can't decode byte 0xff"),
        (b"[" * 100_000, "nested too deeply"),
        (b'[{"username": "a", "password": 1' + b"0" * 5000 + b"}]", "digits"),
    ],
    ids=["not-utf8", "deep", "huge-number"],
)
def test_an_auth_file_that_is_not_json_text_is_a_config_error(data: bytes, why: str) -> None:
    with pytest.raises(ConfigError, match=f"--auth: auth file is not valid JSON: .*{why}"):
        CredentialStore.from_json(data)


def test_a_key_given_twice_in_an_entry_is_refused() -> None:
    """CLI QA: with two "password" keys the last won silently (rqlite's behaviour too);
    which one the author meant cannot be told."""
    with pytest.raises(ConfigError, match="--auth: auth file: key 'password' is given twice"):
        CredentialStore.from_json(b'[{"username": "a", "password": "b", "password": "c"}]')


@pytest.mark.parametrize("special", ["/dev/zero", "directory"])
def test_an_auth_path_that_is_no_regular_file_is_refused(special: str, tmp_path: Path) -> None:
    path = tmp_path if special == "directory" else Path(special)
    kind = "a directory" if special == "directory" else "not a regular file"
    with pytest.raises(ConfigError, match=f"--auth: '{path}' is {kind}"):
        CredentialStore.from_file(path)


@pytest.mark.parametrize("field", ["username", "password"])
def test_text_utf8_cannot_carry_is_refused_at_start(field: str) -> None:
    """Review QA: a password "pw\\ud800" (JSON's escape of a lone surrogate) was taken, and
    every login of that user then answered HTTP 500 (UnicodeEncodeError)."""
    entry = {"username": "a", "password": "pw", "perms": ["all"]}
    entry[field] += "\ud800"
    data = json.dumps([entry]).encode()
    with pytest.raises(ConfigError, match=rf"entry 1\.{field} must be UTF-8 text"):
        CredentialStore.from_json(data)
