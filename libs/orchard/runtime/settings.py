"""Typed service settings: defaults < env vars `ORCHARD_<SERVICE>_<FIELD>` < command-line flags.

This is the only module that reads the environment (through pydantic-settings).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Literal, TypeVar

import pydantic
from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from orchard.runtime.tenancy import load_tokens

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class SettingsError(ValueError):
    """A setting has an invalid value; the message names the field, env var and flag."""


class ServiceSettings(BaseSettings):
    """Settings every service has. Subclass it per service, set `env_prefix` and a `port` default.

    Example:
        class EnvSettings(ServiceSettings):
            model_config = SettingsConfigDict(env_prefix="ORCHARD_ENV_", extra="forbid")
            port: int = 50051
            \"\"\"TCP port to listen on (0 picks a free one).\"\"\"
    """

    model_config = SettingsConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)

    host: str = "127.0.0.1"
    """Address to listen on; use 0.0.0.0 to accept connections from other hosts."""

    port: int
    """TCP port to listen on (0 picks a free one); each service sets its own default."""

    grace_period_s: float = Field(default=5.0, ge=0)
    """Seconds in-flight RPCs get to finish after SIGTERM before they are cancelled."""

    log_level: str = "INFO"
    """Lowest log level written: DEBUG, INFO, WARNING, ERROR or CRITICAL."""

    log_format: Literal["json", "text"] = "json"
    """Log line format: json (one object per line) or text (for humans)."""

    auth_token: str | None = Field(default=None, repr=False)
    """Bearer token clients must send as 'authorization: Bearer <token>' (tenant "default"); unset with no
    auth_tokens_file disables auth."""

    auth_tokens_file: Path | None = None
    """File of `tenant:token` lines: each token is a tenant, who sees only its own resources."""

    max_message_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """Largest gRPC message sent or received, in bytes."""

    metrics_port: int | None = None
    """Port of the Prometheus /metrics endpoint (0 picks a free one); unset serves no metrics."""

    tls_cert_file: Path | None = None
    """PEM certificate (chain) of the gRPC port; with tls_key_file it turns TLS on."""

    tls_key_file: Path | None = None
    """PEM private key of tls_cert_file."""

    tls_client_ca_file: Path | None = None
    """PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)."""

    @property
    def auth_enabled(self) -> bool:
        return self.auth_token is not None or self.auth_tokens_file is not None

    def auth_tokens(self) -> dict[str, str]:
        """token -> tenant (see orchard.runtime.tenancy.load_tokens)."""
        return load_tokens(self.auth_token, self.auth_tokens_file)

    @model_validator(mode="after")
    def _check_auth_tokens(self) -> ServiceSettings:
        if self.auth_tokens_file is not None:
            if not self.auth_tokens_file.is_file():
                raise ValueError(f"auth tokens file {self.auth_tokens_file} does not exist")
            self.auth_tokens()  # malformed lines fail at start-up, naming the line
        return self

    @model_validator(mode="after")
    def _check_tls(self) -> ServiceSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        for path in (self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file):
            if path is not None and not path.is_file():
                raise ValueError(f"TLS file {path} does not exist")
        return self

    @field_validator("port")
    @classmethod
    def _check_port(cls, port: int) -> int:
        if not 0 <= port <= 65535:
            raise ValueError("must be between 0 and 65535 (0 picks a free port)")
        return port

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, level: str) -> str:
        if level.upper() not in _LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(_LOG_LEVELS)}")
        return level.upper()

    @field_validator("auth_token")
    @classmethod
    def _check_auth_token(cls, token: str | None) -> str | None:
        if token is not None and not token.strip():
            raise ValueError("must not be empty; unset it to disable auth")
        return token


S = TypeVar("S", bound=ServiceSettings)


def load_settings(cls: type[S], argv: Sequence[str] | None = None) -> S:
    """Build `cls` from defaults, env vars and flags (`argv`, default sys.argv[1:]), flags winning.

    Raises:
        SettingsError: a value is invalid; the message names the field, env var and flag.
        SystemExit: argparse rejected the command line (unknown flag, --help).
    """
    parser = _build_parser(cls)
    flags = vars(parser.parse_args(argv))
    try:
        # pydantic-settings gives init kwargs priority over env vars, which beat defaults.
        return cls(**flags)
    except pydantic.ValidationError as exc:
        raise SettingsError(_describe(cls, exc)) from None


def _build_parser(cls: type[ServiceSettings]) -> argparse.ArgumentParser:
    """One flag per field; flags not given are absent from the result (not None)."""
    doc = (cls.__doc__ or "").strip()
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0] if doc else None, argument_default=argparse.SUPPRESS
    )
    for name, info in cls.model_fields.items():
        help_text = f"{info.description or ''} (env {_env_var(cls, name)}; default {_default_text(info)})"
        if info.annotation is bool:
            parser.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            # Values stay strings; pydantic converts and validates them like env vars.
            parser.add_argument(_flag(name), dest=name, metavar=name.upper(), help=help_text)
    return parser


def _describe(cls: type[ServiceSettings], exc: pydantic.ValidationError) -> str:
    """Turn a ValidationError into lines that name the field, its env var and its flag."""
    lines = [f"invalid settings for {cls.__name__}:"]
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else ""
        where = f"{name} (env {_env_var(cls, name)}, flag {_flag(name)})" if name in cls.model_fields else name
        value = f"; got {error['input']!r}" if error["type"] != "missing" and name != "auth_token" else ""
        lines.append(f"  {where}: {error['msg']}{value}")
    return "\n".join(lines)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env_var(cls: type[ServiceSettings], name: str) -> str:
    return f"{cls.model_config.get('env_prefix', '')}{name}".upper()


def _default_text(info: FieldInfo) -> str:
    return "required" if info.is_required() else repr(info.get_default(call_default_factory=True))
