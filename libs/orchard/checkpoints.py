"""The layout of a trainer checkpoint on disk, shared by the trainer recipes that write them and the services
that load them: `<checkpoints>/step-<N>/` holding Hugging Face weights, `trainer_state.pt` and `manifest.json`,
written last (a folder without a manifest is a half-written checkpoint and is ignored)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST_FILE, STATE_FILE = "manifest.json", "trainer_state.pt"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class CheckpointRecord:
    """A complete checkpoint on disk (its manifest was written)."""

    step: int
    path: Path
    version: str
    metrics: dict[str, float]
    is_final: bool


def read_manifest(path: Path) -> CheckpointRecord | None:
    try:
        data = json.loads((path / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None
    return CheckpointRecord(
        step=int(data["step"]),
        path=path,
        version=str(data["version"]),
        metrics={k: float(v) for k, v in data.get("metrics", {}).items()},
        is_final=bool(data.get("is_final", False)),
    )


def latest_checkpoint(checkpoints_dir: Path) -> CheckpointRecord | None:
    """The complete checkpoint with the highest step under `checkpoints_dir`."""
    if not checkpoints_dir.is_dir():
        return None
    found = [r for p in checkpoints_dir.glob("step-*") if (r := read_manifest(p)) is not None]
    return max(found, key=lambda r: r.step, default=None)
