"""Throw-away certificates for HTTPS and mutual-TLS tests, made with trustme.

``make_certs(directory)`` creates a fresh certificate authority, a server
certificate valid for ``127.0.0.1`` and ``localhost``, and a client certificate,
all signed by that CA, and writes them as PEM files::

    ca.pem        the CA certificate (what a client trusts)
    server.pem    the server certificate chain
    server.key    the server private key
    client.pem    the client certificate chain (for mutual TLS)
    client.key    the client private key

Each call makes a new, unrelated CA, so two calls give a "wrong CA" for
negative tests. Usage::

    certs = make_certs(tmp_path / "certs")
    with WebhookReceiver(tls=certs, require_client_cert=True) as receiver:
        ctx = client_ssl_context(certs)            # trusts ca.pem, presents client.pem
        httpx.post(receiver.url, json={}, verify=ctx)
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = [
    "CLIENT_COMMON_NAME",
    "CertFiles",
    "client_ssl_context",
    "make_certs",
    "server_ssl_context",
]

CLIENT_COMMON_NAME = "litecdc-test-client"
"""Common name of the client certificate that ``make_certs`` issues."""

SERVER_IDENTITIES: tuple[str, ...] = ("127.0.0.1", "localhost")
"""Names the server certificate is valid for, by default."""


@dataclass(frozen=True)
class CertFiles:
    """Paths of the PEM files written by ``make_certs``."""

    directory: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_common_name: str


def make_certs(
    directory: Path,
    *,
    server_identities: tuple[str, ...] = SERVER_IDENTITIES,
    client_common_name: str = CLIENT_COMMON_NAME,
) -> CertFiles:
    """Create a CA, a server and a client certificate and write them to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert(*server_identities)
    client = ca.issue_cert(f"{client_common_name}@litecdc.test", common_name=client_common_name)

    files = CertFiles(
        directory=directory,
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        client_common_name=client_common_name,
    )
    ca.cert_pem.write_to_path(str(files.ca_cert))
    files.server_cert.write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
    server.private_key_pem.write_to_path(str(files.server_key))
    files.client_cert.write_bytes(b"".join(pem.bytes() for pem in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(files.client_key))
    return files


def server_ssl_context(certs: CertFiles, *, require_client_cert: bool = False) -> ssl.SSLContext:
    """A server-side context presenting ``server.pem``.

    Client certificates signed by ``ca.pem`` are always asked for and verified when
    presented; with ``require_client_cert`` a client without one fails the handshake.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    ctx.load_verify_locations(cafile=certs.ca_cert)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_ssl_context(certs: CertFiles, *, client_cert: bool = True) -> ssl.SSLContext:
    """A client-side context trusting ``ca.pem``; presents ``client.pem`` if ``client_cert``."""
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
    if client_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx
