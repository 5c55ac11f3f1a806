"""The `transformers` engine: one Hugging Face causal LM on CPU (or one torch device), served with continuous
batching by the shared scheduler (scheduler.py). Its worker thread runs `Batch.step` (batch.py): one decode step
for every running sequence (a shared, left-padded KV cache), then one prefill forward of the prompts admitted in
that step (left-padded together; logits equal `score`'s to float rounding), whose cache rows, repeated n times for
n samples, join the batch."""

from __future__ import annotations

from pathlib import Path

from orchard.services.inference.engines.scheduler import BatchingEngine, EngineStats, StepBatch

__all__ = ["EngineStats", "TransformersEngine"]


class TransformersEngine(BatchingEngine):
    """A Hugging Face causal LM in a worker thread, with per-request sampling and continuous batching."""

    name = "transformers"

    def _load_batch(self, path: Path) -> StepBatch:
        import torch

        from orchard.services.inference.engines.batch import Batch

        if self._settings.torch_threads:
            torch.set_num_threads(self._settings.torch_threads)
        return Batch.load(path, self._settings.device)
