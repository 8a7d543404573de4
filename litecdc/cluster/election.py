"""Leader election over etcd: one leader key per cluster, held with a lease.

The leader key is ``/litecdc/<cluster>/leader``; its value is this node's id and HTTP
address as JSON. A candidate grants a lease of ``ttl`` seconds and creates the key with
it in one txn guarded by ``create_revision == 0`` (only if absent). The winner's
:attr:`Election.fence_revision` is the key's create_revision: every write the leader makes
in etcd is guarded by ``create_revision == fence_revision``, so once the key has expired
or been replaced, a deposed leader (paused, partitioned, slow) cannot write.

The leader refreshes the lease every ``ttl / 3`` seconds and checks the key is still its
own; when a keepalive fails, the lease has expired, or the key is gone, it steps down
*at once* (listeners hear ``False`` before anything else happens) and revokes the lease.
:meth:`Election.is_leader` also turns False by itself when the lease's local deadline
passes (the last successful refresh's send time + TTL), even if the keepalive thread is
still waiting. Followers watch the key and campaign as soon as it is deleted; they also
re-read it every ``ttl`` seconds, so a watch hung on a paused etcd member is noticed.
A node that must not lead (``may_campaign`` returns why) follows but does not campaign.

Usage::

    election = Election(client, "c1", "node-1", "http://10.0.0.1:4001", ttl=2)
    election.add_listener(lambda leading: print("leader" if leading else "follower"))
    election.start()
    ...
    election.leader()        # LeaderInfo(node_id=..., address=..., fence_revision=...)
    election.close()         # resigns: revokes the lease, so another node takes over now

The class provides ``is_leader`` and ``add_listener`` of the CDC service's
``Leadership`` protocol; ``write_internal`` comes with the etcd log.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from litecdc.cluster.etcd import (
    ClusterError,
    Compare,
    EtcdClient,
    EtcdUnavailableError,
    Get,
    KeyValue,
    Put,
    Watch,
)
from litecdc.errors import ConfigError

log = logging.getLogger("litecdc.cluster")

#: default lease TTL of the leader key, seconds (etcd's minimum is 2)
DEFAULT_TTL = 2
#: default pause after a failed etcd request before the election tries again, seconds
DEFAULT_RETRY_INTERVAL = 0.5
#: leases given up but not revoked that a node remembers (one per failed revoke: a long
#: etcd outage adds some; the oldest have expired by the time they are dropped)
MAX_UNREVOKED = 16


def leader_key(cluster: str) -> str:
    return f"/litecdc/{cluster}/leader"


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads the cluster, as read from the leader key."""

    node_id: str
    address: str
    #: the leader key's create_revision: the leader's fence for guarded writes
    fence_revision: int
    lease: int


def _leader_info(kv: KeyValue) -> LeaderInfo:
    try:
        value = json.loads(kv.value)
        node_id, address = str(value["id"]), str(value.get("address", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("leader key %s holds an unreadable value", kv.key)
        node_id, address = "", ""
    return LeaderInfo(node_id, address, kv.create_revision, kv.lease)


class Election:
    """Campaigns for, holds and gives up leadership of one cluster for one node."""

    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        node_id: str,
        address: str,
        *,
        ttl: int = DEFAULT_TTL,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
        may_campaign: Callable[[], str | None] | None = None,
    ) -> None:
        """``may_campaign()`` returns why this node must not lead right now (None: it may);
        while it says so the node does not campaign (it still follows the leader)."""
        if ttl < 2:
            raise ConfigError("election: the lease TTL must be at least 2 seconds (etcd's minimum)")
        if not cluster or "/" in cluster:
            raise ConfigError(f"election: invalid cluster name {cluster!r}")
        if not node_id:
            raise ConfigError("election: the node id must not be empty")
        self.client = client
        self.cluster = cluster
        self.node_id = node_id
        self.address = address
        self.ttl = ttl
        self.retry_interval = retry_interval
        self._may_campaign = may_campaign
        #: why the node last held back from campaigning (logged once per reason)
        self._held_back: str | None = None
        self.key = leader_key(cluster)
        self._value = json.dumps({"id": node_id, "address": address}).encode()

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._notify_lock = threading.RLock()  # listeners hear changes one at a time, in order
        self._listeners: list[Callable[[bool], None]] = []
        self._leading = False
        self._lease_id = 0
        self._fence: int | None = None
        self._deadline = 0.0
        self._leader: LeaderInfo | None = None
        #: when etcd last answered this node's election thread (monotonic seconds)
        self._last_contact = time.monotonic()
        #: leases this node gave up but could not revoke (etcd out of reach): its leader
        #: key may still hold one when etcd answers again
        #: (a dict as an ordered set: the oldest go first)
        self._unrevoked: dict[int, None] = {}

        self._stop = threading.Event()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    # -- the Leadership interface -------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this node holds the leader key with a lease not yet due to expire."""
        with self._lock:
            return self._leading and time.monotonic() < self._deadline

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(leading)`` now with the current state, then on every change."""
        with self._notify_lock:
            self._listeners.append(callback)
            callback(self.is_leader())

    @property
    def fence_revision(self) -> int | None:
        """The create_revision of this node's leader key while it leads, else None."""
        with self._lock:
            return self._fence if self._leading else None

    def leader(self) -> LeaderInfo | None:
        """The current leader as last seen (this node while it leads), or None."""
        with self._lock:
            return self._leader

    def wait_for_leader(self, timeout: float) -> LeaderInfo | None:
        """Wait until some node leads; returns it, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._leader is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return self._leader

    def step_down(self, reason: str) -> None:
        """Stop leading now (e.g. after a failed guarded write), then revoke the lease.

        Listeners hear False before this returns; the node campaigns again afterwards.
        """
        lease = self._set_follower(reason)
        if lease:
            self._revoke(lease)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Election:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"litecdc-election {self.node_id}", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Resign and stop campaigning: listeners hear False, the lease is revoked."""
        self._stop.set()
        lease = self._set_follower("closing")
        watch = self._watch
        if watch is not None:
            watch.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if lease:
            self._revoke(lease)

    # -- state changes --------------------------------------------------------------------------

    def _notify(self, leading: bool) -> None:
        for callback in list(self._listeners):
            try:
                callback(leading)
            except Exception:
                log.exception("leadership listener failed")

    def _set_leader(self, lease_id: int, fence: int, deadline: float) -> None:
        with self._notify_lock:
            with self._changed:
                self._leading = True
                self._lease_id = lease_id
                self._fence = fence
                self._deadline = deadline
                self._leader = LeaderInfo(self.node_id, self.address, fence, lease_id)
                self._changed.notify_all()
            log.info("%s is the leader of %s (fence revision %d)", self.node_id, self.cluster,
                     fence)  # fmt: skip
            self._notify(True)

    def _set_follower(self, reason: str) -> int:
        """Stop leading, if leading; returns the lease to revoke (0 if none)."""
        with self._notify_lock:
            with self._changed:
                if not self._leading:
                    return 0
                lease = self._lease_id
                self._leading = False
                self._lease_id = 0
                self._fence = None
                self._leader = None
                self._changed.notify_all()
            log.warning("%s steps down as leader of %s: %s", self.node_id, self.cluster, reason)
            self._notify(False)
            return lease

    def _observe(self, info: LeaderInfo | None) -> None:
        with self._changed:
            if not self._leading:
                self._leader = info
                self._changed.notify_all()

    def _revoke(self, lease_id: int) -> bool:
        """Revoke a lease of this node's; False (and remembered) when etcd did not answer."""
        try:
            self.client.revoke_lease(lease_id, timeout=self.ttl / 3)
        except ClusterError as exc:
            log.info("could not revoke lease %x (it expires by itself): %s", lease_id, exc)
            with self._lock:
                self._unrevoked[lease_id] = None
                while len(self._unrevoked) > MAX_UNREVOKED:  # (the oldest have expired)
                    del self._unrevoked[next(iter(self._unrevoked))]
            return False
        with self._lock:
            self._unrevoked.pop(lease_id, None)
        return True

    def _gave_up(self, lease_id: int) -> bool:
        """Whether ``lease_id`` is one this node gave up but could not revoke."""
        with self._lock:
            return lease_id in self._unrevoked

    def _end_given_up_leadership(self, kv: KeyValue) -> bool:
        """Whether the leader key was this node's, given up when etcd was out of reach;
        its lease is revoked now (True) rather than waited out. Every write was refused
        until then, on every node, while the key named a leader that no longer led
        (cluster QA: about 3.5 s after etcd came back, with a 2 s lease)."""
        if not self._gave_up(kv.lease):
            return False
        log.info("%s revokes its lease %x, given up while etcd was out of reach",
                 self.node_id, kv.lease)  # fmt: skip
        if not self._revoke(kv.lease):
            self._stop.wait(self.retry_interval)
        return True

    # -- the election thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                current = self.client.range(self.key)
                self._last_contact = time.monotonic()
                if not current.kvs:
                    self._observe(None)
                    if self._holds_back():
                        self._stop.wait(self.retry_interval)
                    elif self._campaign():
                        self._lead()
                elif not self._end_given_up_leadership(current.kvs[0]):
                    self._follow(current.kvs[0], current.revision)
            except ClusterError as exc:
                lease = self._set_follower(str(exc))
                if lease:
                    self._revoke(lease)
                # etcd out of reach for two lease times (a quiet watch is checked once per
                # lease time): whoever led may be gone, and no write can commit anyway, so
                # this node knows no leader (readyz 503) until etcd answers. One failed
                # request is not that: the leader's lease outlives it.
                if time.monotonic() - self._last_contact > 2 * self.ttl:
                    self._observe(None)
                # an unreachable etcd is logged by the client, a line every few seconds
                level = logging.DEBUG if isinstance(exc, EtcdUnavailableError) else logging.INFO
                log.log(level, "election %s: %s; retrying", self.key, exc)
                self._stop.wait(self.retry_interval)
            except Exception:
                log.exception("election %s failed; retrying", self.key)
                self._stop.wait(self.retry_interval)

    def _holds_back(self) -> bool:
        """Whether the node must not campaign now (``may_campaign`` says why)."""
        reason = self._may_campaign() if self._may_campaign is not None else None
        if reason is not None and reason != self._held_back:
            log.warning("%s does not campaign for leader of %s: %s", self.node_id,
                        self.cluster, reason)  # fmt: skip
        self._held_back = reason
        return reason is not None

    def _campaign(self) -> bool:
        """Try to create the leader key; True if this node won."""
        started = time.monotonic()
        lease = self.client.grant_lease(self.ttl)
        try:
            result = self.client.txn(
                [Compare.absent(self.key)],
                [Put(self.key, self._value, lease=lease.id)],
                [Get(self.key)],
            )
        except ClusterError:
            self._revoke(lease.id)  # the put may have happened: give the key up
            raise
        if not result.succeeded:
            self._revoke(lease.id)
            kvs = result.ranges[0] if result.ranges else []
            self._observe(_leader_info(kvs[0]) if kvs else None)
            return False
        if self._stop.is_set():
            self._revoke(lease.id)
            return False
        self._set_leader(lease.id, result.revision, started + lease.ttl)
        return True

    def _lead(self) -> None:
        """Keep the lease alive until it is lost, the key goes, or step_down/close."""
        interval = self.ttl / 3
        with self._lock:
            lease, fence = self._lease_id, self._fence

        def given_up() -> bool:
            return self._stop.is_set() or not self._leading or self._lease_id != lease

        try:
            while True:
                with self._changed:  # (step_down() and close() notify it: back at once)
                    if self._changed.wait_for(given_up, timeout=interval):
                        return
                sent = time.monotonic()
                ttl = self.client.keepalive(lease, timeout=interval)
                if ttl <= 0:
                    raise ClusterError("the leader lease expired")
                with self._lock:
                    if self._leading and self._lease_id == lease:
                        self._deadline = sent + ttl
                kv = self.client.get(self.key, timeout=interval)
                if kv is None or kv.create_revision != fence:
                    raise ClusterError("the leader key was deleted or replaced")
        finally:
            if not self._stop.is_set():
                lost = self._set_follower("leadership lost")
                if lost:
                    self._revoke(lost)

    def _follow(self, kv: KeyValue, revision: int) -> None:
        """Watch the leader key until it is deleted (then return, to campaign)."""
        known = _leader_info(kv)
        self._observe(known)
        watch = self.client.watch(self.key, start_revision=revision + 1)
        self._watch = watch
        quiet_since = time.monotonic()
        try:
            while not self._stop.is_set():
                batch = watch.get(timeout=min(self.ttl, 1.0))
                if batch is None:
                    if self._stop.is_set() or self._gave_up(known.lease):
                        # (this node's own key, given up by step_down() on another thread
                        # whose revoke failed after this thread came here: review)
                        return
                    if time.monotonic() - quiet_since < self.ttl:
                        continue
                    quiet_since = time.monotonic()
                    # Quiet: check with a read that fails over, in case the watch hangs.
                    current = self.client.get(self.key)
                    self._last_contact = time.monotonic()
                    if current is None or current.create_revision != known.fence_revision:
                        return
                    continue
                self._last_contact = quiet_since = time.monotonic()
                for event in batch.events:
                    if event.type == "delete":
                        log.info("leader %s of %s is gone", known.node_id, self.cluster)
                        self._observe(None)
                        return
                    known = _leader_info(event.kv)
                    self._observe(known)
        finally:
            self._watch = None
            watch.cancel()
