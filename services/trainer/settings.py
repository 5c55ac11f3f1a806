"""Settings of the trainer service: env vars ORCHARD_TRAINER_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings


class TrainerSettings(ServiceSettings):
    """Orchard trainer service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_TRAINER_", extra="forbid")

    port: int = 50056
    """TCP port to listen on (0 picks a free one)."""
    jobs_dir: Path = Path(".state/trainer")
    """Where jobs live: one folder per job (its record, events, log, and checkpoints unless the job sets an
    output_dir). Jobs found here at start-up are listed, and the ones that were running are resumed."""
    max_running_jobs: int = Field(default=1, ge=1)
    """Most jobs running at once; more wait QUEUED (a CPU machine trains one model at a time well)."""
    max_restarts: int = Field(default=2, ge=0)
    """Times a job whose process died (killed, out of memory) is restarted from its latest checkpoint before it
    fails."""
    cancel_grace_s: float = Field(default=10.0, gt=0)
    """Seconds a cancelled job's process gets to stop at a step boundary before it is killed."""
    max_wait_s: float = Field(default=300.0, gt=0)
    """The longest WaitJob blocks; the default wait when the request sets none is the same."""
    poll_interval_s: float = Field(default=0.2, gt=0)
    """How often a running job's event file is read."""
    inference_address: str = "127.0.0.1:50052"
    """host:port of the inference service (RL rollouts, weight pushes, CA-SFT annotation)."""
    experience_address: str = "127.0.0.1:50055"
    """host:port of the experience service (datasets)."""
    env_address: str = "127.0.0.1:50051"
    """host:port of the env service (RL rollouts and grading sandboxes)."""
    reward_address: str = "127.0.0.1:50053"
    """host:port of the reward service (RPR judge, OPD teacher)."""
    nats_url: str = "nats://127.0.0.1:4222"
    """NATS (JetStream) where RL jobs publish their rollouts' events, so the experience store keeps them under
    run id = job id; empty publishes nothing."""
    model_cache_dir: Path | None = None
    """Where the embedded GGUF model is converted once to a Hugging Face folder; ~/.cache/orchard/models when
    unset (shared with the inference service)."""
