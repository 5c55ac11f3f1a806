"""Settings of the recording proxy: env vars ORCHARD_PROXY_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from orchard.runtime.settings import ServiceSettings
from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict


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
    """Where records go until the event bus exists: one JSON-lines file per rollout, <rollout id>.jsonl."""
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    """Longest a request may take upstream (a long generation streams for minutes)."""
    max_body_bytes: int = Field(default=32 << 20, gt=0)
    """Largest request body accepted."""

    @field_validator("upstream_url")
    @classmethod
    def _check_upstream(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1")
        return url.rstrip("/")
