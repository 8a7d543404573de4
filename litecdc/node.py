"""One node: its store, its leadership, its cluster membership and (when configured) its
CDC push service.

``litecdc serve`` builds a Node, serves its HTTP API and closes it on exit.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from litecdc.cdc.retention import RetentionKeeper
from litecdc.cdc.service import CDCService, Leadership
from litecdc.config import NodeConfig
from litecdc.db.datafile import PROBE_FILE_PREFIX
from litecdc.errors import ConfigError
from litecdc.leadership import StandaloneLeadership
from litecdc.store import Store

if TYPE_CHECKING:
    from litecdc.cluster import ClusterNode

log = logging.getLogger("litecdc.node")


class Node:
    """One node: standalone (always the leader, its journal is the log) or, with etcd
    endpoints configured, a member of a cluster (writes go through the etcd log)."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        # what needs no data is checked before the data directory is touched (cluster QA:
        # refused starts left a new db.sqlite and lock file behind)
        if config.auth_file is not None:
            from litecdc.http.auth import CredentialStore

            CredentialStore.from_file(config.auth_file)  # the HTTP API reads it again
        if not config.clustered:
            _refuse_a_cluster_member(Path(config.data_dir))
        data_dir = Path(config.data_dir)
        existed = data_dir.exists()
        fresh = not existed or _empty_dir(data_dir)
        self.store = Store(config)
        self.cluster: ClusterNode | None = None
        self.cdc: CDCService | None = None
        try:
            leadership: Leadership
            if config.clustered:
                unclaimed = _check_cluster_claim(Path(config.data_dir), config.cluster)
                # tied to the cluster only once the cluster accepted the node (its settings,
                # id and data), and before it applies anything
                admitted = (
                    (lambda: _record_cluster(Path(config.data_dir), config.cluster))
                    if unclaimed
                    else None
                )
                cluster = self.cluster = _cluster_node(config, self.store, unclaimed, admitted)
                self.store.route_writes(
                    lambda statements, transaction: cluster.execute(
                        statements, transaction=transaction
                    )
                )
                self.store.route_reads(cluster.read_gate)
                leadership = cluster
            else:
                leadership = StandaloneLeadership(self.store.journal)
            self.leadership = leadership
            if config.cdc is not None:
                self.cdc = CDCService(
                    config.cdc,
                    self.store,
                    leadership,
                    node_id=config.node_id,
                    retention_cids=config.retention_cids,
                )
            self.store.route_internal_writes(leadership.write_internal)
            self.retention = RetentionKeeper(self.store, leadership, config.retention_interval)
        except BaseException:
            if self.cluster is not None:
                self.cluster.close()
            self.store.close()
            if fresh and not (data_dir / CLUSTER_FILE).exists():
                # refused by the cluster (a taken node id, other settings, etcd refusing
                # the credentials — authz QA), or stopped while waiting for etcd: what the
                # store just made goes, so a start that did not happen leaves no empty
                # database behind. (Once admitted the directory is the cluster's: kept.)
                _remove_made(data_dir, keep_dir=existed)
            raise

    def start(self) -> None:
        self.retention.start()
        if self.cdc is not None:
            self.cdc.start()

    def close(self) -> None:
        """Stop CDC delivery (persisting its high watermark), leave the cluster, then close
        the store."""
        try:
            self.retention.stop()
            if self.cdc is not None:
                self.cdc.stop()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.close()
            finally:
                self.store.close()


#: in a data directory: the name of the cluster whose node it is
CLUSTER_FILE = "cluster"


def _empty_dir(path: Path) -> bool:
    """Whether ``path`` is a directory with nothing in it (not a file, not unreadable:
    the store says what is wrong with those)."""
    try:
        # (a probe file of the store's start left by a kill: not data — review)
        return path.is_dir() and all(p.name.startswith(PROBE_FILE_PREFIX) for p in path.iterdir())
    except OSError:
        return False


def _remove_made(data_dir: Path, *, keep_dir: bool) -> None:
    """Remove what a refused start made in a data directory that was new or empty."""
    if not keep_dir:
        shutil.rmtree(data_dir, ignore_errors=True)
        return
    for made in data_dir.iterdir():
        if made.is_dir() and not made.is_symlink():
            shutil.rmtree(made, ignore_errors=True)
        else:
            made.unlink(missing_ok=True)


def _check_cluster_claim(data_dir: Path, cluster: str) -> bool:
    """A data directory joins one cluster for good: started with another --cluster (a
    typo) it would lead a new, empty log of its own and fork the data (cluster QA).
    ConfigError for another cluster; True when the directory belongs to none yet."""
    path = data_dir / CLUSTER_FILE
    recorded = _recorded_cluster(path)
    if recorded is None:
        return True
    if recorded != cluster:
        raise ConfigError(
            f"data directory {data_dir} belongs to cluster {recorded!r} (see {path}), not "
            f"{cluster!r}: start it with --cluster {recorded}, or give this node a new data "
            "directory"
        )
    return False


def _refuse_a_cluster_member(data_dir: Path) -> None:
    """A cluster member's directory started without --etcd ran standalone and took writes
    the cluster never saw (cluster QA: its data forked). Detaching it is deliberate: delete
    DATA_DIR/cluster (see docs/cluster.md)."""
    path = data_dir / CLUSTER_FILE
    recorded = _recorded_cluster(path)
    if recorded is None:
        return
    raise ConfigError(
        f"data directory {data_dir} belongs to cluster {recorded!r} (see {path}): start it "
        f"with --etcd and --cluster {recorded}; to run it standalone instead, detach it for "
        f"good by deleting {path} (its data then goes its own way and cannot rejoin the "
        "cluster)"
    )


def _recorded_cluster(path: Path) -> str | None:
    """The cluster name in DATA_DIR/cluster, None without one. ConfigError when it holds
    no name (config QA: bytes that are not UTF-8 ended the start with a traceback, an
    empty file with advice naming cluster '')."""
    try:
        recorded = path.read_bytes().decode().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnicodeDecodeError:
        recorded = ""
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not recorded:
        raise ConfigError(
            f"{path} holds no cluster name (it is written with the name of the cluster the "
            "data directory belongs to): write that name into it, or delete it to detach "
            "the directory from its cluster (see docs/cluster.md)"
        )
    return recorded


def _record_cluster(data_dir: Path, cluster: str) -> None:
    """Tie the data directory to ``cluster`` (see _check_cluster_claim)."""
    path = data_dir / CLUSTER_FILE
    # written whole or not at all: an empty file would tie the directory to cluster ''
    temporary = path.with_name(CLUSTER_FILE + ".tmp")
    with temporary.open("w") as file:
        file.write(cluster + "\n")
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)


def _cluster_node(
    config: NodeConfig,
    store: Store,
    new_member: bool,
    admitted: Callable[[], None] | None,
) -> ClusterNode:
    from litecdc.cluster import ClusterNode, EtcdSettings
    from litecdc.cluster.snapshot import SnapshotSettings

    settings = EtcdSettings(
        endpoints=list(config.etcd_endpoints),
        ca_cert=config.etcd_ca_cert,
        client_cert=config.etcd_cert,
        client_key=config.etcd_key,
        user=config.etcd_user,
        password=config.etcd_password,
    )
    snapshots = SnapshotSettings(
        ca_cert=str(config.node_ca_cert) if config.node_ca_cert else None,
        user=config.node_user,
        password=config.node_password,
        compact_interval=config.compact_interval,
        keep_entries=config.compact_keep,
    )
    return ClusterNode(
        store,
        config.node_id,
        config.advertise_url,
        settings,
        config.cluster,
        config.lease_ttl,
        snapshots=snapshots,
        new_member=new_member,
        admitted=admitted,
    )
