"""The whole litecdc exception tree, and how each error maps to an HTTP status.

LitecdcError
├── ConfigError                 invalid configuration (CLI, file, environment)
│   └── DataFileError           the data directory's SQLite file is unusable (not a
│                               database, corrupt, a newer litecdc's data format)
├── RequestError                malformed client input: bad JSON, wrong types, unknown parameters
│   ├── BodyTooLargeError
│   └── LoadError               /db/load: neither SQLite nor SQL text, or the load failed
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
├── OtherHistoryError           a min_cid beyond a standalone node's whole history: the cid
│                               came from another history (a restored backup): 409
├── OutcomeUnknownError         a write may or may not have been committed (do not blindly
│                               retry: check with min_cid / the journal): 504
├── NotLeaderError              a write reached a node that does not lead (the HTTP layer
│                               forwards it to the leader, or redirects); the cluster's
│                               errors (litecdc.cluster) are LitecdcErrors too
├── NotFoundError               a named table or subscription does not exist: 404
├── TableReshapedError          a table's changes read from before its last reshape: 409
├── DataTypeError               a stored value does not fit its column's mirrored type, or
│                               text that is not UTF-8 in a dump: 422
├── PositionUnavailableError    changes after the asked cid were pruned (retention cap):
│                               the subscriber must re-snapshot: 410
└── PipelineError               the Spark pipeline (litecdc.pipeline)
    ├── SourceError             the source node is unreachable or refused a request
    ├── SinkError               a sink is unreachable, misconfigured (bad URL) or refused
    │   └── SchemaMismatchError a source column/value the sink cannot take
    │       └── UnstorableKeyError  a row's key longer than the sink's key column
    │                               (pipeline/sinks/base.py; MariaDB)
    └── MetadataError           the metadata store (subscriptions, progress)
"""

from __future__ import annotations


class LitecdcError(Exception):
    """Base of every error litecdc raises on purpose."""

    http_status = 500


class ConfigError(LitecdcError):
    http_status = 400


class DataFileError(ConfigError):
    """The node's SQLite file cannot be used: not a database, corrupt, or another layout
    (a configuration error: the node was pointed at the wrong data directory)."""


class RequestError(LitecdcError):
    http_status = 400


class BodyTooLargeError(RequestError):
    http_status = 413


class BodyTimeoutError(RequestError):
    """A request body that stopped arriving (a client that hung, or holds connections
    open on purpose, a "slowloris")."""

    http_status = 408


class UnsupportedEncodingError(RequestError):
    """A request body in a Content-Encoding litecdc does not decode (gzip…), as Go's
    net/http does not: refused as such rather than as malformed JSON."""

    http_status = 415


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


class OtherHistoryError(LitecdcError):
    """A cid the caller read elsewhere is beyond this standalone node's whole history:
    waiting cannot bring it (the node is its history's only writer)."""

    http_status = 409


class StorageFullError(LitecdcError):
    """The node's disk has no room left (SQLite's "database or disk is full"): the node's
    environment, not the request — nothing it asked for was done."""

    http_status = 507


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


class TableReshapedError(LitecdcError):
    """A table's changes asked for reach back before its last reshape: their images have
    another shape than its description."""

    http_status = 409


class UnloggedChangesError(LitecdcError):
    """A table's changes asked for reach across a commit that changed its rows without
    change events (db/reshape.py): they cannot bring a copy from before it up to date."""

    http_status = 409


class NotFoundError(LitecdcError):
    """A named table, subscription or other object does not exist."""

    http_status = 404


class DataTypeError(LitecdcError):
    """A value stored in a column does not fit the type the column is mirrored as."""

    http_status = 422


class PositionUnavailableError(LitecdcError):
    """The change log no longer holds what comes after the asked position."""

    http_status = 410

    def __init__(self, message: str, *, pruned_cid: int = 0) -> None:
        super().__init__(message)
        self.pruned_cid = pruned_cid


class PipelineError(LitecdcError):
    """An error of the Spark pipeline (CLI: exit status 1 with this message)."""


class SourceError(PipelineError):
    """The source node is unreachable or refused a request."""


class SinkError(PipelineError):
    """A sink is unreachable, misconfigured or refused a write."""


class SinkUnreachableError(SinkError):
    """A sink's server did not answer: no connection, or none that answers (a server that
    answered with a refusal — credentials, too many connections — is not unreachable)."""


class SchemaMismatchError(SinkError):
    """A source column or value the sink cannot take as it is."""


class MetadataError(PipelineError):
    """The metadata store (subscriptions, progress) failed or was asked something invalid."""


class UnknownSubscriptionError(MetadataError):
    """No subscription of that name (never made, or removed meanwhile)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown subscription {name!r}")
        self.name = name


def http_status_for(error: BaseException) -> int:
    """The HTTP status an error maps to; anything unexpected is a 500."""
    if isinstance(error, LitecdcError):
        return error.http_status
    return 500
