"""The etcd v3 client of litecdc's cluster: the only module that talks to etcd.

It speaks etcd's gRPC API through the protobuf messages and stubs that ``etcd-sdk-python``
(``pyetcd.etcdrpc``) ships, and does the rest itself, because the cluster needs
behaviour that library's client does not have: a timeout on every request (a SIGSTOPped
etcd member accepts connections and never answers), failover that only *prefers* members
that did not fail recently instead of refusing them for 300 s, the watch's compacted
revision reported at once as an error, re-authentication when etcd forgets a token, and
the response header's revision from every write.

Usage::

    client = EtcdClient(EtcdSettings(endpoints=["127.0.0.1:2379", "127.0.0.1:22379"]))
    revision = client.put("/litecdc/c1/x", b"1")
    result = client.txn(
        [Compare.created_at("/litecdc/c1/leader", 42)],     # the guard
        [Put("/litecdc/c1/log/00000000000000000001", b"entry")],
    )
    with client.watch("/litecdc/c1/log/", prefix=True, start_revision=revision) as watch:
        for batch in watch:                                  # one batch per watch response
            ...                                              # CompactedError if too old

Errors (every one a :class:`litecdc.errors.LitecdcError`)::

    ClusterError
    ├── EtcdUnavailableError    no etcd member answered in time; retry later
    ├── CompactedError          the revision asked for was compacted away (.compact_revision)
    ├── EtcdRequestError        etcd refused the request
    │   ├── EtcdAuthError       missing or wrong user/password, or no permission
    │   ├── EtcdNoSpaceError    etcd's space quota is exhausted (NOSPACE alarm)
    │   └── LeaseNotFoundError  the lease expired or was revoked

(A write that needs the leader raises litecdc.errors.NotLeaderError, which the HTTP layer
forwards.)
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import grpc
from pyetcd import etcdrpc
from pyetcd.etcdrpc import kv_pb2

from litecdc.errors import ConfigError, LitecdcError

log = logging.getLogger("litecdc.cluster")

T = TypeVar("T")

#: default seconds one etcd request may take before its member counts as failed
DEFAULT_REQUEST_TIMEOUT = 5.0
#: default seconds a failed member is tried only after the others
DEFAULT_RETRY_AFTER = 2.0
#: default largest gRPC message received: catch-up watch responses exceed gRPC's 4 MiB
DEFAULT_MAX_RECEIVE_BYTES = 512 * 1024 * 1024
#: default largest gRPC message sent (etcd itself takes requests up to 1.5 MiB)
DEFAULT_MAX_SEND_BYTES = 16 * 1024 * 1024
#: default seconds one member's defragmentation may take (it rewrites etcd's whole file)
DEFAULT_DEFRAGMENT_TIMEOUT = 60.0
#: HTTP/2 pings find dead connections under long watches; etcd refuses pings < 5 s apart
GRPC_KEEPALIVE_MS = 10_000
GRPC_KEEPALIVE_TIMEOUT_MS = 5_000


# --- errors ------------------------------------------------------------------------------


class ClusterError(LitecdcError):
    """Base of the cluster's errors: etcd could not do what was asked."""

    http_status = 503


class EtcdUnavailableError(ClusterError):
    """No etcd member answered in time (down, paused, partitioned or without quorum)."""


class CompactedError(ClusterError):
    """The revision asked for is older than etcd's compaction point."""

    http_status = 410

    def __init__(self, compact_revision: int | None, what: str = "watch") -> None:
        at = f" (etcd keeps history from revision {compact_revision})" if compact_revision else ""
        super().__init__(
            f"{what}: the revision asked for was compacted away{at}: "
            "re-bootstrap from a snapshot and resume from its revision"
        )
        self.compact_revision = compact_revision


class EtcdRequestError(ClusterError):
    """etcd refused the request."""

    http_status = 500


class EtcdAuthError(EtcdRequestError):
    http_status = 500


class EtcdNoSpaceError(EtcdRequestError):
    pass


class LeaseNotFoundError(EtcdRequestError):
    pass


# --- settings and values -----------------------------------------------------------------


@dataclass(frozen=True)
class EtcdSettings:
    """How to reach etcd. Endpoints are ``host:port`` (or ``http(s)://host:port``)."""

    endpoints: Sequence[str]
    #: CA certificate (PEM) that signed the etcd members' certificates; enables TLS
    ca_cert: Path | str | None = None
    #: client certificate and key (PEM) for etcd's ``--client-cert-auth``
    client_cert: Path | str | None = None
    client_key: Path | str | None = None
    #: etcd user and password (etcd's ``auth enable``); never logged
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    #: seconds one request may take; default 5
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    #: seconds a member that failed is tried only after the others; default 2
    retry_after: float = DEFAULT_RETRY_AFTER
    #: largest gRPC message received, bytes; default 512 MiB
    max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    #: largest gRPC message sent, bytes; default 16 MiB
    max_send_bytes: int = DEFAULT_MAX_SEND_BYTES

    def validate(self) -> None:
        if not self.endpoints:
            raise ConfigError("etcd: no endpoint given (example: --etcd 127.0.0.1:2379)")
        for endpoint in self.endpoints:
            address = _strip_scheme(endpoint)
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"etcd: endpoint {endpoint!r} is not host:port")
        if (self.client_cert is None) != (self.client_key is None):
            raise ConfigError("etcd: give both the client certificate and its key, or neither")
        if (self.user is None) != (self.password is None):
            raise ConfigError("etcd: give both the user and the password, or neither")
        if self.request_timeout <= 0:
            raise ConfigError("etcd: the request timeout must be positive")

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None or any(
            e.lower().startswith("https://") for e in self.endpoints
        )


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class RangeResult:
    kvs: list[KeyValue]
    #: the store's revision when the range was read
    revision: int
    #: more keys matched than ``limit`` allowed
    more: bool


@dataclass(frozen=True)
class Lease:
    id: int
    ttl: int


CompareTarget = Literal["create_revision", "mod_revision", "version", "value"]
CompareOp = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True)
class Compare:
    """One guard of a :meth:`EtcdClient.txn`: ``key``'s ``target`` ``op`` ``value``."""

    key: str
    target: CompareTarget
    op: CompareOp
    value: int | bytes

    @classmethod
    def absent(cls, key: str) -> Compare:
        """The key does not exist (its create_revision is 0)."""
        return cls(key, "create_revision", "==", 0)

    @classmethod
    def created_at(cls, key: str, revision: int) -> Compare:
        """The key exists and was created at ``revision`` (a leader's fence)."""
        return cls(key, "create_revision", "==", revision)


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Get:
    key: str
    prefix: bool = False


Op = Put | Delete | Get


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    #: the store's revision after the txn (the revision of its writes, if it wrote)
    revision: int
    #: one list per op of the branch taken: the keys a Get read, [] for Put and Delete
    ranges: list[list[KeyValue]]


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["put", "delete"]
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    """The events of one etcd watch response (none for a progress notification)."""

    #: the store's revision when etcd sent this response
    revision: int
    events: list[WatchEvent]


# --- the client --------------------------------------------------------------------------

_COMPARE_TARGETS = {
    "create_revision": etcdrpc.Compare.CREATE,
    "mod_revision": etcdrpc.Compare.MOD,
    "version": etcdrpc.Compare.VERSION,
    "value": etcdrpc.Compare.VALUE,
}
_COMPARE_OPS = {
    "==": etcdrpc.Compare.EQUAL,
    "!=": etcdrpc.Compare.NOT_EQUAL,
    "<": etcdrpc.Compare.LESS,
    ">": etcdrpc.Compare.GREATER,
}
_UNAVAILABLE_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _strip_scheme(endpoint: str) -> str:
    for scheme in ("http://", "https://"):
        if endpoint.lower().startswith(scheme):
            return endpoint[len(scheme) :].rstrip("/")
    return endpoint.rstrip("/")


def _prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"  # every key


def _key_value(kv: Any) -> KeyValue:
    return KeyValue(
        key=bytes(kv.key).decode("utf-8", "replace"),
        value=bytes(kv.value),
        create_revision=int(kv.create_revision),
        mod_revision=int(kv.mod_revision),
        version=int(kv.version),
        lease=int(kv.lease),
    )


def _read_file(path: Path | str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"etcd: read {path}: {exc.strerror}") from exc


#: seconds between the lines saying an etcd member still does not answer
DOWN_LOG_INTERVAL = 10.0


class _Endpoint:
    def __init__(self, address: str, channel: grpc.Channel) -> None:
        self.address = address
        self.channel = channel
        self.failed_at: float | None = None
        #: since when the member has not answered (None while it answers), the last line
        #: logged about it and the failures not logged since
        self.down_since: float | None = None
        self.logged_at = 0.0
        self.unlogged = 0
        #: when a request to it last failed (kept when it is chosen again)
        self.last_failure = 0.0


class EtcdClient:
    """A thread-safe connection to an etcd cluster through one or more endpoints.

    Requests go to one member at a time, the first listed first. A member that fails a
    request (unreachable, or no answer within ``request_timeout``) is tried again only
    after the others, for ``retry_after`` seconds. Reads are retried once on another
    member; writes are not (the caller decides, since a timed-out write may have
    happened).
    """

    def __init__(self, settings: EtcdSettings) -> None:
        settings.validate()
        self.settings = settings
        self._lock = threading.Lock()
        self._closed = False
        self._token: str | None = None
        options = [
            ("grpc.max_receive_message_length", settings.max_receive_bytes),
            ("grpc.max_send_message_length", settings.max_send_bytes),
            ("grpc.keepalive_time_ms", GRPC_KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", GRPC_KEEPALIVE_TIMEOUT_MS),
        ]
        credentials = None
        if settings.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read_file(settings.ca_cert),
                private_key=_read_file(settings.client_key),
                certificate_chain=_read_file(settings.client_cert),
            )
        self._endpoints: list[_Endpoint] = []
        for endpoint in settings.endpoints:
            address = _strip_scheme(endpoint)
            if credentials is not None:
                channel = grpc.secure_channel(address, credentials, options=options)
            else:
                channel = grpc.insecure_channel(address, options=options)
            self._endpoints.append(_Endpoint(address, channel))
        self._current: _Endpoint | None = self._endpoints[0]
        #: when any member last answered a request (time.monotonic())
        self._last_answer = 0.0

    # -- plumbing ---------------------------------------------------------------------------

    def _pick(self) -> _Endpoint:
        """The member to ask: the current one, else the first not failed recently, else
        the one that failed longest ago."""
        with self._lock:
            if self._closed:
                raise ClusterError("the etcd client is closed")
            if self._current is not None:
                return self._current
            now = time.monotonic()
            fresh = [
                e
                for e in self._endpoints
                if e.failed_at is None or now - e.failed_at >= self.settings.retry_after
            ]
            # nobody fresh: the one that failed longest ago
            chosen = fresh[0] if fresh else min(self._endpoints, key=lambda e: e.failed_at or 0.0)
            chosen.failed_at = None
            self._current = chosen
            return chosen

    def _failed(self, endpoint: _Endpoint, reason: str) -> None:
        """A request to ``endpoint`` got no answer. Logged once when the member goes
        down, then one line per DOWN_LOG_INTERVAL while it stays down (every thread of a
        node retries it: a dead etcd made ~11 lines a second, cluster QA)."""
        now = time.monotonic()
        with self._lock:
            # a failure long after the last one is a new outage: the node asked others
            # meanwhile, and knows nothing of this member (ops QA: "still does not answer
            # after 200 s" counted from a brief timeout minutes before)
            # (and another member answered since: a member down all along, asked only
            # now and then, keeps its outage's start — review)
            new_outage = (
                now - endpoint.last_failure > DOWN_LOG_INTERVAL
                and self._last_answer > endpoint.last_failure
            )
            endpoint.last_failure = now
            if endpoint.down_since is None or new_outage:
                endpoint.down_since, endpoint.logged_at, endpoint.unlogged = now, now, 0
                log.warning("etcd member %s failed: %s", endpoint.address, reason)
            elif now - endpoint.logged_at >= DOWN_LOG_INTERVAL:
                log.warning(
                    "etcd member %s still does not answer after %.0f s (%d more failed "
                    "requests): %s; requests keep retrying it",
                    endpoint.address, now - endpoint.down_since, endpoint.unlogged + 1, reason,
                )  # fmt: skip
                endpoint.logged_at, endpoint.unlogged = now, 0
            else:
                endpoint.unlogged += 1
            endpoint.failed_at = now
            if self._current is endpoint:
                self._current = None

    def _answered(self, endpoint: _Endpoint) -> None:
        """``endpoint`` answered a request: it is up (again)."""
        self._last_answer = time.monotonic()
        if endpoint.down_since is None:
            return
        with self._lock:
            if endpoint.down_since is None:
                return
            log.info("etcd member %s answers again (after %.0f s)", endpoint.address,
                     time.monotonic() - endpoint.down_since)  # fmt: skip
            endpoint.down_since = None

    def unreachable(self) -> str | None:
        """Why etcd does not answer this client, when no listed member has answered its
        latest request (e.g. "etcd at 127.0.0.1:2379 has not answered for 12 s"); None
        while one does."""
        with self._lock:
            down = [e.down_since for e in self._endpoints]
            if not down or any(since is None for since in down):
                return None
            since = max(d for d in down if d is not None)
        addresses = ", ".join(e.address for e in self._endpoints)
        return f"etcd at {addresses} has not answered for {time.monotonic() - since:.0f} s"

    @property
    def current_endpoint(self) -> str | None:
        """The member requests go to now (``host:port``), if one is chosen."""
        with self._lock:
            return self._current.address if self._current is not None else None

    def _metadata(self) -> tuple[tuple[str, str], ...] | None:
        if self._token is None:
            return None
        return (("token", self._token),)

    def _authenticate(self, endpoint: _Endpoint) -> None:
        request = etcdrpc.AuthenticateRequest(
            name=self.settings.user, password=self.settings.password
        )
        try:
            response = etcdrpc.AuthStub(endpoint.channel).Authenticate(
                request, timeout=self.settings.request_timeout
            )
        except grpc.RpcError as exc:
            raise self._convert("authenticate", endpoint, exc) from exc
        self._token = str(response.token)
        log.info("authenticated to etcd as %s", self.settings.user)

    def _convert(self, what: str, endpoint: _Endpoint, exc: grpc.RpcError) -> ClusterError:
        code = exc.code()
        details = str(exc.details() or "")
        if code in _UNAVAILABLE_CODES or code == grpc.StatusCode.CANCELLED:
            self._failed(endpoint, f"{code.name}: {details}")
            return EtcdUnavailableError(
                f"{what}: etcd at {endpoint.address} did not answer ({code.name}: {details}); "
                "check that etcd is running and has quorum, or list more members"
            )
        if "compacted" in details:
            return CompactedError(None, what)
        if "lease not found" in details:
            return LeaseNotFoundError(f"{what}: the lease expired or was revoked")
        if "space exceeded" in details:
            return EtcdNoSpaceError(
                f"{what}: etcd's space quota is exhausted ({details}); compact and "
                "defragment etcd, then disarm its NOSPACE alarm"
            )
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED) or (
            "auth" in details or "user name" in details or "password" in details
        ):
            return EtcdAuthError(
                f"{what}: etcd refused the credentials ({details}); check the etcd user, "
                "password and its role's permissions"
            )
        return EtcdRequestError(f"{what}: etcd refused the request ({code.name}: {details})")

    def _call(self, what: str, call: Callable[[_Endpoint, float], T], *, retry: bool,
              timeout: float | None = None, endpoint: _Endpoint | None = None) -> T:  # fmt: skip
        """Run ``call(endpoint, timeout)`` converting errors; reads retry on another member.

        With ``endpoint``, the request goes to that member only (no failover)."""
        attempts = min(2, len(self._endpoints)) if retry and endpoint is None else 1
        reauthenticated = False
        fixed = endpoint
        for attempt in range(attempts + 1):
            if fixed is not None:
                with self._lock:
                    if self._closed:
                        raise ClusterError("the etcd client is closed")
            endpoint = fixed or self._pick()
            try:
                if self.settings.user is not None and self._token is None:
                    self._authenticate(endpoint)
                result = call(endpoint, timeout or self.settings.request_timeout)
                self._answered(endpoint)
                return result
            except grpc.RpcError as exc:
                if (
                    self.settings.user is not None
                    and "invalid auth token" in str(exc.details() or "")
                    and not reauthenticated
                ):
                    self._token, reauthenticated = None, True  # etcd restarted: log in again
                    continue
                error = self._convert(what, endpoint, exc)
                if not isinstance(error, EtcdUnavailableError):
                    self._answered(endpoint)  # with an error, but it answered
                elif attempt + 1 < attempts:
                    continue
                raise error from exc
            except EtcdUnavailableError:
                if attempt + 1 < attempts:
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for endpoint in self._endpoints:
            endpoint.channel.close()

    def __enter__(self) -> EtcdClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- keys -------------------------------------------------------------------------------

    def range(
        self,
        key: str,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        keys_only: bool = False,
        descending: bool = False,
        timeout: float | None = None,
    ) -> RangeResult:
        """Read ``key`` (or every key under it with ``prefix``), sorted by key (from the
        last one with ``descending``: ``limit=1`` reads the last key).

        ``revision`` reads the store as it was then (CompactedError if compacted).
        """
        request = etcdrpc.RangeRequest(
            key=key.encode(), limit=limit, revision=revision, keys_only=keys_only
        )
        if prefix:
            request.range_end = _prefix_end(key.encode())
            request.sort_order = (
                etcdrpc.RangeRequest.DESCEND if descending else etcdrpc.RangeRequest.ASCEND
            )

        def call(endpoint: _Endpoint, t: float) -> RangeResult:
            response = etcdrpc.KVStub(endpoint.channel).Range(
                request, timeout=t, metadata=self._metadata()
            )
            return RangeResult(
                kvs=[_key_value(kv) for kv in response.kvs],
                revision=int(response.header.revision),
                more=bool(response.more),
            )

        return self._call(f"read {key}", call, retry=True, timeout=timeout)

    def get(self, key: str, *, timeout: float | None = None) -> KeyValue | None:
        """The key's current value and revisions, or None if it does not exist."""
        kvs = self.range(key, timeout=timeout).kvs
        return kvs[0] if kvs else None

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; returns the revision of the write."""
        request = etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease)

        def call(endpoint: _Endpoint, t: float) -> int:
            response = etcdrpc.KVStub(endpoint.channel).Put(
                request, timeout=t, metadata=self._metadata()
            )
            return int(response.header.revision)

        return self._call(f"write {key}", call, retry=False)

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete ``key`` (or every key under it); returns how many keys were deleted."""
        request = etcdrpc.DeleteRangeRequest(key=key.encode())
        if prefix:
            request.range_end = _prefix_end(key.encode())

        def call(endpoint: _Endpoint, t: float) -> int:
            response = etcdrpc.KVStub(endpoint.channel).DeleteRange(
                request, timeout=t, metadata=self._metadata()
            )
            return int(response.deleted)

        return self._call(f"delete {key}", call, retry=False)

    def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[Op] = (),
        failure: Sequence[Op] = (),
        *,
        timeout: float | None = None,
    ) -> TxnResult:
        """If every guard in ``compare`` holds, run ``success``, else ``failure``, atomically.

        etcd allows at most 128 operations per txn by default.
        """
        request = etcdrpc.TxnRequest(
            compare=[_compare_message(c) for c in compare],
            success=[_op_message(op) for op in success],
            failure=[_op_message(op) for op in failure],
        )

        def call(endpoint: _Endpoint, t: float) -> TxnResult:
            response = etcdrpc.KVStub(endpoint.channel).Txn(
                request, timeout=t, metadata=self._metadata()
            )
            ranges: list[list[KeyValue]] = []
            for op in response.responses:
                if op.WhichOneof("response") == "response_range":
                    ranges.append([_key_value(kv) for kv in op.response_range.kvs])
                else:
                    ranges.append([])
            return TxnResult(
                succeeded=bool(response.succeeded),
                revision=int(response.header.revision),
                ranges=ranges,
            )

        return self._call("txn", call, retry=False, timeout=timeout)

    def compact(self, revision: int, *, physical: bool = False) -> None:
        """Drop history below ``revision`` (no-op if already compacted that far)."""
        request = etcdrpc.CompactionRequest(revision=revision, physical=physical)

        def call(endpoint: _Endpoint, t: float) -> None:
            etcdrpc.KVStub(endpoint.channel).Compact(request, timeout=t, metadata=self._metadata())

        try:
            self._call(f"compact to {revision}", call, retry=False)
        except CompactedError:
            log.debug("etcd already compacted at or above %d", revision)

    def defragment(self, *, timeout: float = DEFAULT_DEFRAGMENT_TIMEOUT) -> list[str]:
        """Defragment every listed member, one after the other; returns their addresses.

        etcd 3.4 defragments only the member a request reaches, so each endpoint gets its
        own request. Defragmenting returns the space compaction freed inside etcd's file
        to the file system (etcd's quota counts the file's size). While a member
        defragments it answers nothing else, so the members other than the one requests
        go to now are done first. A member that fails is skipped; the first error is
        raised once every member was tried. etcd with auth enabled requires the root role.
        """
        request = etcdrpc.DefragmentRequest()

        def call(endpoint: _Endpoint, t: float) -> None:
            etcdrpc.MaintenanceStub(endpoint.channel).Defragment(
                request, timeout=t, metadata=self._metadata()
            )

        current = self.current_endpoint
        order = sorted(self._endpoints, key=lambda e: e.address == current)
        done: list[str] = []
        first_error: ClusterError | None = None
        for endpoint in order:
            try:
                self._call(f"defragment {endpoint.address}", call, retry=False,
                           timeout=timeout, endpoint=endpoint)  # fmt: skip
            except ClusterError as exc:
                log.warning("etcd defragmentation of %s failed: %s", endpoint.address, exc)
                first_error = first_error or exc
                continue
            done.append(endpoint.address)
        if first_error is not None:
            raise first_error
        return done

    # -- leases -----------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> Lease:
        """A new lease of ``ttl`` seconds (etcd's minimum is 2; keys attached die with it)."""
        request = etcdrpc.LeaseGrantRequest(TTL=ttl)

        def call(endpoint: _Endpoint, t: float) -> Lease:
            response = etcdrpc.LeaseStub(endpoint.channel).LeaseGrant(
                request, timeout=t, metadata=self._metadata()
            )
            if response.error:
                raise EtcdRequestError(f"grant lease: {response.error}")
            return Lease(id=int(response.ID), ttl=int(response.TTL))

        return self._call("grant lease", call, retry=False)

    def keepalive(self, lease_id: int, *, timeout: float | None = None) -> int:
        """Refresh a lease once; returns its new TTL in seconds, 0 if it has expired."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)

        def call(endpoint: _Endpoint, t: float) -> int:
            responses = etcdrpc.LeaseStub(endpoint.channel).LeaseKeepAlive(
                iter([request]), timeout=t, metadata=self._metadata()
            )
            try:
                for response in responses:
                    return max(int(response.TTL), 0)
                return 0
            finally:
                responses.cancel()

        return self._call("keep lease alive", call, retry=False, timeout=timeout)

    def lease_ttl(self, lease_id: int) -> int:
        """Seconds the lease has left; -1 if it has expired or was revoked."""
        request = etcdrpc.LeaseTimeToLiveRequest(ID=lease_id)

        def call(endpoint: _Endpoint, t: float) -> int:
            response = etcdrpc.LeaseStub(endpoint.channel).LeaseTimeToLive(
                request, timeout=t, metadata=self._metadata()
            )
            return int(response.TTL)

        return self._call("read lease", call, retry=True)

    def revoke_lease(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke a lease, deleting its keys; an already gone lease is not an error."""
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)

        def call(endpoint: _Endpoint, t: float) -> None:
            etcdrpc.LeaseStub(endpoint.channel).LeaseRevoke(
                request, timeout=t, metadata=self._metadata()
            )

        with contextlib.suppress(LeaseNotFoundError):  # already gone
            self._call("revoke lease", call, retry=True, timeout=timeout)

    # -- watches ----------------------------------------------------------------------------

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0) -> Watch:
        """Watch ``key`` (or a prefix) from ``start_revision`` (0: from now on)."""
        return Watch(self, key, prefix=prefix, start_revision=start_revision)


def _compare_message(compare: Compare) -> Any:
    message = etcdrpc.Compare(
        key=compare.key.encode(),
        target=_COMPARE_TARGETS[compare.target],
        result=_COMPARE_OPS[compare.op],
    )
    if compare.target == "value":
        if not isinstance(compare.value, bytes):
            raise TypeError("a value comparison takes bytes")
        message.value = compare.value
    elif isinstance(compare.value, bytes):
        raise TypeError(f"a {compare.target} comparison takes an int")
    else:
        setattr(message, compare.target, compare.value)
    return message


def _op_message(op: Op) -> Any:
    if isinstance(op, Put):
        return etcdrpc.RequestOp(
            request_put=etcdrpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)
        )
    if isinstance(op, Delete):
        delete = etcdrpc.DeleteRangeRequest(key=op.key.encode())
        if op.prefix:
            delete.range_end = _prefix_end(op.key.encode())
        return etcdrpc.RequestOp(request_delete_range=delete)
    get = etcdrpc.RangeRequest(key=op.key.encode())
    if op.prefix:
        get.range_end = _prefix_end(op.key.encode())
        get.sort_order = etcdrpc.RangeRequest.ASCEND
    return etcdrpc.RequestOp(request_range=get)


_CLOSED = object()


class Watch:
    """One watch stream. Iterate it, or call :meth:`get` with a timeout.

    Each :class:`WatchBatch` is one etcd watch response: every event of one revision is
    in the same batch. Errors end the watch: :class:`CompactedError` when
    ``start_revision`` is older than etcd's history, :class:`EtcdUnavailableError` when
    the stream breaks (watch again, from the revision after the last one seen).
    """

    def __init__(self, client: EtcdClient, key: str, *, prefix: bool, start_revision: int) -> None:
        self.key = key
        self._client = client
        self._endpoint = client._pick()
        self._requests: queue.Queue[Any] = queue.Queue()
        self._batches: queue.Queue[Any] = queue.Queue()
        self._cancelled = threading.Event()
        self._failure: ClusterError | None = None
        create = etcdrpc.WatchCreateRequest(key=key.encode(), start_revision=start_revision)
        if prefix:
            create.range_end = _prefix_end(key.encode())
        self._requests.put(etcdrpc.WatchRequest(create_request=create))
        if client.settings.user is not None and client._token is None:
            client._call("authenticate", lambda endpoint, t: None, retry=False)
        # hasleader: etcd cancels the watch when its member loses its Raft leader, instead
        # of answering from a partitioned member's stale state (which would look healthy)
        metadata = (*(client._metadata() or ()), ("hasleader", "true"))
        self._stream = etcdrpc.WatchStub(self._endpoint.channel).Watch(
            iter(self._requests.get, None), metadata=metadata
        )
        self._thread = threading.Thread(
            target=self._read, name=f"litecdc-etcd-watch {key}", daemon=True
        )
        self._thread.start()

    def _read(self) -> None:
        try:
            for response in self._stream:
                if response.compact_revision:
                    self._batches.put(CompactedError(int(response.compact_revision)))
                    return
                if response.canceled:
                    reason = response.cancel_reason or "cancelled by etcd"
                    self._batches.put(EtcdRequestError(f"watch {self.key}: {reason}"))
                    return
                if response.created:
                    continue
                events = [
                    WatchEvent(
                        "delete" if event.type == kv_pb2.Event.DELETE else "put",
                        _key_value(event.kv),
                    )
                    for event in response.events
                ]
                self._batches.put(WatchBatch(int(response.header.revision), events))
            if not self._cancelled.is_set():  # etcd ended the stream: the member went away
                self._client._failed(self._endpoint, "the watch stream ended")
        except grpc.RpcError as exc:
            if self._cancelled.is_set():
                return
            self._batches.put(self._client._convert(f"watch {self.key}", self._endpoint, exc))
        except Exception as exc:  # closed channel…: end the watch with a cluster error
            if not self._cancelled.is_set():
                self._batches.put(EtcdUnavailableError(f"watch {self.key}: {exc}"))
        finally:
            self._batches.put(_CLOSED)

    def get(self, timeout: float | None = None) -> WatchBatch | None:
        """The next batch; None after ``timeout`` seconds without one, or once cancelled.

        Once the watch has failed, every call raises the same error.
        """
        if self._failure is not None:
            raise self._failure
        if self._cancelled.is_set():
            return None
        try:
            item = self._batches.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, WatchBatch):
            return item
        if item is _CLOSED and self._cancelled.is_set():
            self._batches.put(_CLOSED)
            return None
        if isinstance(item, ClusterError):
            self._failure = item
        else:
            self._failure = EtcdUnavailableError(f"watch {self.key}: the stream ended")
        raise self._failure

    def __iter__(self) -> Iterator[WatchBatch]:
        while True:
            batch = self.get()
            if batch is None:
                return
            yield batch

    def request_progress(self) -> None:
        """Ask etcd for a batch without events carrying the current revision."""
        request = etcdrpc.WatchRequest(progress_request=etcdrpc.WatchProgressRequest())
        self._requests.put(request)

    def cancel(self) -> None:
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        self._requests.put(None)
        self._stream.cancel()
        self._batches.put(_CLOSED)

    def __enter__(self) -> Watch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
