"""Cluster mode: etcd holds the log, the leader key and member state (see docs/cluster.md).

Only this package talks to etcd: the client (:mod:`.etcd`), leader election
(:mod:`.election`), the log's group commit and apply loop (:mod:`.log`), snapshots and log
compaction (:mod:`.snapshot`) and the node that runs them for a store (:mod:`.node`).
``NotLeaderError`` here is :class:`litecdc.errors.NotLeaderError` (it carries the leader's
id and address).
"""

from __future__ import annotations

from litecdc.cluster.election import Election, LeaderInfo, leader_key
from litecdc.cluster.etcd import (
    ClusterError,
    CompactedError,
    Compare,
    Delete,
    EtcdAuthError,
    EtcdClient,
    EtcdNoSpaceError,
    EtcdRequestError,
    EtcdSettings,
    EtcdUnavailableError,
    Get,
    KeyValue,
    Lease,
    LeaseNotFoundError,
    Put,
    RangeResult,
    TxnResult,
    Watch,
    WatchBatch,
    WatchEvent,
)
from litecdc.cluster.log import (
    ApplyLoop,
    ApplyStalledError,
    DivergedError,
    LogAppender,
    LogWriteOutcome,
    Submission,
    log_key,
    log_prefix,
)
from litecdc.cluster.node import (
    ClusterNode,
    KnownMember,
    Member,
    MemberRunningError,
    joined_prefix,
    members_prefix,
)
from litecdc.cluster.snapshot import (
    Compaction,
    LogCompactor,
    SnapshotError,
    SnapshotInstaller,
    SnapshotSettings,
)
from litecdc.errors import NotLeaderError

__all__ = [
    "ApplyLoop",
    "ApplyStalledError",
    "ClusterError",
    "ClusterNode",
    "CompactedError",
    "Compaction",
    "Compare",
    "Delete",
    "DivergedError",
    "Election",
    "EtcdAuthError",
    "EtcdClient",
    "EtcdNoSpaceError",
    "EtcdRequestError",
    "EtcdSettings",
    "EtcdUnavailableError",
    "Get",
    "KeyValue",
    "KnownMember",
    "LeaderInfo",
    "Lease",
    "LeaseNotFoundError",
    "LogAppender",
    "LogCompactor",
    "LogWriteOutcome",
    "Member",
    "MemberRunningError",
    "NotLeaderError",
    "Put",
    "RangeResult",
    "SnapshotError",
    "SnapshotInstaller",
    "SnapshotSettings",
    "Submission",
    "TxnResult",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "joined_prefix",
    "leader_key",
    "log_key",
    "log_prefix",
    "members_prefix",
]
