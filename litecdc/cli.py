"""The ``litecdc`` command. Each command builds a NodeConfig and makes one library call.

    litecdc serve --data-dir DIR [--http-addr HOST:PORT] [--node-id ID] [--auth FILE]
                  [--http-cert FILE --http-key FILE] [--http-allow-origin ORIGIN]
                  [--synchronous full|normal|off|extra]
                  [--max-body-bytes N] [--fk] [--cdc-config URL|stdout|FILE]
                  [--etcd HOST:PORT[,…] --cluster NAME [--etcd-ca-cert F --etcd-cert F
                   --etcd-key F] [--etcd-user U --etcd-password P] [--lease-ttl S]
                   [--advertise-url URL] [--node-ca-cert F] [--node-user U --node-password P]
                   [--compact-interval S] [--compact-keep N]]
                  [--retention-cids N] [--journal-retention-cids N] [--source-workers N]
    litecdc demo [--data-dir DIR] [--cluster]
    litecdc pipeline subscribe|run|list|status|unsubscribe|verify …  (litecdc/pipeline/cli.py)

Every option can also come from the environment as ``LITECDC_<OPTION>`` (for example
``LITECDC_DATA_DIR``). A configuration error prints one line, ``error: ...``, and exits
with status 2.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
from pathlib import Path

import click

from litecdc.cdc import known_schemes, parse_cdc_config
from litecdc.config import (
    DEFAULT_HTTP_ADDR,
    DEFAULT_MAX_BODY_BYTES,
    SYNCHRONOUS_LEVELS,
    NodeConfig,
)
from litecdc.db.schema import DEFAULT_RETENTION_CIDS
from litecdc.errors import ConfigError, LitecdcError

__all__ = ["cli", "main"]

EXIT_CONFIG = 2


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="litecdc")
def cli() -> None:
    """litecdc: replicated SQLite with change data capture, speaking rqlite's HTTP API."""


#: serve's options that only a cluster member uses
_CLUSTER_ONLY = (
    "cluster",
    "etcd_ca_cert",
    "etcd_cert",
    "etcd_key",
    "etcd_user",
    "etcd_password",
    "lease_ttl",
    "advertise_url",
    "node_ca_cert",
    "node_user",
    "node_password",
    "compact_interval",
    "compact_keep",
)


def _refuse_cluster_options_standalone(ctx: click.Context) -> None:
    """Cluster options given without --etcd (QA: LITECDC_CLUSTER set and LITECDC_ETCD
    forgotten started a lone node taking writes on a new directory, without a word)."""
    given = []
    for name in _CLUSTER_ONLY:
        source = ctx.get_parameter_source(name)
        if source is click.core.ParameterSource.COMMANDLINE:
            given.append("--" + name.replace("_", "-"))
        elif source is click.core.ParameterSource.ENVIRONMENT:
            given.append("LITECDC_" + name.upper())
    if given:
        raise ConfigError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for cluster mode, which "
            "needs --etcd (or LITECDC_ETCD): give the etcd endpoints, or leave "
            f"{'it' if len(given) == 1 else 'them'} out to run standalone"
        )


@cli.command()
@click.option(
    "--data-dir",
    envvar="LITECDC_DATA_DIR",
    help="Directory of the node's SQLite file (created if missing). Required.",
)
@click.option(
    "--http-addr",
    envvar="LITECDC_HTTP_ADDR",
    default=DEFAULT_HTTP_ADDR,
    show_default=True,
    help="host:port the HTTP API listens on.",
)
@click.option(
    "--node-id", envvar="LITECDC_NODE_ID", default="", help="Node id. Default: the HTTP address."
)
@click.option(
    "--auth",
    "auth_file",
    envvar="LITECDC_AUTH",
    help="rqlite-format auth file: JSON list of {username, password, perms}. Default: no auth.",
)
@click.option("--http-cert", envvar="LITECDC_HTTP_CERT", help="PEM certificate for HTTPS.")
@click.option("--http-key", envvar="LITECDC_HTTP_KEY", help="PEM private key for HTTPS.")
@click.option(
    "--http-allow-origin",
    envvar="LITECDC_HTTP_ALLOW_ORIGIN",
    default="",
    help="Access-Control-Allow-Origin header on every response, so browser pages of that "
    "origin may call the API (rqlite's -http-allow-origin), e.g. https://app.example.com "
    "or *. Default: none.",
)
@click.option(
    "--synchronous",
    envvar="LITECDC_SYNCHRONOUS",
    default="full",
    show_default=True,
    help=f"SQLite PRAGMA synchronous for writes: {', '.join(SYNCHRONOUS_LEVELS)}.",
)
@click.option(
    "--max-body-bytes",
    envvar="LITECDC_MAX_BODY_BYTES",
    default=str(DEFAULT_MAX_BODY_BYTES),
    show_default=True,
    help="Largest request body accepted (HTTP 413 above it).",
)
@click.option(
    "--fk",
    "foreign_keys",
    envvar="LITECDC_FK",
    is_flag=True,
    default=False,
    help="Enforce foreign key constraints (rqlite's -fk). Every node must use the same setting.",
)
@click.option(
    "--etcd",
    "etcd",
    envvar="LITECDC_ETCD",
    default=None,
    help="Cluster mode: etcd endpoints, host:port[,host:port…]. Default: standalone (a data "
    "directory that belongs to a cluster is refused without it).",
)
@click.option(
    "--cluster",
    "cluster",
    envvar="LITECDC_CLUSTER",
    default="litecdc",
    show_default=True,
    help="Cluster name (its keys live under /litecdc/<name>/ in etcd).",
)
@click.option("--etcd-ca-cert", envvar="LITECDC_ETCD_CA_CERT", help="CA of etcd's certificates.")
@click.option("--etcd-cert", envvar="LITECDC_ETCD_CERT", help="Client certificate for etcd.")
@click.option("--etcd-key", envvar="LITECDC_ETCD_KEY", help="Client key for etcd.")
@click.option("--etcd-user", envvar="LITECDC_ETCD_USER", help="etcd user name.")
@click.option("--etcd-password", envvar="LITECDC_ETCD_PASSWORD", help="etcd password.")
@click.option(
    "--lease-ttl",
    envvar="LITECDC_LEASE_TTL",
    default="2",
    show_default=True,
    help="Seconds the leader's lease lives without keepalives (bounds failover time).",
)
@click.option(
    "--advertise-url",
    envvar="LITECDC_ADVERTISE_URL",
    default="",
    help="URL other nodes use to reach this one. Default: http(s)://<http-addr>.",
)
@click.option(
    "--node-ca-cert",
    envvar="LITECDC_NODE_CA_CERT",
    help="CA of the other nodes' HTTPS certificates, for forwarding writes to the leader "
    "and downloading snapshots from peers.",
)
@click.option(
    "--node-user",
    envvar="LITECDC_NODE_USER",
    help="User this node presents to a peer's /db/backup when catching up by snapshot.",
)
@click.option("--node-password", envvar="LITECDC_NODE_PASSWORD", help="Its password.")
@click.option(
    "--compact-interval",
    envvar="LITECDC_COMPACT_INTERVAL",
    default="30",
    show_default=True,
    help="Seconds between the leader's etcd log compactions (0 = never).",
)
@click.option(
    "--compact-keep",
    envvar="LITECDC_COMPACT_KEEP",
    default="1000",
    show_default=True,
    help="Newest log entries a compaction always keeps.",
)
@click.option(
    "--retention-cids",
    envvar="LITECDC_RETENTION_CIDS",
    default=str(DEFAULT_RETENTION_CIDS),
    show_default=True,
    help="Retention cap of the change log, in commits: a pipeline subscriber further behind "
    "must re-snapshot; with no webhook and no subscriber, the newest this many are kept.",
)
@click.option(
    "--journal-retention-cids",
    envvar="LITECDC_JOURNAL_RETENTION_CIDS",
    default=str(DEFAULT_RETENTION_CIDS),
    show_default=True,
    help="Newest journal entries the node keeps (older ones are deleted, oldest first); "
    "0 keeps every entry.",
)
@click.option(
    "--source-workers",
    envvar="LITECDC_SOURCE_WORKERS",
    default="2",
    show_default=True,
    help="Processes that build the pull source's snapshot chunks in parallel (0 = in the "
    "node's process).",
)
@click.option(
    "--cdc-config",
    envvar="LITECDC_CDC_CONFIG",
    default=None,
    help="Deliver every row change to a webhook: an http(s):// URL, 'stdout', or a JSON file "
    "with rqlite's CDC keys. Default: no delivery.",
)
def serve(
    data_dir: str | None,
    http_addr: str,
    node_id: str,
    auth_file: str | None,
    http_cert: str | None,
    http_key: str | None,
    http_allow_origin: str,
    synchronous: str,
    max_body_bytes: str,
    foreign_keys: bool,
    etcd: str | None,
    cluster: str,
    etcd_ca_cert: str | None,
    etcd_cert: str | None,
    etcd_key: str | None,
    etcd_user: str | None,
    etcd_password: str | None,
    lease_ttl: str,
    advertise_url: str,
    node_ca_cert: str | None,
    node_user: str | None,
    node_password: str | None,
    compact_interval: str,
    compact_keep: str,
    retention_cids: str,
    journal_retention_cids: str,
    source_workers: str,
    cdc_config: str | None,
) -> None:
    """Run one node serving the HTTP API until interrupted: standalone, or with --etcd a
    member of a cluster."""
    # (with the level: ops QA could not tell warnings from the rest, docs say which is which)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("httpx", "httpcore"):  # a line per webhook or etcd request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # `kill -USR1 PID` prints every thread's stack on stderr: what a node that does not
    # stop, or does not answer, is waiting on
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    faulthandler.enable(all_threads=True)  # (and on a crash in native code, before dying)
    try:
        if not data_dir:
            raise ConfigError("--data-dir is required (or set LITECDC_DATA_DIR)")
        if not etcd:
            _refuse_cluster_options_standalone(click.get_current_context())
        try:
            max_body = int(max_body_bytes)
        except ValueError:
            raise ConfigError(
                f"--max-body-bytes must be an integer, got {max_body_bytes!r}"
            ) from None
        config = NodeConfig(
            data_dir=Path(data_dir),
            http_addr=http_addr,
            node_id=node_id,
            synchronous=synchronous.lower(),
            auth_file=Path(auth_file) if auth_file else None,
            http_cert=Path(http_cert) if http_cert else None,
            http_key=Path(http_key) if http_key else None,
            http_allow_origin=http_allow_origin,
            max_body_bytes=max_body,
            foreign_keys=foreign_keys,
            etcd_endpoints=_etcd_endpoints(etcd),
            cluster=cluster,
            etcd_ca_cert=Path(etcd_ca_cert) if etcd_ca_cert else None,
            etcd_cert=Path(etcd_cert) if etcd_cert else None,
            etcd_key=Path(etcd_key) if etcd_key else None,
            etcd_user=etcd_user or None,
            etcd_password=etcd_password or None,
            lease_ttl=_integer("--lease-ttl", lease_ttl),
            advertise_url=advertise_url,
            node_ca_cert=Path(node_ca_cert) if node_ca_cert else None,
            node_user=node_user or None,
            node_password=node_password or None,
            compact_interval=_number("--compact-interval", compact_interval),
            compact_keep=_integer("--compact-keep", compact_keep),
            retention_cids=_integer("--retention-cids", retention_cids),
            journal_retention_cids=_integer("--journal-retention-cids", journal_retention_cids),
            source_workers=_integer("--source-workers", source_workers),
            # an empty --cdc-config '' is refused (an empty LITECDC_CDC_CONFIG is unset: click)
            cdc=None
            if cdc_config is None
            else parse_cdc_config(cdc_config, known_schemes=known_schemes()),
        )
        from litecdc.http.server import serve as serve_http

        serve_http(config)
    except ConfigError as exc:
        _fail(_as_given(str(exc), click.get_current_context()), EXIT_CONFIG)
    except LitecdcError as exc:
        _fail(str(exc), 1)
    except OSError as exc:
        _fail(f"cannot start: {exc}", 1)


def _as_given(message: str, ctx: click.Context) -> str:
    """An error about ``--option`` whose value came from its LITECDC_* variable names the
    variable first (QA: LITECDC_HTTP_ADDR=foo was reported as --http-addr only)."""
    flag = message.split(maxsplit=1)[0].rstrip(":") if message.startswith("--") else ""
    environment = click.core.ParameterSource.ENVIRONMENT
    for param in ctx.command.params:
        if (
            flag in param.opts
            and isinstance(param, click.Option)
            and param.name
            and ctx.get_parameter_source(param.name) is environment
        ):
            return f"{param.envvar}: {message}"
    return message


@cli.command()
@click.option(
    "--data-dir",
    default=None,
    help="Keep the demo node's data here. Default: a temporary directory, removed afterwards.",
)
@click.option(
    "--cluster",
    is_flag=True,
    help="Run a local 3-node cluster with its own etcd instead, write through a follower, "
    "kill the leader and show the new one taking writes (needs Debian's etcd-server).",
)
@click.option(
    "--no-pipeline",
    is_flag=True,
    help="Stop after the node's part (no Spark, no PostgreSQL).",
)
def demo(data_dir: str | None, cluster: bool, no_pipeline: bool) -> None:
    """Start a standalone node pushing its changes to a webhook, run a short workload over
    HTTP and show the journal entries and row changes it produced, then mirror the table
    into Delta Lake and PostgreSQL with the Spark pipeline and verify both (`make run`)."""
    from litecdc.demo import run_demo

    if data_dir:
        try:  # (a file there ended in a FileExistsError traceback: QA)
            Path(data_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(f"--data-dir {data_dir!r} cannot be used as a directory: {exc.strerror}", 2)
    try:
        code = run_demo(
            click.echo,
            Path(data_dir) if data_dir else None,
            cluster=cluster,
            pipeline=not no_pipeline,
        )
    except RuntimeError as exc:
        _fail(str(exc), 1)
    sys.exit(code)


#: what serve's options take, for --help (they are read as text and checked by the
#: node's configuration, whose errors name the option)
_METAVARS = {
    "data_dir": "DIR", "http_addr": "HOST:PORT", "node_id": "ID", "auth_file": "FILE",
    "http_cert": "FILE", "http_key": "FILE", "http_allow_origin": "ORIGIN",
    "synchronous": "off|normal|full|extra", "max_body_bytes": "BYTES",
    "etcd": "HOST:PORT[,…]", "cluster": "NAME", "etcd_ca_cert": "FILE", "etcd_cert": "FILE",
    "etcd_key": "FILE", "etcd_user": "USER", "etcd_password": "PASSWORD",
    "lease_ttl": "SECONDS", "advertise_url": "URL", "node_ca_cert": "FILE",
    "node_user": "USER", "node_password": "PASSWORD", "compact_interval": "SECONDS",
    "compact_keep": "N", "retention_cids": "N", "journal_retention_cids": "N",
    "source_workers": "N", "cdc_config": "URL|stdout|FILE",
}  # fmt: skip


def _describe_serve_options() -> None:
    """--help shows what each option takes and its LITECDC_* variable (QA: every option
    said TEXT, and the variables were nowhere in the help)."""
    for param in serve.params:
        if isinstance(param, click.Option):
            param.show_envvar = True
            if param.name in _METAVARS:
                param.metavar = _METAVARS[param.name]


_describe_serve_options()


def _add_pipeline() -> None:
    from litecdc.pipeline.cli import pipeline

    cli.add_command(pipeline)


_add_pipeline()


def _etcd_endpoints(text: str | None) -> tuple[str, ...]:
    """--etcd's endpoints; () when the option is not given. A given value naming no
    endpoint (``--etcd ''``, ``--etcd "$ETCD"`` with ETCD unset, ``--etcd ,``) is refused:
    it would start a cluster member standalone (cluster QA: its data forked)."""
    if text is None:
        return ()
    endpoints = tuple(e.strip() for e in text.split(","))
    if not all(endpoints):
        raise ConfigError(
            f"--etcd {text!r} names an empty endpoint: give host:port[,host:port…], or leave "
            "--etcd out to run standalone"
        )
    return endpoints


def _integer(option: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{option} must be an integer, got {text!r}") from None


def _number(option: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{option} must be a number, got {text!r}") from None


def main() -> None:
    """Console entry point (``litecdc = "litecdc.cli:main"``)."""
    cli(prog_name="litecdc")
