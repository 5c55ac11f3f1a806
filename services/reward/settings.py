"""Settings of the reward service: env vars ORCHARD_REWARD_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from orchard.runtime.settings import ServiceSettings
from orchard.services.reward.rubric import BUNDLED_RUBRIC, load_rubric


class RewardSettings(ServiceSettings):
    """Orchard reward service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_REWARD_", extra="forbid")

    port: int = 50053
    """TCP port to listen on (0 picks a free one)."""
    inference_address: str = "127.0.0.1:50052"
    """host:port of the inference service that serves the judge and the teacher."""
    env_address: str = "127.0.0.1:50051"
    """host:port of the env service whose sandboxes grade outcome rewards."""
    rubric_file: Path = BUNDLED_RUBRIC
    """The judge's default rubric, a YAML file of criteria (id, name, weight, description, needs_test_evidence)
    and its test-evidence guards; the bundled seven-criterion SWE rubric by default."""
    alpha: float = Field(default=0.5, ge=0)
    """Default weight alpha of the judge score in R' = R_bin + alpha * J; 0 makes no judge call."""
    judge_model: str = ""
    """Default judge model, as the inference service names it; empty = its default model."""
    judge_temperature: float = Field(default=0.6, ge=0)
    """Default sampling temperature of the judge."""
    judge_max_tokens: int = Field(default=1024, ge=1)
    """Default most tokens the judge may write."""
    teacher_model: str = ""
    """Default OPD teacher model, as the inference service names it; empty = its default model."""
    max_concurrent_judges: int = Field(default=8, ge=1)
    """Most judge calls in flight at once (across all requests); more wait."""
    max_concurrent_scores: int = Field(default=16, ge=1)
    """Most teacher scoring calls in flight at once; more wait (the inference service batches them)."""
    max_concurrent_grades: int = Field(default=8, ge=1)
    """Most outcome gradings (sandboxes) at once; more wait."""
    max_batch_size: int = Field(default=512, ge=1)
    """Most requests one Batch* call may hold."""
    judge_timeout_s: float = Field(default=120.0, gt=0)
    """Longest one judge call may take (a shorter client deadline wins); past it the reward falls back."""
    teacher_timeout_s: float = Field(default=120.0, gt=0)
    """Longest one teacher scoring call may take (a shorter client deadline wins)."""
    grade_timeout_s: float = Field(default=900.0, gt=0)
    """Longest one grading may take, sandbox start included (a shorter client deadline wins)."""
    test_timeout_s: float = Field(default=600.0, gt=0)
    """Default time limit of the test run inside grading, when the request sets none."""

    @field_validator("rubric_file")
    @classmethod
    def _check_rubric(cls, path: Path) -> Path:
        load_rubric(path)  # a bad rubric fails at start-up, naming the file and the criterion
        return path
