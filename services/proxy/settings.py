"""Settings of the recording proxy: env vars ORCHARD_PROXY_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings


def default_records_dir() -> Path:
    return Path.home() / ".local" / "state" / "orchard" / "proxy"


class ProxySettings(ServiceSettings):
    """Recording proxy settings (an OpenAI-compatible HTTP proxy; `port` is its HTTP port)."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_PROXY_", extra="forbid")

    port: int = 8090
    """HTTP port to listen on (0 picks a free one)."""
    upstream_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the OpenAI-compatible backend requests go on to (ours: the inference service's HTTP port)."""
    upstream_api_key: str | None = Field(default=None, repr=False)
    """API key sent upstream; unset = the part of the client's key after `rollout-<id>:`, else none."""
    rollout_header: str = "X-Orchard-Rollout-Id"
    """Request header carrying the rollout id (else the API key `rollout-<id>[:<upstream key>]` does)."""
    require_rollout_id: bool = False
    """Reject requests that carry no rollout id (400) instead of recording them under rollout "unkeyed"."""
    records_dir: Path = Field(default_factory=default_records_dir)
    """Where records go when nats_url is unset: one JSON-lines file per rollout, <rollout id>.jsonl."""
    nats_url: str | None = None
    """NATS server with JetStream; when set, records go to the event bus (stored by the experience service
    with the rollout's trajectory) instead of records_dir."""
    run_id: str = "proxy"
    """The run id records are published under on the bus (orchard.rollouts.<run_id>.call)."""
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a request may take upstream (a long generation streams for minutes)."""
    max_body_bytes: int = Field(default=32 << 20, gt=0)
    """Largest request body accepted."""

    @field_validator("run_id")
    @classmethod
    def _check_run_id(cls, run_id: str) -> str:
        if not run_id or any(c in run_id for c in ".*> \t\n"):
            raise ValueError("must be a non-empty NATS subject token: no '.', '*', '>' or whitespace")
        return run_id

    @field_validator("upstream_url")
    @classmethod
    def _check_upstream(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
        return url.rstrip("/")
