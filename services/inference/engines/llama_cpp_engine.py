"""The `llama_cpp` engine: a GGUF model served by llama.cpp on CPU (through llama-cpp-python), with the continuous
batching of the shared scheduler (scheduler.py) around llama_cpp_batch.py, whose steps are one `llama_decode` batch
of every running sequence. By default the embedded SmolLM2 and any `.gguf` model are served as they are (Q4_1 weights
for the embedded one), and a Hugging Face folder (the student, a trainer checkpoint given to UpdateWeights) is
converted to an F16 GGUF in process first (gguf_export.py); `llama_weights` f16 or f32 converts every model."""

from __future__ import annotations

from pathlib import Path

from orchard.model_files import embedded_gguf
from orchard.services.inference.engines.scheduler import BatchingEngine, StepBatch


class LlamaCppEngine(BatchingEngine):
    """llama.cpp in a worker thread, with per-request sampling and continuous batching."""

    name = "llama_cpp"

    def _load_batch(self, path: Path) -> StepBatch:
        from orchard.services.inference.engines.llama_cpp_batch import LlamaBatch

        s = self._settings
        model = Path(s.model).expanduser() if s.model else embedded_gguf()
        as_is = s.llama_weights == "gguf" and model.suffix == ".gguf"
        return LlamaBatch(
            path,  # the Hugging Face folder: the tokenizer, and the weights unless the GGUF is served as it is
            model if as_is else None,
            threads=s.llama_threads,
            max_batch_size=s.max_batch_size,
            kv_tokens=s.llama_kv_tokens,
            weights_type="f16" if s.llama_weights == "gguf" else s.llama_weights,
        )

    @property
    def prefix_hits(self) -> int:
        """Prompt tokens taken from the prefix cache instead of decoded, so far."""
        return int(self._batch.prefix_hits) if self._batch is not None else 0
