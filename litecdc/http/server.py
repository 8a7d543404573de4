"""Run the HTTP API under uvicorn: httptools + uvloop, no access log, optional TLS."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import signal
import socket
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from litecdc.config import NodeConfig
from litecdc.errors import ConfigError
from litecdc.http.app import create_app, remove_backup_copies
from litecdc.http.forward import KEEP_ALIVE_S
from litecdc.node import Node
from litecdc.tls_files import check_cert_and_key

log = logging.getLogger("litecdc.http")

__all__ = ["listen", "serve"]

GIL_SWITCH_INTERVAL_S = 0.0005
#: seconds a closing connection may wait for its client at shutdown before it is aborted
SHUTDOWN_LINGER_S = 1.0
#: seconds requests in progress get to finish once the node is told to stop; then they are
#: cancelled (a client that stopped reading a /db/backup stream kept a stopping node, and
#: its data directory's lock, alive for as long as it held the connection: backup QA)
SHUTDOWN_GRACE_S = 10


class _NoTracebackForShutdownCancels(logging.Filter):
    """uvicorn logs "Cancel N running task(s), timeout graceful shutdown exceeded", then a
    full traceback per cancelled request: that one line says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


_SHUTDOWN_CANCELS = _NoTracebackForShutdownCancels()


class _NoWebSocketAdvice(logging.Filter):
    """Without WebSockets (the node serves none) uvicorn answers an ``Upgrade:
    websocket`` request as plain HTTP, as rqlite does, after its "Unsupported upgrade
    request." and advice to install a WebSocket library, which does not apply."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No supported WebSocket library")


_NO_WEBSOCKET_ADVICE = _NoWebSocketAdvice()


class _GracefulServer(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM/SIGINT once it has shut down, which kills the
    process before the node is closed (its CDC high watermark unwritten, the WAL left
    behind). A node finishes its shutdown and exits 0 instead."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn closes idle keep-alive connections and waits until every connection is
        gone. Over TLS a close waits for the client's close_notify, which an idle pooled
        client (another node's forwarder, any keep-alive HTTPS client) never sends, so the
        node hung for about 30 s, until killed. Connections still closing after
        ``SHUTDOWN_LINGER_S`` with nothing left to send are aborted instead; connections
        with a request in progress are not closing and finish first."""
        reaper = asyncio.ensure_future(self._abort_lingering())
        try:
            await super().shutdown(sockets)
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper

    async def _abort_lingering(self) -> None:
        closing_since: dict[int, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.1)
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is None or not transport.is_closing():
                    continue
                since = closing_since.setdefault(id(connection), loop.time())
                if (
                    loop.time() - since >= SHUTDOWN_LINGER_S
                    and transport.get_write_buffer_size() == 0
                ):
                    transport.abort()


def _loop_and_http() -> tuple[str, str | type[asyncio.Protocol]]:
    """The fastest event loop and HTTP parser installed (uvicorn[standard] brings both);
    httptools with litecdc's limits on a request's head (litecdc/http/protocol.py)."""
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        loop = "asyncio"
    http: str | type[asyncio.Protocol]
    try:
        from litecdc.http.protocol import GuardedHttpToolsProtocol

        http = GuardedHttpToolsProtocol
    except ImportError:  # pragma: no cover
        http = "h11"
    return loop, http


#: uvicorn's default
LISTEN_BACKLOG = 2048


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (every address the name resolves to, as asyncio's
    create_server binds); ConfigError naming the address if one cannot be bound."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise ConfigError(f"--http-addr: cannot resolve {host!r}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            if port == 0 and sockets:
                # one port for every address the name resolves to: the one the system chose
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            # listening now, not when uvicorn starts: with SO_REUSEADDR two processes may
            # both bind one port while neither listens, and both would open their node
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError(
            f"--http-addr {where}: cannot listen there: {exc.strerror or exc}"
            + (" (another process is using the port?)" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    return sockets


def with_bound_port(config: NodeConfig, port: int) -> NodeConfig:
    """``config`` (``--http-addr HOST:0``) with the port the system chose, so the log line,
    /status and the default node id and advertised URL show where the node really is.
    (A cluster refuses port 0: its node id would change at each start.)"""
    default_id = config.node_id == f"{config.http_host}:0"
    scheme = "https" if config.http_cert else "http"
    default_url = config.advertise_url == f"{scheme}://{config.http_addr}"
    host = config.http_addr.rpartition(":")[0]
    return dataclasses.replace(
        config,
        http_addr=f"{host}:{port}",
        node_id="" if default_id else config.node_id,
        advertise_url="" if default_url else config.advertise_url,
    )


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM, like SIGINT, interrupts what runs meanwhile (uvicorn handles both once it
    serves); the handlers before are restored after."""
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(sig: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def advertise_scheme_problem(config: NodeConfig) -> str | None:
    """Why other nodes may get no answer at a cluster node's --advertise-url: its scheme
    is not what the node serves (authz QA: an HTTPS node advertising http:// took every
    forwarded write's plain request for garbage, and the follower answered 504 "may have
    been applied", sending the client's credentials in clear). A warning, not an error: a
    proxy in between may speak the other scheme to the node."""
    if not config.clustered:
        return None
    advertised = urllib.parse.urlsplit(config.advertise_url).scheme
    served = "https" if config.http_cert is not None else "http"
    if advertised == served:
        return None
    return (
        f"--advertise-url {config.advertise_url} is {advertised}://, but this node serves "
        f"{served.upper()}{' (--http-cert)' if config.http_cert else ''}: other nodes forward "
        "writes and fetch snapshots there, and get no answer unless a proxy in between "
        f"speaks {served} to this node"
    )


def serve(config: NodeConfig) -> None:
    """Open the node in ``config.data_dir`` and serve it until SIGINT/SIGTERM.

    Raises ConfigError before anything listens or the store is opened for a bad
    certificate/key pair or an address it cannot bind (in use, not local), and (from
    create_app) for a bad auth file. Logs "serving" once the socket is bound. On exit
    stops CDC delivery (persisting its high watermark) and closes the store.
    """
    # Store calls run in worker threads; with Python's default 5 ms GIL switch interval
    # the event loop waits too long to get the GIL back (measured: 16-client writes
    # 1,717 -> 1,946 req/s with 0.5 ms, bench/bench_http.py --client stdlib).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    if config.http_cert is not None and config.http_key is not None:
        check_cert_and_key(Path(config.http_cert), Path(config.http_key))
    if problem := advertise_scheme_problem(config):
        log.warning("%s", problem)
    sockets = listen(config.http_host, config.http_port)
    if config.http_port == 0 and sockets:
        config = with_bound_port(config, sockets[0].getsockname()[1])
    try:
        try:
            with _stop_signals_interrupt():
                node = Node(config)
        except KeyboardInterrupt:
            # (a cluster node waits for etcd here, as long as it takes: a SIGTERM killed
            # it without a word — config QA)
            log.info("litecdc node %s stopped while starting: it served nothing", config.node_id)
            return
        try:
            app = create_app(node.store, config, cdc=node.cdc, cluster=node.cluster)
            loop, http = _loop_and_http()
            server = _GracefulServer(
                uvicorn.Config(
                    app,
                    host=config.http_host,
                    port=config.http_port,
                    loop=loop,
                    http=http,
                    access_log=False,
                    log_level="warning",
                    # (uvicorn's lines through the node's own format: they had no time)
                    log_config=None,
                    lifespan="off",
                    ssl_certfile=str(config.http_cert) if config.http_cert else None,
                    ssl_keyfile=str(config.http_key) if config.http_key else None,
                    server_header=False,
                    date_header=False,
                    timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                    timeout_keep_alive=KEEP_ALIVE_S,
                    # no WebSockets: a request asking for one was handed to uvicorn's
                    # websocket protocol, answered 403, and one pipelined behind another
                    # took its connection over, the earlier answer lost (review)
                    ws="none",
                )
            )
            uvicorn_log = logging.getLogger("uvicorn.error")  # (set up by uvicorn.Config)
            for quiet in (_SHUTDOWN_CANCELS, _NO_WEBSOCKET_ADVICE):
                if quiet not in uvicorn_log.filters:
                    uvicorn_log.addFilter(quiet)
            node.start()
            scheme = "https" if config.http_cert else "http"
            log.info("litecdc node %s serving %s://%s", config.node_id, scheme, config.http_addr)
            server.run(sockets=sockets)
            # (ops QA: a stop said nothing at all)
            log.info("litecdc node %s stopping: requests ended; closing", config.node_id)
        finally:
            node.close()
            # (a /db/backup cancelled at shutdown leaves its copy: it is no use now)
            remove_backup_copies(config.data_dir)
        log.info("litecdc node %s stopped", config.node_id)
    finally:
        for sock in sockets:
            sock.close()
