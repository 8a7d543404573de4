"""Cluster mode: etcd holds the log, the leader key and member state (see docs/cluster.md).

Only this package talks to etcd. Today it has the etcd client (:mod:`.etcd`) and leader
election (:mod:`.election`); the log, the apply loop and forwarding build on them.
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
    NotLeaderError,
    Put,
    RangeResult,
    TxnResult,
    Watch,
    WatchBatch,
    WatchEvent,
)

__all__ = [
    "ClusterError",
    "CompactedError",
    "Compare",
    "Delete",
    "Election",
    "EtcdAuthError",
    "EtcdClient",
    "EtcdNoSpaceError",
    "EtcdRequestError",
    "EtcdSettings",
    "EtcdUnavailableError",
    "Get",
    "KeyValue",
    "LeaderInfo",
    "Lease",
    "LeaseNotFoundError",
    "NotLeaderError",
    "Put",
    "RangeResult",
    "TxnResult",
    "Watch",
    "WatchBatch",
    "WatchEvent",
    "leader_key",
]
