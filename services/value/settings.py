"""Settings of the value service: env vars ORCHARD_VALUE_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings
from orchard.value.metrics import TIE_MARGIN


class ValueSettings(ServiceSettings):
    """Orchard value service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_VALUE_", extra="forbid")

    port: int = 50057
    """TCP port to listen on (0 picks a free one)."""
    checkpoint: Path | None = None
    """A value checkpoint (the folder a value job wrote) to serve from the start; unset starts with no model, and
    Score and Rerank answer FAILED_PRECONDITION until LoadModel loads one."""
    max_batch: int = Field(default=32, ge=1)
    """Most candidates scored in one forward; concurrent requests share forwards up to it."""
    batch_wait_ms: float = Field(default=5.0, ge=0)
    """How long a forward waits for more candidates from concurrent requests before it runs (unless it is full
    already); 0 runs at once."""
    max_candidates: int = Field(default=256, ge=1)
    """Most candidates one Score or Rerank request may hold."""
    max_queued_candidates: int = Field(default=4096, ge=1)
    """Most candidates waiting for a forward, over all requests; more get RESOURCE_EXHAUSTED."""
    max_text_chars: int = Field(default=1_000_000, ge=1)
    """Longest rendered candidate (task, compact trajectory, patch) in characters; longer ones are refused. The model
    reads only its context's worth of tokens (head and tail), so this bounds the tokenizer's work."""
    tie_margin: float = Field(default=TIE_MARGIN, ge=0, le=1)
    """Rerank's default tie margin: scores within it of the best remaining one count as a tie, which the larger patch
    cluster wins (0 breaks exact ties only). A request's tie_margin overrides it."""
    torch_threads: int = Field(default=1, ge=0)
    """torch intra-op threads; 0 = torch's default. 1 is fastest on a shared CPU (no spin-waits)."""

    @model_validator(mode="after")
    def _check_queue(self) -> ValueSettings:
        if self.max_queued_candidates < self.max_candidates:
            raise ValueError(
                f"max_queued_candidates ({self.max_queued_candidates}) must be at least max_candidates "
                f"({self.max_candidates}), or a full request could never be queued"
            )
        return self
