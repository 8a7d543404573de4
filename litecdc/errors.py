"""The whole litecdc exception tree, and how each error maps to an HTTP status.

LitecdcError
├── ConfigError                 invalid configuration (CLI, file, environment)
├── RequestError                malformed client input: bad JSON, wrong types, unknown parameters
│   ├── BodyTooLargeError
│   └── LoadError               /db/load got something that is neither SQLite nor SQL text
├── AuthError                   missing or wrong credentials
│   └── PermissionDeniedError   authenticated, but the user lacks the permission
├── StatementError              one SQL statement failed (reported per statement, like rqlite)
│   ├── NonDeterministicError   the statement cannot be replayed identically; refused before commit
│   └── ForbiddenStatementError transaction control, ATTACH, writes to internal tables…
├── JournalError
│   ├── ModeError               the call is not allowed in the journal's current mode
│   ├── SnapshotUnavailableError  follower_commit before its dependency is applied
│   ├── DuplicateCidError       follower_commit of a cid the journal already has
│   └── TruncateError           truncation that would break cid order or empty the journal
├── NotReadyError               the node cannot answer yet (e.g. min_cid not applied): 503
├── OutcomeUnknownError         a write may or may not have been committed (do not blindly
│                               retry: check with min_cid / the journal): 504
└── NotLeaderError              a write reached a node that does not lead (the HTTP layer
                                forwards it to the leader, or redirects); the cluster's
                                errors (litecdc.cluster) are LitecdcErrors too
"""

from __future__ import annotations


class LitecdcError(Exception):
    """Base of every error litecdc raises on purpose."""

    http_status = 500


class ConfigError(LitecdcError):
    http_status = 400


class RequestError(LitecdcError):
    http_status = 400


class BodyTooLargeError(RequestError):
    http_status = 413


class AuthError(LitecdcError):
    http_status = 401


class PermissionDeniedError(AuthError):
    http_status = 403


class StatementError(LitecdcError):
    http_status = 400


class NonDeterministicError(StatementError):
    pass


class ForbiddenStatementError(StatementError):
    pass


class JournalError(LitecdcError):
    http_status = 409


class ModeError(JournalError):
    pass


class SnapshotUnavailableError(JournalError):
    def __init__(self, snapshot: int, available: int) -> None:
        super().__init__(
            f"snapshot {snapshot} is not available yet (available snapshot is {available}): "
            "apply the transactions it depends on first"
        )
        self.snapshot = snapshot
        self.available = available


class DuplicateCidError(JournalError):
    pass


class TruncateError(JournalError):
    pass


class LoadError(RequestError):
    pass


class NotReadyError(LitecdcError):
    http_status = 503


class OutcomeUnknownError(LitecdcError):
    """A write may have been committed: retrying it blindly could apply it twice."""

    http_status = 504


class NotLeaderError(LitecdcError):
    """The operation needs the leader; this node is not it. ``leader_address`` is the
    leader's HTTP base URL when one is known."""

    http_status = 503

    def __init__(
        self, message: str, *, leader_id: str | None = None, leader_address: str | None = None
    ) -> None:
        super().__init__(message)
        self.leader_id = leader_id
        self.leader_address = leader_address


def http_status_for(error: BaseException) -> int:
    """The HTTP status an error maps to; anything unexpected is a 500."""
    if isinstance(error, LitecdcError):
        return error.http_status
    return 500
