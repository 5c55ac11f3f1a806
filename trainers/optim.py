"""The optimisation pieces every recipe job shares: hyperparameter defaults, AdamW and the LR schedule, model
loading, and checkpoints (Hugging Face weights + optimizer state) that a job resumes from."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchard.checkpoints import STATE_FILE
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import distributed
from orchard.trainers.job import JobContext


@dataclass(frozen=True)
class Optim:
    """Resolved hyperparameters: the proto's zero fields replaced by the recipe's defaults."""

    learning_rate: float
    min_learning_rate: float
    schedule: int
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, float]
    max_grad_norm: float
    epochs: int
    max_steps: int
    global_batch_size: int
    micro_batch_size: int
    max_seq_len: int
    seed: int
    save_every_steps: int


RECIPE_DEFAULTS: dict[int, dict[str, Any]] = {
    # (learning rate, weight decay, beta2, schedule); docs/training.md §2.1, §2.3, §2.4.
    pb.JOB_KIND_SFT: {"lr": 1e-5, "wd": 0.0, "beta2": 0.999, "schedule": pb.LR_SCHEDULE_COSINE},
    pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT: {"lr": 1e-5, "wd": 0.0, "beta2": 0.999, "schedule": pb.LR_SCHEDULE_COSINE},
    pb.JOB_KIND_RL: {"lr": 1e-6, "wd": 0.1, "beta2": 0.98, "schedule": pb.LR_SCHEDULE_COSINE},
    # The value model [I]: fine-tuning a small encoder (the head learns faster, see value_job), a few epochs over
    # a small balanced set, 16 candidates a step, its 512-token context.
    pb.JOB_KIND_VALUE: {
        "lr": 3e-5,
        "wd": 0.01,
        "beta2": 0.999,
        "schedule": pb.LR_SCHEDULE_LINEAR,
        "epochs": 4,
        "batch": 16,
        "max_seq_len": 512,
    },
}
DEFAULT_GLOBAL_BATCH = 8
"""Samples per optimiser step when unset [I]: the paper's 128 is a GPU-cluster figure; 8 fits one CPU."""
DEFAULT_MICRO_BATCH = 1
"""Samples per forward/backward when unset: the float32 logits of a 49k vocabulary cost ~200 KB per token (and
as much again for their log-softmax), so one sample per pass keeps a 2k-token SmolLM2 step near 2 GB."""
DEFAULT_MAX_SEQ_LEN = 2048


def resolve(h: pb.Hyperparameters, kind: int, *, opd_only: bool = False) -> Optim:
    """The job's hyperparameters with defaults filled in; pure OPD defaults to a constant LR (docs/training.md §2.4).
    Their ranges were checked when the job was created (services/trainer/servicer.py `validate`)."""
    d = RECIPE_DEFAULTS[kind]
    lr = h.learning_rate or d["lr"]
    return Optim(
        learning_rate=lr,
        min_learning_rate=h.min_learning_rate if h.HasField("min_learning_rate") else lr / 10,
        schedule=h.lr_schedule or (pb.LR_SCHEDULE_CONSTANT if opd_only else d["schedule"]),
        warmup_ratio=h.warmup_ratio,
        weight_decay=h.weight_decay if h.HasField("weight_decay") else d["wd"],
        betas=(h.adam_beta1 or 0.9, h.adam_beta2 or d["beta2"]),
        max_grad_norm=h.max_grad_norm or 1.0,
        epochs=h.epochs or d.get("epochs", 1),
        max_steps=h.max_steps,
        global_batch_size=h.global_batch_size or d.get("batch", DEFAULT_GLOBAL_BATCH),
        micro_batch_size=h.micro_batch_size or DEFAULT_MICRO_BATCH,
        max_seq_len=h.max_seq_len or d.get("max_seq_len", DEFAULT_MAX_SEQ_LEN),
        seed=h.seed if h.HasField("seed") else random.randrange(2**31),
        save_every_steps=h.save_every_steps,
    )


def lr_at(o: Optim, step: int, total: int) -> float:
    """The learning rate of optimiser step `step` (0-based) of `total`."""
    warmup = int(o.warmup_ratio * total)
    if step < warmup:
        return o.learning_rate * (step + 1) / warmup
    if o.schedule == pb.LR_SCHEDULE_CONSTANT or total - warmup <= 1:
        return o.learning_rate
    frac = (step - warmup) / (total - warmup - 1)
    if o.schedule == pb.LR_SCHEDULE_LINEAR:
        return o.learning_rate + (o.min_learning_rate - o.learning_rate) * frac
    return o.min_learning_rate + 0.5 * (o.learning_rate - o.min_learning_rate) * (1 + math.cos(math.pi * frac))


def load_model(path: Path) -> tuple[Any, Any]:
    """Model (float32, train mode) and tokenizer from a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    return model, tokenizer


def base_model_path(ctx: JobContext) -> Path:
    """The base model as a loadable folder: "" is the embedded SmolLM2 (converted once into the cache)."""
    from orchard.model_files import default_cache_dir, resolve_model

    cache = Path(ctx.runtime.model_cache_dir) if ctx.runtime.model_cache_dir else default_cache_dir()
    return resolve_model(ctx.config.base_model, cache)[0]


def optimizer(model: Any, o: Optim) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=o.learning_rate, betas=o.betas, weight_decay=o.weight_decay, foreach=False
    )


def save(
    ctx: JobContext,
    model: Any,
    tokenizer: Any,
    opt: torch.optim.Optimizer,
    step: int,
    metrics: dict[str, float],
    is_final: bool,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A complete checkpoint: weights (every rank takes part in the gather), then the optimizer state and the
    manifest from the main rank."""
    staging = ctx.staging_dir(step)
    distributed.barrier(ctx.dist)
    distributed.save_pretrained(model, tokenizer, staging, ctx.dist)
    if ctx.dist.world_size == 1 and not is_final:  # a final checkpoint is never resumed: no Adam moments (2x weights)
        torch.save({"step": step, "optimizer": opt.state_dict(), "extra": extra or {}}, staging / STATE_FILE)
    elif ctx.dist.is_main:  # sharded state is not gathered (a resumed multi-process job restarts Adam); final: none
        torch.save({"step": step, "optimizer": None, "extra": extra or {}}, staging / STATE_FILE)
    path = ctx.commit_checkpoint(step, staging, metrics, is_final)
    distributed.barrier(ctx.dist)
    return path


def resume_state(path: Path) -> dict[str, Any]:
    return torch.load(path / STATE_FILE, weights_only=False)
