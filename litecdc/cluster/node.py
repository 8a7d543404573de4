"""A cluster node: one store, replicated through the etcd log, led by the etcd election.

Usage::

    store = Store(NodeConfig(data_dir="d1"))
    node = ClusterNode(store, "n1", "http://10.0.0.1:4001",
                       EtcdSettings(endpoints=["127.0.0.1:2379"]), "c1")
    node.wait_until_ready(10)        # some node leads and this one has caught up
    outcome = node.execute([Statement("INSERT INTO t VALUES(1)")])   # on the leader
    outcome.cid, outcome.revision    # journal cid, etcd revision of the log entry
    node.close(); store.close()

Life of a write on the leader: ``journal.prepare_entry`` allocates the cid (under the
appender's lock, so cids enter the log in order) → :class:`LogAppender` appends it in a
group commit guarded by the leader key's create_revision → the :class:`ApplyLoop`, which
runs on every node, applies it here → the caller gets the results of that apply. A
follower's ``execute`` raises :class:`~litecdc.errors.NotLeaderError` naming the leader.

Leadership: the node's journal is in FOLLOWER mode unless it leads. A node whose apply
loop is stalled or diverged (its journal not a prefix of the log), or that needs a
snapshot, does not campaign, and steps down if it leads (:meth:`ClusterNode.why_not_lead`).
On winning the election it waits until it has applied every entry already in the log (the
log's last cid is its own, and that entry is the one it applied), then forgets stale cid
allocations, switches to LEADER mode and opens the appender. On losing it, writes not
yet sent fail with NotLeaderError at once and the journal goes back to FOLLOWER mode.
Entries already sent are decided by their guard; if they made it into the log they are
applied like any other.

``is_leader``, ``add_listener`` and ``write_internal`` make a ClusterNode the CDC
service's ``Leadership``: it is the leader only once it can write.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from typing import Any

from litecdc.cluster.election import DEFAULT_TTL, Election
from litecdc.cluster.etcd import (
    ClusterError,
    Compare,
    Delete,
    EtcdClient,
    EtcdSettings,
    EtcdUnavailableError,
    Get,
    KeyValue,
    LeaseNotFoundError,
    Put,
)
from litecdc.cluster.log import (
    CLUSTER_IDENTITY,
    ApplyLoop,
    LogAppender,
    LogWriteOutcome,
    etcd_lost_data,
    identity_key,
    identity_of,
    log_key,
    log_prefix,
)
from litecdc.cluster.snapshot import LogCompactor, SnapshotInstaller, SnapshotSettings
from litecdc.errors import (
    ConfigError,
    ModeError,
    NotFoundError,
    NotLeaderError,
    OutcomeUnknownError,
    RequestError,
)
from litecdc.journal.journal import APPLIED_REVISION, Mode
from litecdc.results import LogEntry, ReadLevel, Statement
from litecdc.store import Store

log = logging.getLogger("litecdc.cluster")

#: the start of the error a failed leadership change leaves in ``last_error``
_CHANGE_FAILED = "leadership change failed"

#: default seconds a write may take from submission until applied on the leader
DEFAULT_WRITE_TIMEOUT = 10.0
#: default seconds a new leader may take to apply what the log already holds before it
#: gives leadership up
DEFAULT_CATCH_UP_TIMEOUT = 30.0
#: default seconds between updates of this node's member record
DEFAULT_MEMBER_INTERVAL = 2.0
#: default TTL of the member record's lease, seconds
DEFAULT_MEMBER_TTL = 10
#: seconds between the lines a node logs while it waits for etcd to answer at start-up
WAIT_LOG_INTERVAL = 10.0


def members_prefix(cluster: str) -> str:
    """Live member records: one per running node, on a lease of its own."""
    return f"/litecdc/{cluster}/members/"


def joined_prefix(cluster: str) -> str:
    """Records of the nodes that joined the cluster, on no lease: a node that stops stays
    known (``/nodes`` lists it as not reachable) until it is removed (``DELETE /remove``)."""
    return f"/litecdc/{cluster}/joined/"


def _member_address(kv: KeyValue) -> str | None:
    try:
        return str(json.loads(kv.value)["address"])
    except (ValueError, KeyError, TypeError):
        return None


def _member_instance(kv: KeyValue) -> int | None:
    """The process instance a member record was written by (None: an older version's)."""
    try:
        instance = json.loads(kv.value).get("instance")
    except (ValueError, AttributeError):
        return None
    return instance if isinstance(instance, int) else None


#: node state: the instance of the last process that ran this data directory as a member
#: (its crashed record is this node's own, however like another's it looks)
MEMBER_INSTANCE = "member_instance"


def settings_key(cluster: str) -> str:
    """Settings every node of the cluster must share, recorded by the first to start."""
    return f"/litecdc/{cluster}/settings"


class MemberRunningError(ClusterError):
    """A node that is running cannot be removed from the cluster."""

    http_status = 409


@dataclass(frozen=True)
class Member:
    """One node as it registered itself under ``/litecdc/<cluster>/members/<id>``."""

    node_id: str
    address: str
    mode: str
    applied_cid: int
    applied_revision: int
    #: the log was compacted past the member's position: it needs a snapshot
    needs_snapshot: bool = False


@dataclass(frozen=True)
class KnownMember:
    """A node that joined the cluster and was not removed (rqlite's configured nodes),
    with its live member record when it has one."""

    node_id: str
    address: str
    #: the node's live record; None when it has none (stopped, or cannot reach etcd)
    live: Member | None

    @property
    def error(self) -> str | None:
        """Why the node is not reachable; None while it has a live record."""
        if self.live is not None:
            return None
        return (
            "no live member record in etcd: the node is stopped or cannot reach etcd (if "
            "it left the cluster for good, forget it with DELETE /remove)"
        )


class ClusterNode:
    """Runs the election, the log appender, the apply loop and the member record for a store.

    The constructor starts everything; :meth:`close` resigns and stops it but leaves the
    store open (the caller closes it).
    """

    def __init__(
        self,
        store: Store,
        node_id: str,
        address: str,
        etcd_settings: EtcdSettings,
        cluster_name: str,
        lease_ttl: int = DEFAULT_TTL,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        catch_up_timeout: float = DEFAULT_CATCH_UP_TIMEOUT,
        member_interval: float = DEFAULT_MEMBER_INTERVAL,
        member_ttl: int = DEFAULT_MEMBER_TTL,
        snapshots: SnapshotSettings | None = None,
        new_member: bool = False,
        admitted: Callable[[], None] | None = None,
    ) -> None:
        """``new_member``: the data directory belongs to no cluster yet (see
        _refuse_data_from_elsewhere). ``admitted()`` is called once the cluster accepted
        the node (its id, settings and data were checked in etcd), before it applies
        anything or registers: ``litecdc serve`` ties the data directory to the cluster then.

        The checks need etcd: while no member answers, the constructor waits (and logs
        what for); it never starts unchecked. ConfigError when the cluster refuses it."""
        if not cluster_name or "/" in cluster_name:
            raise ConfigError(f"cluster: invalid cluster name {cluster_name!r}")
        if not node_id or "/" in node_id:
            raise ConfigError(f"cluster: invalid node id {node_id!r}")
        self.store = store
        self.journal = store.journal
        self.node_id = node_id
        self.address = address
        self.cluster = cluster_name
        self.write_timeout = write_timeout
        self.catch_up_timeout = catch_up_timeout
        self.member_interval = member_interval
        self.member_ttl = max(member_ttl, 2)
        #: this process's mark in its member record: a record with the same id and address
        #: but another mark is another process's (cluster QA: a second node given a running
        #: node's id and URL took its place unchallenged)
        self.instance = secrets.randbits(62) + 1
        self.client = EtcdClient(etcd_settings)
        self.election = Election(
            self.client,
            cluster_name,
            node_id,
            address,
            ttl=lease_ttl,
            may_campaign=self.why_not_lead,
        )
        self.snapshot_settings = snapshots or SnapshotSettings()
        self._stop = threading.Event()
        self.snapshots = SnapshotInstaller(
            store, self.members, node_id, self.snapshot_settings, stopped=self._stop.is_set
        )
        self.apply_loop = ApplyLoop(
            self.client,
            self.journal,
            cluster_name,
            restore=self._install_snapshot,
            on_stalled=self._on_apply_stalled,
        )
        self.compactor = LogCompactor(
            self.client,
            cluster_name,
            node_id,
            self.members,
            self.is_leader,
            self.journal.last_cid,
            lambda: self.election.fence_revision,
            self.snapshot_settings,
        )
        self.appender = LogAppender(
            self.client, self.journal, cluster_name, step_down=self.election.step_down
        )

        self._state_lock = threading.Lock()
        self._wake = threading.Event()
        self._notify_lock = threading.RLock()
        self._listeners: list[Callable[[bool], None]] = []
        self._accepting = False  # leads, caught up, appender open
        self._reported = False  # what listeners last heard
        self._member_key = members_prefix(cluster_name) + node_id
        self._joined_key = joined_prefix(cluster_name) + node_id
        self.last_error: str | None = None

        try:
            self._until_etcd_answers(lambda: self._check_admission(new_member))
            if admitted is not None:
                admitted()
        except BaseException:
            self.client.close()
            raise
        self.journal.set_mode(Mode.FOLLOWER)
        try:
            self.apply_loop.start()
            self.appender.start()
            self._control = threading.Thread(
                target=self._run_control, name=f"litecdc-node {node_id}", daemon=True
            )
            self._control.start()
            self._member = threading.Thread(
                target=self._run_member, name=f"litecdc-member {node_id}", daemon=True
            )
            self._member.start()
            self.compactor.start()
            self.election.add_listener(self._on_election)
            self.election.start()
        except BaseException:
            self.close()
            raise

    # -- writes --------------------------------------------------------------------------------

    def execute(
        self, statements: Sequence[Statement], *, transaction: bool = False
    ) -> LogWriteOutcome:
        """Write through the log (leader only) and return the results of applying it here.

        The outcome is a :class:`LogWriteOutcome`: ``cid`` as the journal reports it,
        ``log_cid`` and ``revision`` (the etcd revision of the entry's key). Raises
        NotLeaderError (with the leader's id and address when known) on a follower;
        OutcomeUnknownError (HTTP 504) when the write may have been committed but this node
        cannot confirm it in time — a client must not retry it blindly.
        """
        return self._write(lambda: self.journal.prepare_entry(statements, transaction=transaction))

    def write_internal(self, query: str) -> int:
        """litecdc's own write (CDC state, high watermark, retention holds) through the log;
        leader only. Returns the entry's cid."""
        return self._write(lambda: self.journal.prepare_internal(query)).log_cid

    def _write(self, prepare: Callable[[], LogEntry]) -> LogWriteOutcome:
        if not self.is_leader():
            raise self._not_leader()

        expected: list[LogEntry] = []

        def prepare_and_expect() -> LogEntry:
            entry = prepare()
            self.apply_loop.expect(entry)
            expected.append(entry)
            return entry

        try:
            submission = self.appender.submit(prepare_and_expect)
        except (NotLeaderError, ModeError) as exc:
            raise self._not_leader(str(exc)) from exc
        if submission.refused is not None:
            # too large for the log: the empty entry took its cid, and this write runs
            # nowhere, whatever becomes of that entry (review: when its append's outcome
            # was unknown, the empty entry's results were answered as this write's, a 200
            # with no results; and the write's own expectation was never forgotten)
            self.apply_loop.forget(expected[0])
            with contextlib.suppress(Exception):
                submission.result(self.write_timeout)  # (as before: once it is appended)
            raise submission.refused
        entry = submission.entry
        cid = entry.cid
        deadline = time.monotonic() + self.write_timeout
        unknown: EtcdUnavailableError | None = None
        try:
            submission.result(self.write_timeout)
        except NotLeaderError as exc:
            self.apply_loop.forget(entry)
            raise self._not_leader(str(exc)) from exc
        except EtcdUnavailableError as exc:
            unknown = exc  # the entry may be in the log: applying it tells
        except FutureTimeoutError as exc:
            self.apply_loop.forget(entry)
            raise OutcomeUnknownError(
                f"the write (cid {cid}) was not confirmed in the log within "
                f"{self.write_timeout}s; it may still be committed: check with min_cid={cid} "
                "before retrying"
            ) from exc
        except BaseException:
            self.apply_loop.forget(entry)
            raise
        outcome = self.apply_loop.wait_applied(entry, max(deadline - time.monotonic(), 0.1))
        if outcome is None:
            if unknown is not None:
                raise OutcomeUnknownError(
                    f"the write (cid {cid}) may or may not be in the log ({unknown}); before "
                    f"retrying, read with min_cid={cid} and check that its change is there (if "
                    "it did not commit, the next write takes that cid)"
                ) from unknown
            raise OutcomeUnknownError(
                f"the write (cid {cid}) is in the log but was not applied on this node within "
                f"{self.write_timeout}s ({self.apply_loop.last_error or 'still applying'}); it "
                f"will be: do not retry it, read with min_cid={cid}"
            )
        return outcome

    def _not_leader(self, reason: str | None = None) -> NotLeaderError:
        leader = self.leader()
        detail = f" ({reason})" if reason else ""
        if leader is None or leader[0] == self.node_id:
            # cluster QA: a leader just resumed from SIGSTOP answered "it is becoming the
            # leader …; no leader is known": its key may be another's by now
            what = (
                "holds the leader key but does not lead yet, or no longer"
                if leader
                else "knows no leader right now"
            )
            return NotLeaderError(
                f"node {self.node_id} is not the leader: it {what}{detail}; try again shortly"
            )
        return NotLeaderError(
            f"node {self.node_id} is not the leader; the leader is {leader[0]} at "
            f"{leader[1]}{detail}",
            leader_id=leader[0],
            leader_address=leader[1],
        )

    # -- leadership (the CDC service's Leadership protocol) ----------------------------------------

    def is_leader(self) -> bool:
        """True while this node leads, has caught up with the log and accepts writes."""
        with self._state_lock:
            accepting = self._accepting
        return accepting and self.election.is_leader()

    def add_listener(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(leading)`` now, then whenever :meth:`is_leader` changes."""
        with self._notify_lock:
            self._listeners.append(callback)
            callback(self._reported)

    def read_gate(self, level: ReadLevel) -> None:
        """rqlite's read levels in a cluster: ``none`` reads this node's data as it is;
        ``weak``, ``strong`` and ``auto`` read on the leader (a follower raises
        NotLeaderError, and the HTTP layer forwards); ``linearizable`` has the leader first
        confirm in etcd that its leader key is still the one it won."""
        if level == "none":
            return
        if not self.is_leader():
            raise self._not_leader(f"{level} reads are served by the leader")
        if level == "linearizable" and not self.confirm_leadership():
            raise self._not_leader("leadership could not be confirmed in etcd")

    def confirm_leadership(self) -> bool:
        """Whether etcd still holds this node's leader key (a linearizable read)."""
        fence = self.election.fence_revision
        if fence is None:
            return False
        try:
            current = self.client.get(self.election.key)
        except ClusterError:
            return False
        return current is not None and current.create_revision == fence

    def log_head_cid(self, timeout: float | None = None) -> int:
        """The cid of the last entry appended to the cluster's log (read from etcd now,
        waiting ``timeout`` seconds at most), or what this node has applied when the log
        holds none (new). ClusterError when etcd does not answer."""
        last = self._log_tail(timeout)
        return self.journal.last_cid() if last is None else last

    def leader(self) -> tuple[str, str] | None:
        """(node id, address) of the current leader as last seen, or None."""
        info = self.election.leader()
        return (info.node_id, info.address) if info is not None else None

    def wait_until_ready(self, timeout: float) -> bool:
        """Wait until some node accepts writes (this one, or a leader this one knows) and
        this node has applied everything that leader had appended when asked."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_leader():
                return True
            leader = self.leader()
            if leader is not None and leader[0] != self.node_id:
                try:
                    if (
                        self.client.get(log_key(self.cluster, self.journal.last_cid() + 1)) is None
                        and not self._behind_compaction()
                        and self.apply_problem() is None
                    ):
                        return True
                except ClusterError:
                    pass
            time.sleep(0.05)
        return False

    def apply_problem(self) -> str | None:
        """Why this node's apply loop cannot keep its data the cluster's: its database
        diverged from the log, or the loop stopped on an entry it cannot apply. None while
        it applies (it may lag)."""
        return self.apply_loop.diverged or self.apply_loop.stalled

    def why_not_lead(self) -> str | None:
        """Why this node must not lead (it does not campaign, and steps down): a stalled
        or diverged apply loop (a leader that cannot apply the log appends entries it never
        acknowledges, and serves reads that miss them), or a position the log was compacted
        past. None when it may lead."""
        problem = self.apply_problem()
        if problem is not None:
            return f"its apply loop is stalled: {problem}"
        if self.apply_loop.needs_snapshot:
            return "the log was compacted past this node's position: it needs a snapshot"
        return None

    def _on_apply_stalled(self, reason: str) -> None:
        """The apply loop stopped on an entry (apply thread): a leader steps down at once."""
        if self.election.is_leader():
            self.election.step_down(f"its apply loop is stalled: {reason}")
        self._wake.set()

    def _on_election(self, leading: bool) -> None:
        """Election listener (runs on the election's thread: must not block)."""
        if not leading:
            with self._state_lock:
                self._accepting = False
            self.appender.close_leadership("this node lost leadership")
        self._wake.set()

    def _run_control(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                if self.election.is_leader():
                    if not self.is_leader():
                        self._take_over()
                else:
                    self._become_follower()
            except Exception as exc:
                log.exception("leadership change failed")
                self.last_error = f"{_CHANGE_FAILED}: {exc}"
            else:
                # A failed change was retried and went through: its error is history
                # (monitoring reads /status last_error as a current problem).
                if self.last_error is not None and self.last_error.startswith(_CHANGE_FAILED):
                    self.last_error = None
            self._report()

    def _take_over(self) -> None:
        """Newly elected: apply everything the log holds, then accept writes."""
        fence = self.election.fence_revision
        if fence is None:
            return
        deadline = time.monotonic() + self.catch_up_timeout
        while True:
            if self._stop.is_set() or self.election.fence_revision != fence:
                return
            last = self.journal.last_cid()
            try:
                if self._behind_compaction():
                    self.election.step_down(
                        "the log was compacted past this node's position: it must install a "
                        "snapshot before it can lead"
                    )
                    return
                # Caught up once the log's last cid is this journal's (only this fenced
                # leader appends now) — and the journal's entries are the log's: a journal
                # written elsewhere can hold as many cids as the log (cluster QA: such a
                # node led, served its own rows and acknowledged no write).
                tail = self._log_tail()
                problem = self.why_not_lead()
                if problem is None and (tail is None or tail <= last):
                    self.apply_loop.check_position()
                    problem = self.why_not_lead()
                    if problem is None:
                        break
                if problem is not None:
                    self.last_error = problem
                    self.election.step_down(problem)
                    return
            except ClusterError as exc:
                log.info("new leader %s: reading the log tail failed: %s", self.node_id, exc)
            if time.monotonic() >= deadline:
                reason = (
                    f"could not apply the log up to its end within {self.catch_up_timeout}s "
                    f"({self.apply_loop.last_error or 'still applying'})"
                )
                self.last_error = reason
                self.election.step_down(reason)
                return
            self.journal.wait_for_commit_after(last, 0.2)
        with self._state_lock:
            if (
                self.election.fence_revision != fence
                or self._stop.is_set()
                or self.why_not_lead() is not None
            ):
                return
            self.journal.forget_allocations()
            self.journal.set_mode(Mode.LEADER)
            self.appender.open(fence, self.journal.last_cid() + 1)
            self._accepting = True
            self.last_error = None  # an earlier failed take-over no longer holds
        log.info("%s accepts writes as leader of %s from cid %d", self.node_id, self.cluster,
                 self.journal.last_cid() + 1)  # fmt: skip

    def _log_tail(self, timeout: float | None = None) -> int | None:
        """The log's last cid (None while it has no entry)."""
        prefix = log_prefix(self.cluster)
        last = self.client.range(
            prefix, prefix=True, limit=1, keys_only=True, descending=True, timeout=timeout
        ).kvs
        return int(last[0].key[len(prefix) :]) if last else None

    def _behind_compaction(self) -> bool:
        """Whether the log's first entry is past the cid after this node's last one: the
        entries in between were compacted away (a snapshot has them, the log does not)."""
        if self.apply_loop.needs_snapshot:
            return True
        prefix = log_prefix(self.cluster)
        first = self.client.range(prefix, prefix=True, limit=1, keys_only=True).kvs
        return bool(first) and int(first[0].key[len(prefix) :]) > self.journal.last_cid() + 1

    def _install_snapshot(self, required_revision: int) -> int:
        """The apply loop's catch-up when the log lacks entries this node needs (runs on
        the apply thread, which is the only writer of a follower's journal)."""
        if self.journal.mode is not Mode.FOLLOWER:
            self.election.step_down("the log was compacted past this node's position")
            raise ClusterError("a leader does not install snapshots: stepping down first")
        return self.snapshots.install(required_revision, min_cid=self.apply_loop.base_cid)

    def _become_follower(self) -> None:
        with self._state_lock:
            self._accepting = False
            if self.journal.mode is not Mode.FOLLOWER:
                self.journal.set_mode(Mode.FOLLOWER)
        self.appender.close_leadership("this node does not lead")

    def _report(self) -> None:
        leading = self.is_leader()
        with self._notify_lock:
            if leading == self._reported:
                return
            self._reported = leading
            for callback in list(self._listeners):
                try:
                    callback(leading)
                except Exception:
                    log.exception("leadership listener failed")

    # -- status and members ------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        leader = self.leader()
        return {
            "node_id": self.node_id,
            "address": self.address,
            "cluster": self.cluster,
            "mode": self.journal.mode.value,
            "is_leader": self.is_leader(),
            "leader": {"id": leader[0], "address": leader[1]} if leader else None,
            "applied_cid": self.journal.last_cid(),
            "applied_revision": self.apply_loop.applied_revision(),
            "needs_snapshot": self.apply_loop.needs_snapshot,
            #: why the apply loop cannot keep this node's data the cluster's (None: it can)
            "apply_error": self.apply_problem(),
            #: why etcd does not answer this node (None while it does)
            "etcd_error": self.client.unreachable(),
            "last_error": (
                self.apply_problem()
                or self.apply_loop.last_error
                or self.last_error
                or self.compactor.last_error
            ),
            "log": {
                "entries_applied": self.apply_loop.applied,
                "entries_skipped": self.apply_loop.skipped,
                "append_txns": self.appender.txns,
                "entries_appended": self.appender.entries,
                "appends_fenced": self.appender.fenced,
                "catch_up_log_reads": self.apply_loop.log_reads,
                "snapshots_installed": self.apply_loop.snapshots_installed,
                "compactions": self.compactor.runs,
                "keys_compacted": self.compactor.keys_deleted,
                "compacted_revision": self.compactor.compacted_revision,
                "etcd_defragmentations": self.compactor.defragmentations,
            },
        }

    def members(self) -> list[Member]:
        """Every node whose member record is alive, sorted by id."""
        found = []
        for kv in self.client.range(members_prefix(self.cluster), prefix=True).kvs:
            try:
                value = json.loads(kv.value)
                found.append(
                    Member(
                        node_id=str(value["id"]),
                        address=str(value.get("address", "")),
                        mode=str(value.get("mode", "")),
                        applied_cid=int(value.get("applied_cid", 0)),
                        applied_revision=int(value.get("applied_revision", 0)),
                        needs_snapshot=bool(value.get("needs_snapshot", False)),
                    )
                )
            except (ValueError, KeyError, TypeError):
                log.warning("member record %s is unreadable", kv.key)
        return sorted(found, key=lambda m: m.node_id)

    def known_members(self) -> list[KnownMember]:
        """Every node that joined and was not removed, and every live member, sorted by
        id. The joined records are read first: a node that joins in between is live, one
        that stops in between is not."""
        joined: dict[str, str] = {}
        prefix = joined_prefix(self.cluster)
        for kv in self.client.range(prefix, prefix=True).kvs:
            address = _member_address(kv)
            if address is None:
                log.warning("joined record %s is unreadable", kv.key)
            joined[kv.key[len(prefix) :]] = address or ""
        live = {m.node_id: m for m in self.members()}
        known = []
        for node_id in sorted(joined.keys() | live.keys()):
            member = live.get(node_id)
            address = member.address if member is not None else joined[node_id]
            known.append(KnownMember(node_id, address, member))
        return known

    def remove_member(self, node_id: str) -> None:
        """Forget a node that left the cluster for good (rqlite's ``DELETE /remove``): its
        joined record goes, so ``/nodes`` stops listing it. Refused while the node runs
        (MemberRunningError, HTTP 409: stop it first); NotFoundError for an id the cluster
        does not know. Started again, the node joins again."""
        if not node_id or "/" in node_id:
            raise RequestError(f"invalid node id {node_id!r}")
        member = members_prefix(self.cluster) + node_id
        joined = joined_prefix(self.cluster) + node_id
        # one txn, as a node writes its records in one (_run_member): either its member
        # record exists and it is refused as running, or its joined record goes and a
        # node that is running after all writes it again with its next member record
        result = self.client.txn(
            [Compare.absent(member), Compare(joined, "create_revision", ">", 0)],
            [Delete(joined)],
            [Get(member)],
        )
        if result.succeeded:
            log.info("node %s removed from cluster %s", node_id, self.cluster)
            return
        running = result.ranges[0] if result.ranges else []
        if running:
            raise MemberRunningError(
                f"node {node_id!r} is running (at {_member_address(running[0])}): stop it "
                "before removing it (a node that stopped without shutting down, kill -9 or "
                f"a crash, keeps its member record up to {self.member_ttl} s: try again then)"
            )
        raise NotFoundError(f"node {node_id!r} is not a member of this cluster")

    def _check_admission(self, new_member: bool) -> None:
        """The start-up checks (ConfigError when one fails); EtcdUnavailableError while
        etcd cannot tell."""
        self._refuse_a_taken_node_id()
        identity = self._check_identity(new_member)
        founder = self._check_shared_settings()
        if new_member and not founder:
            self._refuse_data_from_elsewhere()
        # remembered only once admitted (config QA: a standalone directory refused by one
        # cluster kept that cluster's identity, and could then found no other)
        if self.store.engine.node_state(CLUSTER_IDENTITY) != identity:
            self.store.engine.set_node_state(CLUSTER_IDENTITY, identity)
        # (before its member record is written: see _refuse_a_taken_node_id)
        self.store.engine.set_node_state(MEMBER_INSTANCE, self.instance)
        if new_member and self.journal.applied_revision():
            # (so is the etcd revision it applied: a detached directory's is its old
            # cluster's etcd's — config QA)
            self.store.engine.set_node_state(APPLIED_REVISION, 0)
            self.apply_loop.forget_revision()
        if self.journal.last_cid() < self.apply_loop.base_cid:
            # not ready, and no candidate to lead, until a snapshot brings the founding data
            # (or the apply loop finds the entries after this journal still in the log)
            self.apply_loop.needs_snapshot = self.apply_loop.base_pending = True

    def _until_etcd_answers(self, check: Callable[[], None]) -> None:
        """Run ``check`` until etcd answers it. Cluster QA: the checks were skipped when
        etcd was down at a node's first start — and never ran again, since the directory
        then counted as a member's: a node with another --fk joined, and a standalone
        directory's data joined and later led. Errors other than "unreachable" (refused
        credentials…) are raised."""
        endpoints = ", ".join(self.client.settings.endpoints)
        waiting_since: float | None = None
        logged = 0.0
        while True:
            try:
                check()
            except EtcdUnavailableError as exc:
                now = time.monotonic()
                if waiting_since is None:
                    waiting_since = now
                if now - logged >= WAIT_LOG_INTERVAL:
                    logged = now
                    log.warning(
                        "cluster %s: etcd at %s does not answer (%s); waiting for it "
                        "(%.0f s so far): node %s checks its node id, the cluster's settings "
                        "and its data with etcd before it applies anything or joins",
                        self.cluster, endpoints, exc, now - waiting_since, self.node_id,
                    )  # fmt: skip
                time.sleep(1.0)
                continue
            if waiting_since is not None:
                log.info("cluster %s: etcd answers; node %s passed its start-up checks",
                         self.cluster, self.node_id)  # fmt: skip
            return

    def _check_identity(self, new_member: bool) -> int:
        """The cluster's identity in etcd is the one this node remembers (written by the
        first node; learned by the others when they join): otherwise etcd lost this
        cluster's data — wiped, replaced — and this node, which has some of it, must not
        found a cluster anew there (cluster QA: a lagging node restarted on a wiped etcd
        led alone, and writes acknowledged before were lost). Returns the identity.

        A directory that belongs to no cluster (``new_member``) remembers none: an identity
        it holds is from a cluster it was detached from, and it may found or join another."""
        key = identity_key(self.cluster)
        remembered = None if new_member else self.store.engine.node_state(CLUSTER_IDENTITY)
        if remembered is None:
            mine = secrets.randbits(62) + 1
            result = self.client.txn(
                [Compare.absent(key)], [Put(key, str(mine).encode())], [Get(key)]
            )
            kvs = result.ranges[0] if result.ranges else []
            found = mine if result.succeeded or not kvs else identity_of(kvs[0].value)
            if found is None:
                raise ConfigError(
                    f"cluster {self.cluster!r}: the etcd key {key} holds no cluster identity; "
                    "stop every node and delete it"
                )
            self.apply_loop.identity = found
            return found
        kv = self.client.get(key)
        if kv is None or identity_of(kv.value) != remembered:
            raise ConfigError(etcd_lost_data(self.cluster, key, kv is None))
        self.apply_loop.identity = remembered
        return remembered

    def _check_shared_settings(self) -> bool:
        """Settings that must be the same on every node, recorded in etcd by the first
        node to start (its id too, as ``founder``); a node started with another value is
        refused. Returns whether this node founded the cluster. EtcdUnavailableError when
        etcd does not answer (the caller waits: "unreachable" is not "founder").

        * ``--fk``: every node applies the same SQL; with foreign keys enforced on some
          nodes only, a write the leader commits can fail (and be recorded empty) on a
          follower (cluster QA: the tables then differed, silently).
        * ``--cdc-config`` present or not: the leader writes the pruning of the change log,
          and whether a webhook's undelivered changes are kept depends on it; a leader
          without the webhook would prune what the others still have to send.
        * the webhook's destination and what it sends (``CDCConfig.delivery``): whichever
          node leads delivers; with another endpoint or format, a failover silently sent
          the changes elsewhere, and pruned them (cluster QA).
        """
        cdc = self.store.config.cdc
        mine: dict[str, Any] = {
            "foreign_keys": bool(self.store.config.foreign_keys),
            "webhook": cdc is not None,
            "webhook_delivery": cdc.delivery_digest() if cdc is not None else None,
        }
        key = settings_key(self.cluster)
        # base_cid: the founder's own data (a standalone node grown into a cluster) is in no
        # log entry; the others copy it by snapshot before anything else (ApplyLoop.base_cid)
        base_cid = self.journal.last_cid()
        shown = {"webhook_shown": cdc.delivery() if cdc is not None else None}
        first = json.dumps(
            {**mine, **shown, "founder": self.node_id, "base_cid": base_cid}
        ).encode()
        # sent again after a timeout, the txn finds this node's own record: founder still
        result = self.client.txn([Compare.absent(key)], [Put(key, first)], [Get(key)])
        if result.succeeded or not result.ranges or not result.ranges[0]:
            self.apply_loop.base_cid = base_cid
            return True
        try:
            recorded = json.loads(result.ranges[0][0].value)
            if not isinstance(recorded, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ConfigError(
                f"cluster {self.cluster!r}: the etcd key {key} holds unreadable settings "
                f"({exc}); stop every node and delete it (the next node to start records "
                "its own)"
            ) from None
        for name, value in mine.items():
            if name == "webhook_delivery" and recorded.get("webhook") is not True:
                continue  # (no webhook: refused above, by "webhook")
            if name == "webhook_delivery" and name in recorded and recorded[name] != value:
                assert cdc is not None
                theirs, ours = recorded.get("webhook_shown") or "another webhook", cdc.delivery()
                differs = (
                    f"this node's --cdc-config sends them to {ours}"
                    if ours != theirs
                    else "this node's --cdc-config sends them there with other URL credentials, "
                    "headers or hmac_secret"
                )
                raise ConfigError(
                    f"cluster {self.cluster!r} sends its changes to {theirs}; {differs}: every "
                    "node must send the same changes to the same place, as whichever leads "
                    "delivers them (to change it for the whole cluster, stop every node and "
                    f"delete the etcd key {key})"
                )
            if name in recorded and recorded[name] != value:
                option = {"foreign_keys": "--fk", "webhook": "--cdc-config"}[name]
                runs = "with" if recorded[name] else "without"
                raise ConfigError(
                    f"cluster {self.cluster!r} runs {runs} {option}; every node must do the "
                    "same (to change it for the whole cluster, stop every node and delete "
                    f"the etcd key {key})"
                )
        if set(mine) - set(recorded):  # recorded by an older version: complete it
            with contextlib.suppress(ClusterError):
                self.client.put(key, json.dumps({**mine, **shown, **recorded}).encode())
        base = recorded.get("base_cid", 0)  # (none recorded by an older version)
        self.apply_loop.base_cid = base if isinstance(base, int) and base > 0 else 0
        return bool(recorded.get("founder") == self.node_id)

    def _refuse_data_from_elsewhere(self) -> None:
        """A node new to a running cluster must bring no data of its own: its journal
        would not be the cluster's (the apply loop then stops on the first cid it already
        has, cluster QA) and tables it already has would make the log's statements fail
        here and succeed elsewhere (``CREATE TABLE t``: table t already exists) — the
        replicas would differ. Only the node that founds a cluster may bring data (a
        standalone node becoming the first member); the others copy it by snapshot."""
        last_cid = self.journal.last_cid()
        tables = self.store.engine.user_table_count()
        if last_cid <= 1 and not tables:
            return
        if self.client.get(self._joined_key) is not None:
            return  # a member before (its directory untied: it predates DATA_DIR/cluster)
        raise ConfigError(
            f"data directory {self.store.config.data_dir} already holds data (journal up to "
            f"cid {last_cid}, {tables} table(s)) that did not come from cluster "
            f"{self.cluster!r}: a node joins a running cluster with an empty data directory "
            "and copies the data from the others; give it a new --data-dir (to replace the "
            "cluster's data with this data, POST its /db/backup to the leader's /db/load)"
        )

    def _refuse_a_taken_node_id(self) -> None:
        """A live member record with this node id written by another process (another
        address, or the same one with another instance mark), or another node's record
        with this node's address, is a second node started with the same --node-id or
        --advertise-url: both would answer as one member (cluster QA: /nodes flipped
        between them, one answered every write with 503; a node given a running node's
        URL, or another's, led and every forwarded write failed). A live member rewrites
        its record every ``member_interval``; the record of a node that crashed is only
        waiting for its lease to end (etcd may extend that after its own restart), and
        this node's record replaces it. The last instance that ran this data directory is
        remembered, so a restart after a crash does not wait for its own old record."""
        previous = self.store.engine.node_state(MEMBER_INSTANCE)
        suspects = self._records_of_others(previous)
        if suspects:
            first = {kv.key: kv.mod_revision for kv in suspects}
            deadline = time.monotonic() + 2 * self.member_interval + 1
            while suspects and time.monotonic() < deadline:
                time.sleep(min(self.member_interval / 4, 0.5))
                suspects = self._records_of_others(previous)
                for kv in suspects:
                    if kv.key in first and kv.mod_revision != first[kv.key]:
                        raise ConfigError(self._taken(kv))

    def _records_of_others(self, previous: int | None) -> list[KeyValue]:
        """Member records that may be another running process's: this id's, unless written
        here before (this address and no instance mark, as an older version wrote it, or
        the mark of this directory's last process); and other ids' at this address."""
        found = []
        for kv in self.client.range(members_prefix(self.cluster), prefix=True).kvs:
            address, instance = _member_address(kv), _member_instance(kv)
            if kv.key == self._member_key:
                if address is None or (
                    address == self.address and instance in (None, previous, self.instance)
                ):
                    continue
                found.append(kv)
            elif address == self.address:
                found.append(kv)
        return found

    def _taken(self, kv: KeyValue) -> str:
        if kv.key == self._member_key:
            return (
                f"cluster: node id {self.node_id!r} is in use by a running node at "
                f"{_member_address(kv)}; each node needs a --node-id of its own"
            )
        try:
            other = str(json.loads(kv.value)["id"])
        except (ValueError, KeyError, TypeError):
            other = kv.key
        return (
            f"cluster: {self.address} is the address of running node {other!r}; each node "
            "needs an --advertise-url (and --http-addr) of its own"
        )

    def _member_value(self) -> bytes:
        return json.dumps(
            {
                "id": self.node_id,
                "address": self.address,
                "instance": self.instance,
                "mode": self.journal.mode.value,
                "applied_cid": self.journal.last_cid(),
                "applied_revision": self.apply_loop.applied_revision(),
                "needs_snapshot": self.apply_loop.needs_snapshot,
            }
        ).encode()

    def _joined_value(self) -> bytes:
        return json.dumps({"id": self.node_id, "address": self.address}).encode()

    def _run_member(self) -> None:
        """Keep this node's member record (own lease) up to date every member_interval,
        and its joined record (no lease: it outlives the node) whenever it is missing —
        in the same txn, so remove_member either sees the node running or deletes a
        joined record the node then writes again."""
        lease = 0
        wait = 0.0
        while not self._stop.wait(wait):
            wait = self.member_interval
            try:
                if lease and self.client.keepalive(lease) <= 0:
                    lease = 0
                if not lease:
                    lease = self.client.grant_lease(self.member_ttl).id
                member = Put(self._member_key, self._member_value(), lease=lease)
                self.client.txn(
                    [Compare.absent(self._joined_key)],
                    [member, Put(self._joined_key, self._joined_value())],
                    [member],
                )
            except LeaseNotFoundError:
                lease, wait = 0, 0.0
            except ClusterError as exc:
                # an unreachable etcd is logged by the client, a line every few seconds
                level = logging.DEBUG if isinstance(exc, EtcdUnavailableError) else logging.INFO
                log.log(level, "member record of %s: %s", self.node_id, exc)
                wait = min(self.member_interval, 0.5)
        if lease:
            try:
                self.client.revoke_lease(lease, timeout=1.0)
            except ClusterError as exc:
                log.info("member record of %s: %s (it expires by itself)", self.node_id, exc)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Resign, stop the loops and leave the cluster; the store stays open."""
        self._stop.set()
        self._wake.set()
        self.election.close()  # listeners hear False: the appender stops accepting
        with self._state_lock:
            self._accepting = False
        self.appender.close()
        self.compactor.close()
        # an entry being applied stops now (rolled back: applied again at the next start);
        # the loop finished it first, however long it ran (QA: 47 s to stop a follower).
        # The loop is told first, so that it starts no other entry after the interrupt.
        self.apply_loop.request_stop()
        self.store.engine.interrupt_writes()
        self.apply_loop.close()
        for thread in (getattr(self, "_control", None), getattr(self, "_member", None)):
            if thread is not None:
                thread.join(10)
        self._report()
        self.journal.set_mode(Mode.FOLLOWER)
        self.client.close()
