"""Checking a PEM certificate and its private key before anything starts: one
ConfigError naming the options and what is wrong (swapped, not PEM, a key of another
certificate, encrypted) instead of OpenSSL's ``[SSL] PEM lib``."""

from __future__ import annotations

import ssl
from pathlib import Path

from litecdc.errors import ConfigError


class _EncryptedKeyError(Exception):
    """The private key asked for a password (litecdc takes none)."""


def _no_password() -> bytes:
    raise _EncryptedKeyError


def check_cert_and_key(
    cert: Path, key: Path, *, cert_option: str = "--http-cert", key_option: str = "--http-key"
) -> None:
    """Load ``cert`` and ``key`` as a TLS endpoint will; ConfigError naming the options."""
    names = f"{cert_option} {str(cert)!r} and {key_option} {str(key)!r}"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_password)
    except _EncryptedKeyError:
        raise ConfigError(
            f"{key_option} {str(key)!r} is encrypted; litecdc needs the private key unencrypted"
        ) from None
    except ssl.SSLError as exc:
        cert_text, key_text = cert.read_bytes(), key.read_bytes()
        if b"-----BEGIN CERTIFICATE-----" not in cert_text:
            why = f"{cert_option} {str(cert)!r} holds no PEM certificate"
            if b"PRIVATE KEY-----" in cert_text and b"-----BEGIN CERTIFICATE-----" in key_text:
                why += f" (it holds the private key: are {cert_option} and {key_option} swapped?)"
        elif b"PRIVATE KEY-----" not in key_text:
            why = f"{key_option} {str(key)!r} holds no PEM private key"
        elif exc.reason in ("KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"):
            # (the second: a key of another type, an EC key for an RSA certificate; config
            # QA met OpenSSL's "no certificate assigned")
            why = f"the private key in {key_option} {str(key)!r} is not the certificate's key"
        else:
            why = f"{names} cannot be loaded: {exc}"
        raise ConfigError(why) from None
    except OSError as exc:
        raise ConfigError(f"{names} cannot be read: {exc}") from None


def check_ca_file(path: Path, option: str) -> None:
    """``option``'s file holds CA certificates OpenSSL can load."""
    try:
        ssl.create_default_context(cafile=str(path))
    except ssl.SSLError as exc:
        raise ConfigError(
            f"{option} {str(path)!r} holds no PEM CA certificate OpenSSL can load "
            f"({exc.reason or exc})"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{option} {str(path)!r} cannot be read: {exc.strerror}") from None
