"""The worker side of a trainer job: what a recipe run gets (its config, where to write) and how it reports.

A job runs in its own process (`python -m orchard.trainers.worker <job dir>`, or one per rank under torchrun);
the trainer service reads what it reports from files in the job directory, so the service can restart while a
job runs and nothing is lost:

- `job.json`      the job as the service created it (the service owns it);
- `runtime.json`  the addresses of the other services (written by the service);
- `events.jsonl`  one JSON object per line, appended by the main rank: {"kind": "started" | "progress" |
                  "checkpoint" | "succeeded" | "failed" | "cancelled", "time": ..., ...};
- checkpoints     `<output_dir>/checkpoints/step-<N>/`: Hugging Face weights (config.json, model.safetensors,
                  tokenizer), `trainer_state.pt` (optimizer, scheduler, step, RNG) and `manifest.json`, written
                  last: a folder without a manifest is a half-written checkpoint and is ignored.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from orchard.checkpoints import (  # the checkpoint layout, shared with the services that load them
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    CheckpointRecord,
    latest_checkpoint,
)
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers.distributed import Dist

EVENTS_FILE, JOB_FILE, RUNTIME_FILE = "events.jsonl", "job.json", "runtime.json"


class JobCancelled(Exception):
    """Raised inside a recipe when the service asked the job to stop (SIGTERM)."""


@dataclass(frozen=True)
class Runtime:
    """Where the other Orchard services are, as the trainer service was configured."""

    inference_address: str = "127.0.0.1:50052"
    experience_address: str = "127.0.0.1:50055"
    env_address: str = "127.0.0.1:50051"
    reward_address: str = "127.0.0.1:50053"
    nats_url: str = ""
    """Where RL jobs publish their rollouts' events (to the experience store); empty publishes nothing."""
    model_cache_dir: str = ""
    """Where the embedded GGUF model is converted to a Hugging Face folder (the inference service's default)."""


@dataclass
class JobContext:
    """Everything a recipe run needs: its job, where to write, how to report progress and checkpoints."""

    job: pb.Job
    job_dir: Path
    runtime: Runtime
    dist: Dist
    attempt: int = 0
    """How many workers ran this job before this one (0 on the first run; a resume after a crash is 1, ...)."""
    _stop: bool = field(default=False, repr=False)
    _last_progress: float = field(default=0.0, repr=False)

    @classmethod
    def load(cls, job_dir: Path, dist: Dist) -> JobContext:
        job = json_format.Parse((job_dir / JOB_FILE).read_text(), pb.Job())
        runtime_path = job_dir / RUNTIME_FILE
        runtime = Runtime(**json.loads(runtime_path.read_text())) if runtime_path.exists() else Runtime()
        events = job_dir / EVENTS_FILE
        attempt = sum('"kind": "started"' in line for line in events.read_text().splitlines()) if events.exists() else 0
        ctx = cls(job, job_dir, runtime, dist, attempt)
        signal.signal(signal.SIGTERM, ctx._on_sigterm)
        ctx.emit("started", attempt=attempt)
        return ctx

    @property
    def config(self) -> pb.JobConfig:
        return self.job.config

    @property
    def output_dir(self) -> Path:
        return Path(self.job.config.output_dir)

    @property
    def job_id(self) -> str:
        return self.job.job_id

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop = True

    def check_cancelled(self) -> None:
        """Raise JobCancelled when the service asked the job to stop; recipes call it between steps."""
        if self._stop:
            raise JobCancelled(f"job {self.job_id} was cancelled")

    # -- reporting ----------------------------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one event line (main rank only); flushed and fsynced, since the service may read it at once."""
        if not self.dist.is_main:
            return
        line = json.dumps({"kind": kind, "time": time.time(), **fields}, sort_keys=True)
        with open(self.job_dir / EVENTS_FILE, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def progress(self, step: int, total_steps: int, loss: float, *, epoch: float = 0.0, **metrics: float) -> None:
        """Report the figures at a step."""
        self.emit(
            "progress",
            step=step,
            total_steps=total_steps,
            loss=float(loss),
            epoch=float(epoch),
            metrics={k: float(v) for k, v in metrics.items()},
        )

    # -- checkpoints --------------------------------------------------------------------------------------------

    @property
    def checkpoints_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    def version(self, step: int) -> str:
        return f"{self.job_id}-step-{step}"

    def staging_dir(self, step: int) -> Path:
        """An empty folder to write checkpoint `step` into; `commit_checkpoint` moves it into place."""
        staging = self.checkpoints_dir / f".staging-step-{step}"
        if self.dist.is_main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        return staging

    def commit_checkpoint(self, step: int, staging: Path, metrics: dict[str, float], is_final: bool) -> Path:
        """Write the manifest, move the folder into place and report it (main rank only)."""
        final = self.checkpoints_dir / f"step-{step}"
        if not self.dist.is_main:
            return final
        manifest = {
            "format": MANIFEST_FORMAT,
            "job_id": self.job_id,
            "version": self.version(step),
            "step": step,
            "kind": pb.JobKind.Name(self.config.kind),
            "base_model": self.config.base_model,
            "metrics": {k: float(v) for k, v in metrics.items()},
            "is_final": is_final,
            "create_time": time.time(),
            "files": sorted(p.name for p in staging.iterdir()),
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True))
        shutil.rmtree(final, ignore_errors=True)  # a re-run after a crash may write the same step again
        staging.rename(final)
        self.emit(
            "checkpoint",
            step=step,
            path=str(final),
            version=self.version(step),
            metrics=manifest["metrics"],
            is_final=is_final,
        )
        return final

    def latest_checkpoint(self) -> CheckpointRecord | None:
        """The newest complete checkpoint of this job, to resume from; None before the first."""
        return latest_checkpoint(self.checkpoints_dir)
