"""Typed, validated node configuration: the one source of truth for defaults.

The CLI (``litecdc serve``) and the environment (``LITECDC_*``) both feed
:class:`NodeConfig`; every field documents its default.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from litecdc.cdc.config import CDCConfig, shown_cdc_config
from litecdc.db.schema import DEFAULT_RETENTION_CIDS
from litecdc.errors import ConfigError
from litecdc.tls_files import check_ca_file, check_cert_and_key

DEFAULT_HTTP_ADDR = "127.0.0.1:4001"
DEFAULT_DB_FILE = "db.sqlite"
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
SYNCHRONOUS_LEVELS = ("off", "normal", "full", "extra")
#: etcd's own limit on a lease's TTL (MaxLeaseTTL, seconds)
ETCD_MAX_LEASE_TTL = 9_000_000_000
#: the shortest and longest --compact-interval (seconds; 0 is "never")
MIN_COMPACT_INTERVAL = 0.1
MAX_COMPACT_INTERVAL = 7 * 24 * 3600


@dataclass(frozen=True)
class NodeConfig:
    #: Directory holding the node's SQLite file; created if missing.
    data_dir: Path
    #: host:port the HTTP API listens on. Default 127.0.0.1:4001 (rqlite's port). Port 0
    #: (the system chooses) is for standalone nodes only.
    http_addr: str = DEFAULT_HTTP_ADDR
    #: This node's id in /status and CDC envelopes. Default: the HTTP address.
    node_id: str = ""
    #: SQLite ``PRAGMA synchronous`` for the writer. Default "full": a commit is on disk
    #: before it is acknowledged.
    synchronous: str = "full"
    #: rqlite-format auth file (JSON list of {username, password, perms}); None = no auth.
    auth_file: Path | None = None
    #: PEM certificate and key for HTTPS; both or neither.
    http_cert: Path | None = None
    http_key: Path | None = None
    #: Largest request body accepted, in bytes. Default 64 MiB.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: Value of the ``Access-Control-Allow-Origin`` header on every response, like
    #: rqlite's ``-http-allow-origin`` (an origin such as https://app.example.com, or *);
    #: default "" (no such header: browsers refuse pages of other origins).
    http_allow_origin: str = ""
    #: Enforce foreign keys (``PRAGMA foreign_keys=ON``), like rqlite's ``-fk``. Every node
    #: of a cluster must use the same setting. Default off, as in SQLite.
    foreign_keys: bool = False
    #: The CDC push service (``--cdc-config``); None = no webhook delivery.
    cdc: CDCConfig | None = None
    #: etcd endpoints (host:port) for cluster mode; empty = standalone (the default).
    etcd_endpoints: tuple[str, ...] = ()
    #: the cluster's name: its keys live under /litecdc/<cluster>/ in etcd. Default "litecdc".
    cluster: str = "litecdc"
    #: etcd TLS (CA, client certificate and key) and user/password; default none.
    etcd_ca_cert: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_user: str | None = None
    etcd_password: str | None = None
    #: seconds the leader's lease lives without keepalives (failover time); default 2.
    lease_ttl: int = 2
    #: URL other nodes and redirected clients use to reach this node; default
    #: http(s)://<http-addr>.
    advertise_url: str = ""
    #: CA that signed the other nodes' HTTPS certificates, for forwarding writes to the
    #: leader and downloading snapshots; default the system's CAs.
    node_ca_cert: Path | None = None
    #: user and password this node presents to a peer's /db/backup when it catches up by
    #: snapshot (needed when the nodes use an auth file); default none.
    node_user: str | None = None
    node_password: str | None = None
    #: seconds between the leader's etcd log compactions (0 = never); default 30.
    compact_interval: float = 30.0
    #: newest log entries compaction always keeps; default 1,000.
    compact_keep: int = 1000
    #: retention cap of the change log, in commits: a pull subscriber's hold more than
    #: this far behind the head expires (it must re-snapshot), and with no webhook and no
    #: hold this many newest commits' changes are kept; default 1,000,000.
    retention_cids: int = DEFAULT_RETENTION_CIDS
    #: seconds between the leader's checks that the cap is enforced (and each node's
    #: trimming of its journal); default 5.
    retention_interval: float = 5.0
    #: newest journal entries each node keeps; older ones are deleted, oldest first
    #: (0 = keep every entry); default 1,000,000.
    journal_retention_cids: int = DEFAULT_RETENTION_CIDS
    #: processes that build the pull source's snapshot chunks (Arrow) in parallel; 0 =
    #: build them in the node's process; default 2.
    source_workers: int = 2

    def __post_init__(self) -> None:
        if self.synchronous not in SYNCHRONOUS_LEVELS:
            raise ConfigError(
                f"--synchronous must be one of {', '.join(SYNCHRONOUS_LEVELS)}, "
                f"got {self.synchronous!r}"
            )
        host, port = split_host_port(self.http_addr, "--http-addr")
        for option, text in (("--node-id", self.node_id), ("--data-dir", str(self.data_dir))):
            # a command line's bytes that are not UTF-8 arrive as lone surrogates: /status,
            # CDC envelopes and SQLite cannot carry them (QA: /status answered 500)
            _check_utf8(option, text)
        if not self.node_id:
            object.__setattr__(self, "node_id", f"{host}:{port}")
        if (self.http_cert is None) != (self.http_key is None):
            raise ConfigError("--http-cert and --http-key must be given together")
        for name, path in (
            ("http-cert", self.http_cert),
            ("http-key", self.http_key),
            ("auth", self.auth_file),
        ):
            _check_file(name, path)
        if not self.advertise_url:
            scheme = "https" if self.http_cert else "http"
            object.__setattr__(self, "advertise_url", f"{scheme}://{self.http_addr}")
        else:
            _check_advertise_url(self.advertise_url)
        for endpoint in self.etcd_endpoints:
            scheme, separator, address = endpoint.rpartition("://")
            if "@" in address:
                # (etcd's client took "root:SECRET@host" for a host name, waited forever and
                # logged the password: review QA)
                raise ConfigError(
                    f"--etcd: an endpoint takes no user:password@ (give --etcd-user and "
                    f"--etcd-password); got {shown_cdc_config(endpoint)!r}"
                )
            if separator and scheme.lower() not in ("http", "https"):
                raise ConfigError(
                    f"--etcd: an endpoint is host:port, http://host:port or "
                    f"https://host:port, got {endpoint!r}"
                )
            split_host_port(address, "--etcd")
        if self.clustered and port == 0:
            # the node id and advertised URL would say port 0, and other nodes would
            # forward there (cluster QA); the port is chosen only when the socket is bound
            raise ConfigError(
                f"--http-addr {self.http_addr} lets the system choose the port, which the "
                "other nodes of a cluster cannot know: give a fixed port, such as "
                f"{self.http_addr.rpartition(':')[0]}:4001"
            )
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.cluster):
            raise ConfigError(
                f"--cluster: a cluster name may hold letters, digits, '.', '_' and '-', got "
                f"{self.cluster!r}"
            )
        interval = self.compact_interval
        if not math.isfinite(interval) or not (
            interval == 0 or MIN_COMPACT_INTERVAL <= interval <= MAX_COMPACT_INTERVAL
        ):
            # (config QA: 1e10 and more ended the compactor thread, a wait too long for
            # the platform's clock; 0.001 kept the node and etcd busy at ~30 % CPU)
            raise ConfigError(
                "--compact-interval must be a number of seconds: 0 (never compact) or from "
                f"{MIN_COMPACT_INTERVAL:g} to {MAX_COMPACT_INTERVAL} (a week), got {interval:g}"
            )
        if self.retention_cids < 1:
            raise ConfigError(
                f"--retention-cids must keep at least 1 commit, got {self.retention_cids}"
            )
        if not 0 <= self.source_workers <= 64:
            raise ConfigError(
                f"--source-workers must be between 0 and 64, got {self.source_workers}"
            )
        if self.journal_retention_cids < 0:
            raise ConfigError(
                "--journal-retention-cids must be a number of commits, or 0 to keep every entry; "
                f"got {self.journal_retention_cids}"
            )
        if self.retention_interval <= 0:
            raise ConfigError(f"retention interval must be positive, got {self.retention_interval}")
        if self.compact_keep < 1:
            raise ConfigError(f"--compact-keep must keep at least 1 entry, got {self.compact_keep}")
        if not 2 <= self.lease_ttl <= ETCD_MAX_LEASE_TTL:
            # (config QA: etcd refused a longer lease on every election attempt, so the
            # node started and never led)
            raise ConfigError(
                f"--lease-ttl must be from 2 to {ETCD_MAX_LEASE_TTL} seconds (etcd's limits), "
                f"got {self.lease_ttl}"
            )
        if (self.etcd_cert is None) != (self.etcd_key is None):
            raise ConfigError("--etcd-cert and --etcd-key must be given together")
        # checked here, before the data directory is touched (cluster QA: refused starts
        # left a new db.sqlite and lock file behind)
        if (self.etcd_user is None) != (self.etcd_password is None):
            raise ConfigError("--etcd-user and --etcd-password must be given together")
        if (self.node_user is None) != (self.node_password is None):
            raise ConfigError("--node-user and --node-password must be given together")
        for name, path in (
            ("etcd-ca-cert", self.etcd_ca_cert),
            ("etcd-cert", self.etcd_cert),
            ("etcd-key", self.etcd_key),
            ("node-ca-cert", self.node_ca_cert),
        ):
            _check_file(name, path)
        # loaded now, not when first used (QA: a junk --node-ca-cert was found after the
        # data directory was made, in a message naming no option)
        for name, path in (
            ("etcd-ca-cert", self.etcd_ca_cert),
            ("node-ca-cert", self.node_ca_cert),
        ):
            if path is not None:
                check_ca_file(Path(path), f"--{name}")
        if self.etcd_cert is not None and self.etcd_key is not None:
            check_cert_and_key(
                Path(self.etcd_cert),
                Path(self.etcd_key),
                cert_option="--etcd-cert",
                key_option="--etcd-key",
            )
        if any(not " " <= ch <= "~" for ch in self.http_allow_origin):
            # it is sent as a header: a line break would let it add headers of its own
            raise ConfigError(
                "--http-allow-origin must be one header value of printable ASCII, such as "
                f"https://app.example.com or *, got {self.http_allow_origin!r}"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError(
                f"--max-body-bytes must be at least 1024 bytes, got {self.max_body_bytes}"
            )

    @property
    def clustered(self) -> bool:
        return bool(self.etcd_endpoints)

    @property
    def db_path(self) -> Path:
        return Path(self.data_dir) / DEFAULT_DB_FILE

    @property
    def http_host(self) -> str:
        return split_host_port(self.http_addr)[0]

    @property
    def http_port(self) -> int:
        return split_host_port(self.http_addr)[1]


def _check_utf8(option: str, text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = text.encode("utf-8", "backslashreplace").decode("ascii", "replace")
        raise ConfigError(f"{option} must be UTF-8 text, got {shown!r}") from None


def _check_file(name: str, path: Path | str | None) -> None:
    """``--name``'s file exists and is a regular file (a directory or a pipe is not)."""
    if path is None:
        return
    where = Path(path)
    if where.is_file():
        return
    if not where.exists():
        raise ConfigError(f"--{name}: file {str(path)!r} does not exist")
    kind = "a directory" if where.is_dir() else "not a regular file"
    raise ConfigError(f"--{name}: {str(path)!r} is {kind}; give a PEM or JSON file")


def split_host_port(address: str, option: str = "") -> tuple[str, int]:
    """Split "host:port" (IPv6 as "[::1]:4001"), with a clear error for anything else
    (naming ``option``, the setting it came from, when given)."""
    what = f"{option}: " if option else ""
    host, sep, port_text = address.rpartition(":")
    # (str.isdigit() takes "²" and other scripts' digits, which int() then refuses or reads)
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ConfigError(f"{what}address must look like host:port, got {address!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what}port must be between 0 and 65535, got {port}")
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        # (config QA: "::1:4001" was taken, and advertised as http://::1:4001, a URL the
        # other nodes could not forward to; Go, so rqlite, refuses it too)
        raise ConfigError(
            f"{what}an IPv6 address goes in brackets, as [{host}]:{port}; got {address!r}"
        )
    if bracketed != (host.startswith("[") or host.endswith("]")) or host == "[]":
        raise ConfigError(f"{what}address must look like host:port, got {address!r}")
    return host[1:-1] if bracketed else host, port


def env_default(name: str, default: str | None = None) -> str | None:
    """Read ``LITECDC_<NAME>`` from the environment."""
    return os.environ.get(f"LITECDC_{name.upper()}", default)


def _check_advertise_url(url: str) -> None:
    """Other nodes forward writes and fetch snapshots there: it must be an http(s) URL
    with a host (cluster QA: "notaurl" was taken, and forwarded writes then failed as
    "may have been applied")."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        # (it is published in etcd and /nodes: a password there would be shown to all)
        raise ConfigError(
            "--advertise-url takes no user:password@ (nodes present --node-user and "
            f"--node-password to each other); got {shown_cdc_config(url)!r}"
        )
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise ConfigError(
            f"--advertise-url must be an http:// or https:// URL with a host, such as "
            f"http://10.0.0.5:4001; got {shown_cdc_config(url)!r}"
        )
