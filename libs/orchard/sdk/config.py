"""Where the SDK connects and how it authenticates: arguments first, then environment variables.

This is the only SDK module that reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc

DEFAULT_TARGET = "127.0.0.1:50051"


@dataclass(frozen=True)
class ClientConfig:
    """A resolved client configuration."""

    target: str
    """gRPC target, "host:port"."""
    secure: bool
    """Use TLS (the address was given as https://...)."""
    api_key: str | None
    """Sent as `authorization: Bearer <api_key>` on every call when set."""
    prefix: str | None
    """Prepended to the ids of sandboxes this client creates, and set as label "orchard.prefix"."""
    tls_ca_file: str | None = None
    """PEM CA bundle that signed the service's certificate (default: the system's roots)."""
    tls_cert_file: str | None = None
    """PEM client certificate, for a service that requires mutual TLS."""
    tls_key_file: str | None = None
    """PEM private key of tls_cert_file."""

    def credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials from the configured files (read now)."""

        def read(path: str | None) -> bytes | None:
            return Path(path).read_bytes() if path else None

        return grpc.ssl_channel_credentials(read(self.tls_ca_file), read(self.tls_key_file), read(self.tls_cert_file))


def load_config(target: str | None = None, api_key: str | None = None, prefix: str | None = None) -> ClientConfig:
    """Resolve the configuration: arguments, else env vars, else the local default.

    target: ORCHARD_ENV_ADDRESS, else SANDBOX_BASE_URL (the public SDK's "http://host:port" form
    is accepted; its scheme is stripped), else 127.0.0.1:50051.
    api_key: ORCHARD_API_KEY, else SANDBOX_API_KEY. prefix: SANDBOX_PREFIX. TLS files (for https://
    addresses): ORCHARD_TLS_CA_FILE, ORCHARD_TLS_CERT_FILE and ORCHARD_TLS_KEY_FILE.
    """
    raw = target or os.environ.get("ORCHARD_ENV_ADDRESS") or os.environ.get("SANDBOX_BASE_URL") or DEFAULT_TARGET
    address, secure = _parse_target(raw)
    return ClientConfig(
        target=address,
        secure=secure,
        api_key=api_key or os.environ.get("ORCHARD_API_KEY") or os.environ.get("SANDBOX_API_KEY") or None,
        prefix=prefix or os.environ.get("SANDBOX_PREFIX") or None,
        tls_ca_file=os.environ.get("ORCHARD_TLS_CA_FILE") or None,
        tls_cert_file=os.environ.get("ORCHARD_TLS_CERT_FILE") or None,
        tls_key_file=os.environ.get("ORCHARD_TLS_KEY_FILE") or None,
    )


def _parse_target(raw: str) -> tuple[str, bool]:
    """("host:port", secure) from "host:port", "http://host:port/" or "https://host:port"."""
    raw = raw.strip()
    if "://" not in raw:
        return raw.rstrip("/"), False
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"cannot use {raw!r} as the env service address; give host:port or http(s)://host:port")
    return parts.netloc, parts.scheme == "https"
