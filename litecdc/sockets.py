"""Breaking a connection another thread waits on (the pipeline's sinks and metadata store:
a server that stopped answering keeps a blocking client waiting for ever)."""

from __future__ import annotations

import os
import socket


def shut_down_socket(fd: int) -> None:
    """Shut the socket behind ``fd`` down for both directions: a thread blocked reading
    or writing it returns at once (end of stream), and the descriptor stays valid for
    its owner to close. Shutting a socket down is safe from any thread; closing a
    connection another thread is in is not."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already, or never connected
