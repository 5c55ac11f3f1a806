"""The served value model: loading a value checkpoint (checked first, so a bad path is a clear error), its recorded
version, job and metrics, and the atomic swap LoadModel does. Requests take the served model once, so a swap never
changes the model under a request that already started."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchard.errors import FailedPrecondition, InvalidArgument, NotFound, OrchardError
from orchard.value.model import CONFIG_FILE, HEAD_FILE, ValueModel

_log = logging.getLogger("orchard.value")

NO_MODEL = (
    "no value model is loaded; load a value checkpoint with LoadModel (checkpoint_path = the folder a value "
    "job wrote) or start the service with --checkpoint"
)


@dataclass(frozen=True)
class ServedModel:
    """A loaded value checkpoint and what it records."""

    model: ValueModel
    version: str
    checkpoint_path: str
    job: str
    """The trainer job that wrote it ("jobs/<job_id>"), or ""."""
    metrics: dict[str, float] = field(default_factory=dict)
    load_time: float = 0.0
    """When it was loaded (seconds since the epoch)."""


def check_value_checkpoint(path: Path) -> None:
    """Raise NotFound/InvalidArgument, naming the path, unless `path` is a value checkpoint folder."""
    if not path.exists():
        raise NotFound(
            f"value checkpoint {path} not found; pass the folder a value job wrote (its "
            "checkpoints/step-<N>), as a path this service can read",
            field="checkpoint_path",
        )
    missing = [name for name in ("config.json", CONFIG_FILE, HEAD_FILE) if not (path / name).is_file()]
    if missing:
        raise InvalidArgument(
            f"{path} is not a value checkpoint (no {', '.join(missing)}); pass the folder a value "
            "job wrote: a Hugging Face backbone with value_head.safetensors and value_config.json",
            field="checkpoint_path",
        )


def _manifest(path: Path) -> dict[str, Any]:
    """The trainer's manifest.json of the checkpoint (written last by a job), or {} when there is none."""
    from orchard.checkpoints import MANIFEST_FILE

    try:
        data = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def recorded_version(path: Path) -> str:
    """The version a checkpoint records: the trainer's manifest, else value_config.json, else the folder's name."""
    try:
        config_version = str(json.loads((path / CONFIG_FILE).read_text()).get("version") or "")
    except (OSError, ValueError, AttributeError):
        config_version = ""
    return str(_manifest(path).get("version") or "") or config_version or path.name


def load_checkpoint(path: Path, version: str, torch_threads: int) -> ServedModel:
    """Load the value checkpoint at `path` (blocking: run it in a thread); `version` "" takes the recorded one."""
    import torch

    if torch_threads:
        torch.set_num_threads(torch_threads)
    check_value_checkpoint(path)
    started = time.monotonic()
    try:
        model = ValueModel.load(path)
    except OrchardError:
        raise
    except Exception as err:  # noqa: BLE001 - a corrupt or foreign file: name it, keep the old model
        raise InvalidArgument(
            f"cannot load value checkpoint {path}: {type(err).__name__}: {err}", field="checkpoint_path"
        ) from None
    manifest = _manifest(path)
    job_id = str(manifest.get("job_id") or "")
    metrics = {**model.config.metrics, **manifest.get("metrics", {})}
    served = ServedModel(
        model=model,
        version=version or recorded_version(path),
        checkpoint_path=str(path),
        job=model.config.job or (f"jobs/{job_id}" if job_id else ""),
        metrics={k: float(v) for k, v in metrics.items()},
        load_time=time.time(),
    )
    _log.info(
        "loaded value model %s from %s in %.1fs",
        served.version,
        path,
        time.monotonic() - started,
        extra={"version": served.version, "checkpoint_path": str(path), "job": served.job},
    )
    return served


class ValueModels:
    """The served model and its swap: one load at a time, and a new model serves new requests only once loaded."""

    def __init__(self, torch_threads: int) -> None:
        self._torch_threads = torch_threads
        self._served: ServedModel | None = None
        self._lock = asyncio.Lock()

    @property
    def served(self) -> ServedModel:
        """The model serving now; FailedPrecondition, saying how to load one, when there is none."""
        if self._served is None:
            raise FailedPrecondition(NO_MODEL)
        return self._served

    async def load(self, checkpoint_path: str, version: str = "") -> tuple[ServedModel, str]:
        """Serve the checkpoint at `checkpoint_path`; returns (the model now served, the version served before).
        Loading the version already served is a no-op. On failure the old model keeps serving."""
        if not checkpoint_path:
            raise InvalidArgument(
                "checkpoint_path is empty; give the folder a value job wrote", field="checkpoint_path"
            )
        path = Path(checkpoint_path).expanduser().absolute()
        async with self._lock:
            await asyncio.to_thread(check_value_checkpoint, path)
            version = version or await asyncio.to_thread(recorded_version, path)
            previous = self._served
            if previous is not None and previous.version == version:
                return previous, previous.version  # a retry, or the version already served
            # Requests keep taking the old model while the new one loads (in its own thread, off the scoring one).
            served = await asyncio.to_thread(load_checkpoint, path, version, self._torch_threads)
            self._served = served
            if previous is not None:
                _log.info(
                    "now serving value model %s (was %s)",
                    served.version,
                    previous.version,
                    extra={"version": served.version, "previous_version": previous.version},
                )
            return served, previous.version if previous is not None else ""
