"""Basic auth with per-user permissions, reading rqlite's ``-auth`` file format.

The file is a JSON array of users::

    [
      {"username": "admin", "password": "secret", "perms": ["all"]},
      {"username": "reader", "password": "$2a$10$...", "perms": ["query", "ready"]},
      {"username": "*", "perms": ["status", "ready"]}
    ]

The rules are rqlite's (``auth/credential_store.go``, ``AA``):

* a permission granted to the user ``*`` is granted to every request, with or without
  credentials, and then no password is checked;
* otherwise the request must carry HTTP Basic credentials whose password matches, either
  as plain text or as a bcrypt hash (checked when the ``bcrypt`` package is installed);
* the user then needs the permission itself or ``all``.

A request that fails any step gets HTTP 401, as rqlite answers (rqlite does not tell a
wrong password from a missing permission).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import importlib
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litecdc.config_files import decode_json, read_config_file
from litecdc.errors import ConfigError

log = logging.getLogger("litecdc.http")

__all__ = ["ALL_USERS", "PERMISSIONS", "CredentialStore", "parse_basic_auth"]

ALL_USERS = "*"
PERM_ALL = "all"
#: rqlite's permission names (docs: Security guide); litecdc checks the ones its endpoints use.
PERMISSIONS = frozenset(
    {
        "all",
        "execute",
        "query",
        "load",
        "backup",
        "snapshot",
        "status",
        "ready",
        "join",
        "join-read-only",
        "remove",
        "leader-ops",
        "ui",
    }
)
_CACHE_LIMIT = 1024


@dataclass(frozen=True, slots=True)
class _User:
    password: str | None
    perms: frozenset[str]


class CredentialStore:
    """The users of an auth file, and the permission check for one request."""

    def __init__(self, users: dict[str, _User]) -> None:
        self._users = users
        self._checked: dict[tuple[str, bytes], bool] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path) -> CredentialStore:
        return cls.from_json(read_config_file(Path(path), "--auth"), source=str(path))

    @classmethod
    def from_json(cls, data: bytes, *, source: str = "auth file") -> CredentialStore:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--auth: {source} is not valid JSON: {exc}") from exc
        # (a key given twice in an entry is refused: rqlite keeps the last, and which
        # password the author meant cannot be told — QA)
        doc = decode_json(text, f"--auth: {source}")
        if not isinstance(doc, list):
            raise ConfigError(
                f"--auth: {source} must be a JSON array of "
                '{"username", "password", "perms"} objects'
            )
        users: dict[str, _User] = {}
        entry_of: dict[str, int] = {}
        for i, entry in enumerate(doc, start=1):
            username, user = _parse_user(entry, i, source)
            if username in entry_of:
                # rqlite keeps the last (and, when it has no perms, the previous one's
                # perms): which one the author meant cannot be told
                raise ConfigError(
                    f"--auth: {source}: user {username!r} is listed twice (entries "
                    f"{entry_of[username]} and {i}): give each user one entry"
                )
            entry_of[username] = i
            users[username] = user
        return cls(users)

    def allows(self, username: str | None, password: str | None, perm: str) -> bool:
        """rqlite's AA: authenticate (unless ``*`` has the permission) and authorize."""
        if self._has_any(ALL_USERS, perm):
            return True
        if not username:
            return False
        if not self._check_password(username, password or ""):
            return False
        return self._has_any(username, perm)

    def allows_all(self, username: str | None, password: str | None, perms: Iterable[str]) -> bool:
        return all(self.allows(username, password, perm) for perm in perms)

    def _has_any(self, username: str, perm: str) -> bool:
        for name in (username, ALL_USERS):
            user = self._users.get(name)
            if user is not None and (perm in user.perms or PERM_ALL in user.perms):
                return True
        return False

    def needs_hashing(self, username: str | None, password: str | None) -> bool:
        """Whether checking this user's password means running bcrypt (slow: the caller
        runs it on a thread), rather than a comparison or a remembered answer."""
        user = self._users.get(username or "")
        if user is None or user.password is None or not user.password.startswith("$2"):
            return False
        return _cache_key(username or "", password or "") not in self._checked

    def _check_password(self, username: str, password: str) -> bool:
        user = self._users.get(username)
        if user is None or user.password is None:
            return False
        key = _cache_key(username, password)
        if key in self._checked:
            return True
        ok = _password_matches(user.password, password)
        if ok:
            # only passwords that matched are remembered: wrong guesses flushed the cache
            # (QA), and each costs the guesser a bcrypt run anyway
            with self._lock:
                if len(self._checked) >= _CACHE_LIMIT:
                    self._checked.clear()
                self._checked[key] = True
        return ok


def _cache_key(username: str, password: str) -> tuple[str, bytes]:
    return username, hashlib.sha256(password.encode()).digest()


def _parse_user(entry: Any, index: int, source: str) -> tuple[str, _User]:
    where = f"--auth: {source}, entry {index}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be an object with username, password and perms")
    unknown = set(entry) - {"username", "password", "perms"}
    if unknown:
        raise ConfigError(f"{where} has unknown field(s) {', '.join(sorted(unknown))}")
    username = entry.get("username")
    if not isinstance(username, str) or not username:
        raise ConfigError(f"{where} needs a non-empty string username")
    if ":" in username:
        # (authz QA: accepted, and such a user could never log in)
        raise ConfigError(
            f"{where} ({username}): a user name cannot hold ':' — HTTP basic auth sends "
            "'user:password' and the name ends at the first ':'"
        )
    password = entry.get("password")
    if password is not None and not isinstance(password, str):
        raise ConfigError(f"{where} ({username}): password must be a string")
    if password is None and username != ALL_USERS:
        raise ConfigError(f"{where} ({username}): a password is required")
    perms = entry.get("perms", [])
    if not isinstance(perms, list) or not all(isinstance(p, str) for p in perms):
        raise ConfigError(f"{where} ({username}): perms must be an array of strings")
    unknown_perms = sorted(set(perms) - PERMISSIONS)
    if unknown_perms:
        raise ConfigError(
            f"{where} ({username}): unknown permission(s) {', '.join(unknown_perms)}; "
            f"known: {', '.join(sorted(PERMISSIONS))}"
        )
    if password is not None and password.startswith("$2") and _bcrypt() is None:
        log.warning(
            "auth: the password of %s looks like a bcrypt hash, but the bcrypt package is "
            "not installed; it will only match as plain text",
            username,
        )
    return username, _User(password, frozenset(perms))


def _bcrypt() -> Any:
    """The optional ``bcrypt`` module, or None when it is not installed."""
    try:
        return importlib.import_module("bcrypt")
    except ImportError:
        return None


def _password_matches(stored: str, given: str) -> bool:
    if hmac.compare_digest(stored.encode(), given.encode()):
        return True
    bcrypt = _bcrypt() if stored.startswith("$2") else None
    if bcrypt is not None:
        try:
            return bool(bcrypt.checkpw(given.encode(), stored.encode()))
        except ValueError:
            return False
    return False


def parse_basic_auth(header: str | None) -> tuple[str | None, str | None]:
    """Username and password from an ``Authorization: Basic`` header; (None, None) if absent
    or malformed (such a request counts as anonymous, as in Go's ``Request.BasicAuth``)."""
    if not header:
        return None, None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        # (ValueError: a non-ASCII character in the header, which b64decode refuses so —
        # it was a 500 with two tracebacks on every endpoint, authz QA; UnicodeDecodeError
        # is one too)
        return None, None
    username, sep, password = decoded.partition(":")
    if not sep:
        return None, None
    return username, password
