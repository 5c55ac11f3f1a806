"""Settings of the experience service: env vars ORCHARD_EXPERIENCE_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings


def default_store_url() -> str:
    return f"sqlite:///{Path.home() / '.local' / 'state' / 'orchard' / 'experience' / 'experience.db'}"


class ExperienceSettings(ServiceSettings):
    """Orchard experience service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_EXPERIENCE_", extra="forbid")

    port: int = 50055
    """TCP port to listen on (0 picks a free one)."""
    nats_url: str = "nats://127.0.0.1:4222"
    """NATS server with JetStream whose ORCHARD_ROLLOUTS stream the service consumes."""
    store_url: str = Field(default_factory=default_store_url)
    """Where trajectories are stored: sqlite:///<path> (embedded default) or postgresql://user@host:port/db."""
    consumer_name: str = "orchard-experience"
    """Name of the durable JetStream pull consumer; replicas with the same name share the work."""
    batch_size: int = Field(default=1000, ge=1, le=10_000)
    """Most events fetched and written in one transaction."""
    ack_wait_s: float = Field(default=30.0, gt=0)
    """How long JetStream waits for an ack before redelivering (after a crash, unacked events come back then)."""
    eval_task_files: list[Path] = Field(default_factory=list)
    """Evaluation sets for decontamination: text files of task ids, one per line ('#' starts a comment).
    Training exports leave their tasks out. Env var: a JSON list of paths."""

    @field_validator("store_url")
    @classmethod
    def _check_store_url(cls, url: str) -> str:
        if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("must be sqlite:///<path> or postgresql://user@host:port/db")
        return url

    @field_validator("eval_task_files")
    @classmethod
    def _check_eval_files(cls, files: list[Path]) -> list[Path]:
        for path in files:
            if not path.is_file():
                raise ValueError(f"evaluation task file {path} does not exist")
        return files

    def eval_task_ids(self) -> dict[str, str]:
        """task id -> the evaluation file naming it."""
        tasks: dict[str, str] = {}
        for path in self.eval_task_files:
            for line in path.read_text(encoding="utf-8").splitlines():
                task_id = line.split("#", 1)[0].strip()
                if task_id:
                    tasks.setdefault(task_id, path.name)
        return tasks
