"""Shared pieces of the trainer-service tests: a tiny real causal LM with the embedded model's tokenizer (so chat
templates render as for SmolLM2, but a step takes milliseconds), datasets, and a service on a free port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from orchard.services.trainer.server import build
from orchard.services.trainer.settings import TrainerSettings
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainer.v1 import trainer_pb2_grpc


def tiny_model(folder: Path, seed: int = 0) -> Path:
    """A random-init 2-layer Llama with SmolLM2's tokenizer and chat template, saved as a Hugging Face folder."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orchard.model_files import default_cache_dir, resolve_model

    if (folder / "config.json").exists():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("", default_cache_dir())[0])
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def chat_dataset(path: Path, n: int = 8) -> Path:
    """n OpenAI-format samples: a fixed answer per question, so SFT loss must fall."""
    with path.open("w") as f:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You repair code."},
                {"role": "user", "content": f"Which file holds bug {i}?"},
                {"role": "assistant", "content": f"The bug {i} is in calc.py line {i + 3}."},
            ]
            f.write(json.dumps({"messages": messages, "instance_id": f"toy-{i}"}) + "\n")
    return path


@asynccontextmanager
async def trainer_service(jobs_dir: Path, **overrides: object) -> AsyncIterator[trainer_pb2_grpc.TrainerServiceStub]:
    overrides.setdefault("nats_url", "")  # no bus unless a test brings one
    settings = TrainerSettings(port=0, jobs_dir=jobs_dir, log_format="text", **overrides)
    server, _ = await build(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield trainer_pb2_grpc.TrainerServiceStub(channel)
    finally:
        await server.stop()


def sft_config(model: Path, dataset: Path, **hyper: Any) -> pb.JobConfig:
    return pb.JobConfig(
        kind=pb.JOB_KIND_SFT,
        base_model=str(model),
        dataset=pb.DatasetSource(path=str(dataset)),
        hyperparameters=pb.Hyperparameters(**{"learning_rate": 3e-3, "seed": 1, **hyper}),
    )
