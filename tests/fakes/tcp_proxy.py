"""A TCP proxy on 127.0.0.1 that a test can cut: the server "goes away" mid-conversation.

``TcpProxy(host, port)`` listens on a free port and relays every connection it accepts to
``host:port``, a thread per direction. ``cut()`` closes every relayed connection at once,
both sides — to the client it looks as if the server died (EOF, or a reset); new
connections are relayed again, so a client that reconnects finds the server back.

Usage::

    with TcpProxy("127.0.0.1", rabbitmq_port) as proxy:
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/"
        ...                      # the client talks to the server through the proxy
        proxy.cut()              # every open connection drops
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["TcpProxy"]


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0
        self._stopped = False
        self._acceptor = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed by stop()
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Close every relayed connection, both sides, now."""
        with self._lock:
            sockets, self._open = self._open, []
            self.cuts += 1
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._listener.close()
            self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
