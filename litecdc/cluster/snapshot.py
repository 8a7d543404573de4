"""Snapshots and log compaction: how the etcd log stays short and how a node that fell
behind it catches up.

A *snapshot* is a node's whole SQLite file as SQLite's backup API copies it — every node
serves one at ``GET /db/backup``. The file holds the data, the journal, the captured
changes, the CDC state and ``_litecdc_node_state.applied_revision``, all written in the
same transactions, so it is a consistent pair (data, log position): installing it and
watching the log from its applied revision neither skips nor repeats an entry.

* :class:`LogCompactor` runs on every node and acts on the leader: every
  ``compact_interval`` seconds it reads the member records, takes the lowest applied
  revision of the live members (members that need a snapshot do not count: their
  position is gone already), deletes the log keys below it — never the newest
  ``keep_entries`` — in guarded txns of at most 127 deletes, then compacts etcd's
  history to that point (never above the first key kept).
* :class:`SnapshotInstaller` is what the apply loop calls when the entries a node lacks
  are no longer in the log: it picks a peer from the member records whose applied
  revision is high enough (followers first, then the leader), downloads its
  ``/db/backup`` over HTTP(S) into the data directory, and installs it with
  :meth:`litecdc.store.Store.restore_from` (verified first: SQLite header,
  ``PRAGMA quick_check``, litecdc's tables, the applied revision).

When only etcd's *history* was compacted but the keys a node lacks still exist (the
``keep_entries`` margin, or another user of the same etcd compacting), the apply loop
reads those keys instead and needs no snapshot (:meth:`ApplyLoop._catch_up`).

Usage (what :class:`~litecdc.cluster.node.ClusterNode` does)::

    installer = SnapshotInstaller(store, node.members, "n4", SnapshotSettings())
    revision = installer.install(required_revision)    # on the apply thread
    compactor = LogCompactor(client, "c1", "n1", node.members, node.is_leader,
                             store.journal.last_cid, lambda: election.fence_revision,
                             SnapshotSettings(compact_interval=30, keep_entries=1000)).start()

After a compaction the compactor occasionally defragments etcd — every member, one at a
time (:meth:`EtcdClient.defragment`) — which returns the space compaction freed inside
etcd's file to the file system (etcd's quota counts the file): once
``defragment_every`` compactions, or ``defragment_keys`` deleted log keys, have
accumulated since the last time. A member answers nothing else while it defragments, so
this is rare by design.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from litecdc.cluster.election import leader_key
from litecdc.cluster.etcd import ClusterError, Compare, Delete, EtcdClient
from litecdc.cluster.log import MAX_TXN_OPS, log_prefix
from litecdc.errors import LitecdcError
from litecdc.store import Store

if TYPE_CHECKING:  # node.py imports this module
    from litecdc.cluster.node import Member

log = logging.getLogger("litecdc.cluster")

#: default seconds between the leader's compactions of the log
DEFAULT_COMPACT_INTERVAL = 30.0
#: default number of newest log entries compaction always keeps
DEFAULT_KEEP_ENTRIES = 1000
#: default number of etcd compactions after which etcd is defragmented
DEFAULT_DEFRAGMENT_EVERY = 20
#: default number of deleted log keys after which etcd is defragmented (sooner)
DEFAULT_DEFRAGMENT_KEYS = 10_000
#: default seconds a snapshot download may take
DEFAULT_DOWNLOAD_TIMEOUT = 300.0
#: the file a snapshot is downloaded to, in the node's data directory
DOWNLOAD_NAME = "snapshot.download"


class SnapshotError(ClusterError):
    """No peer's snapshot could be downloaded and installed (the apply loop retries)."""


@dataclass(frozen=True)
class SnapshotSettings:
    """Snapshot download and log compaction settings, with their defaults."""

    #: CA of the peers' HTTPS certificates. Default: the node's ``--node-ca-cert``
    #: (``NodeConfig.node_ca_cert``), else the system's CAs.
    ca_cert: str | None = None
    #: user and password sent to a peer's ``/db/backup`` (the user needs the ``backup``
    #: permission when the peers use an auth file). Default: none.
    user: str | None = None
    password: str | None = None
    #: seconds a snapshot download may take. Default 300.
    download_timeout: float = DEFAULT_DOWNLOAD_TIMEOUT
    #: seconds between the leader's log compactions; 0 turns compaction off. Default 30.
    compact_interval: float = DEFAULT_COMPACT_INTERVAL
    #: newest log entries compaction always keeps, so a node stopped for a short while
    #: catches up from the log rather than by snapshot. At least 1. Default 1,000.
    keep_entries: int = DEFAULT_KEEP_ENTRIES
    #: defragment etcd after this many etcd compactions since the last defragmentation;
    #: 0 = only by ``defragment_keys``. Default 20 (with the default interval, at most
    #: every 10 minutes, and only while the log is being compacted).
    defragment_every: int = DEFAULT_DEFRAGMENT_EVERY
    #: defragment etcd once this many log keys were deleted since the last
    #: defragmentation; 0 = only by ``defragment_every``. Default 10,000.
    defragment_keys: int = DEFAULT_DEFRAGMENT_KEYS


# --- catching up by snapshot ------------------------------------------------------------------


class SnapshotInstaller:
    """Downloads a peer's snapshot and installs it in ``store`` (see the module docstring).

    ``members()`` returns the live member records (``ClusterNode.members``).
    """

    def __init__(
        self,
        store: Store,
        members: Callable[[], list[Member]],
        node_id: str,
        settings: SnapshotSettings,
        *,
        stopped: Callable[[], bool] = lambda: False,
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.settings = settings
        self._members = members
        self._stopped = stopped
        ca_cert = settings.ca_cert
        if ca_cert is None and store.config.node_ca_cert is not None:
            ca_cert = str(store.config.node_ca_cert)
        self._verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=ca_cert) if ca_cert else True
        )
        self._download = Path(store.config.data_dir) / DOWNLOAD_NAME
        #: where the last snapshot came from: (node id, applied revision), None before any
        self.last_source: tuple[str, int] | None = None

    def candidates(self, required_revision: int, min_cid: int = 0) -> list[Member]:
        """Live peers whose snapshot would do: followers first, then the most advanced."""
        peers = [
            m
            for m in self._members()
            if m.node_id != self.node_id
            and m.address
            and not m.needs_snapshot
            and m.applied_revision >= required_revision
            and m.applied_cid >= min_cid
        ]
        return sorted(peers, key=lambda m: (m.mode == "leader", -m.applied_revision))

    def install(self, required_revision: int, *, min_cid: int = 0) -> int:
        """Install a snapshot whose applied revision is at least ``required_revision`` and
        whose journal reaches ``min_cid`` (the cluster's founding data); returns its applied
        revision. Raises SnapshotError when no peer could give one."""
        peers = self.candidates(required_revision, min_cid)
        if not peers:
            reached = f" and cid {min_cid}" if min_cid > 1 else ""
            raise SnapshotError(
                f"no live peer has applied the log up to revision {required_revision}"
                f"{reached} to take a snapshot from; waiting for one"
            )
        failures = []
        for peer in peers:
            try:
                started = time.monotonic()
                size = self._fetch(peer)
                revision = self.store.restore_from(
                    self._download, min_applied_revision=required_revision, min_cid=min_cid
                )
            except (LitecdcError, httpx.HTTPError, OSError) as exc:
                log.warning("snapshot from %s (%s): %s", peer.node_id, peer.address, exc)
                failures.append(f"{peer.node_id}: {exc}")
                continue
            finally:
                with contextlib.suppress(FileNotFoundError):
                    self._download.unlink()
            self.last_source = (peer.node_id, revision)
            log.info("%s installed %s's snapshot (%d bytes, revision %d) in %.1fs",
                     self.node_id, peer.node_id, size, revision,
                     time.monotonic() - started)  # fmt: skip
            return revision
        raise SnapshotError("no snapshot could be installed: " + "; ".join(failures))

    def _fetch(self, peer: Member) -> int:
        """Download ``peer``'s /db/backup to the download file; returns its size."""
        url = peer.address.rstrip("/") + "/db/backup"
        auth = (
            httpx.BasicAuth(self.settings.user, self.settings.password or "")
            if self.settings.user is not None
            else None
        )
        size = 0
        timeout = httpx.Timeout(30.0, read=self.settings.download_timeout)
        deadline = time.monotonic() + self.settings.download_timeout
        with (
            httpx.Client(verify=self._verify, timeout=timeout) as http,
            http.stream("GET", url, auth=auth) as response,
        ):
            if response.status_code != 200:
                body = response.read()[:200].decode("utf-8", "replace").strip()
                fix = ""
                if response.status_code == 401:
                    # (authz QA: which of this node's options to fix was not said)
                    who = (
                        f"--node-user {self.settings.user}"
                        if self.settings.user is not None
                        else "no --node-user"
                    )
                    fix = (
                        f" (this node asks with {who}: give it --node-user and "
                        "--node-password of a user with the 'backup' permission there)"
                    )
                raise SnapshotError(f"GET {url} answered {response.status_code}: {body}{fix}")
            with open(self._download, "wb") as file:
                for chunk in response.iter_bytes(1024 * 1024):
                    if self._stopped():
                        raise SnapshotError("the node is closing")
                    if time.monotonic() > deadline:
                        raise SnapshotError(
                            f"GET {url} took longer than {self.settings.download_timeout}s"
                        )
                    file.write(chunk)
                    size += len(chunk)
                file.flush()
                os.fsync(file.fileno())
        return size


# --- log compaction (the leader) -------------------------------------------------------------


@dataclass(frozen=True)
class Compaction:
    """What one compaction run did."""

    #: the lowest applied revision of the live members
    floor: int
    #: log keys deleted
    deleted: int
    #: etcd's history was compacted to this revision (0: not this time)
    compacted_revision: int
    #: etcd was defragmented after this compaction
    defragmented: bool = False


class LogCompactor:
    """The leader's periodic log compaction (see the module docstring)."""

    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        node_id: str,
        members: Callable[[], list[Member]],
        is_leader: Callable[[], bool],
        last_cid: Callable[[], int],
        fence: Callable[[], int | None],
        settings: SnapshotSettings,
    ) -> None:
        self.client = client
        self.cluster = cluster
        self.node_id = node_id
        self.interval = settings.compact_interval
        self.keep_entries = max(1, settings.keep_entries)
        self.defragment_every = max(0, settings.defragment_every)
        self.defragment_keys = max(0, settings.defragment_keys)
        self._members = members
        self._is_leader = is_leader
        self._last_cid = last_cid
        self._fence = fence
        self._prefix = log_prefix(cluster)
        self._leader_key = leader_key(cluster)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: runs that did something, keys deleted in all, etcd's compaction revision
        self.runs = 0
        self.keys_deleted = 0
        self.compacted_revision = 0
        #: etcd defragmentations done (every member each time), and what accumulated
        #: since the last one
        self.defragmentations = 0
        self._compactions_since_defrag = 0
        self._keys_since_defrag = 0
        self._defragment_failed = False
        self.last_error: str | None = None

    def start(self) -> LogCompactor:
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(
                target=self._run, name=f"litecdc-compactor {self.node_id}", daemon=True
            )
            self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._is_leader():
                continue
            try:
                self.run_once()
                if not self._defragment_failed:
                    self.last_error = None
            except ClusterError as exc:
                self.last_error = f"log compaction: {exc}"
                log.info("%s", self.last_error)
            except Exception as exc:
                self.last_error = f"log compaction failed: {exc}"
                log.exception("log compaction failed")

    def run_once(self) -> Compaction | None:
        """Compact now (leader only). None when there was nothing to base it on: this
        node does not lead, or its own member record is not there yet."""
        fence = self._fence()
        if fence is None or not self._is_leader():
            return None
        live = [m for m in self._members() if not m.needs_snapshot]
        if not any(m.node_id == self.node_id for m in live):
            return None
        floor = min(m.applied_revision for m in live)
        if floor <= 1:
            return None
        keep_from = self._last_cid() - self.keep_entries + 1  # cids >= this stay
        deleted = 0
        first_kept: int | None = None
        while not self._stop.is_set():
            kvs = self.client.range(
                self._prefix, prefix=True, limit=MAX_TXN_OPS - 1, keys_only=True
            ).kvs
            victims = []
            for kv in kvs:
                if int(kv.key[len(self._prefix) :]) >= keep_from or kv.mod_revision >= floor:
                    first_kept = kv.mod_revision
                    break
                victims.append(kv.key)
            if not victims:
                break
            result = self.client.txn(
                [Compare.created_at(self._leader_key, fence)],
                [Delete(key) for key in victims],
                [],
            )
            if not result.succeeded:  # no longer the leader: leave it to the new one
                return None
            deleted += len(victims)
            if first_kept is not None:
                break
        point = min(floor, first_kept) if first_kept is not None else floor
        compacted = 0
        if point > self.compacted_revision:
            self.client.compact(point)
            compacted = self.compacted_revision = point
        if deleted or compacted:
            self.runs += 1
            self.keys_deleted += deleted
            log.info("log compaction: %d keys deleted below revision %d; etcd compacted to %d",
                     deleted, floor, compacted)  # fmt: skip
        defragmented = self._maybe_defragment(deleted, compacted)
        return Compaction(floor, deleted, compacted, defragmented)

    def _maybe_defragment(self, deleted: int, compacted: int) -> bool:
        """Defragment etcd when enough compactions or deleted keys have accumulated.

        Only after a compaction of etcd's history (that is what frees space in its file).
        A failure is logged and kept in ``last_error``; like a success it restarts the
        count, so a member that cannot be defragmented (e.g. an etcd user without the root
        role) is not asked again at every compaction.
        """
        self._defragment_failed = False
        self._keys_since_defrag += deleted
        if not compacted:
            return False
        self._compactions_since_defrag += 1
        due = (
            self.defragment_every > 0 and self._compactions_since_defrag >= self.defragment_every
        ) or (self.defragment_keys > 0 and self._keys_since_defrag >= self.defragment_keys)
        if not due or self._stop.is_set() or not self._is_leader():
            return False
        started = time.monotonic()
        self._compactions_since_defrag = self._keys_since_defrag = 0
        try:
            members = self.client.defragment()
        except ClusterError as exc:
            self._defragment_failed = True
            self.last_error = f"etcd defragmentation: {exc}"
            log.warning("%s", self.last_error)
            return False
        self.defragmentations += 1
        log.info("etcd defragmented (%s) in %.1fs", ", ".join(members),
                 time.monotonic() - started)  # fmt: skip
        return True
