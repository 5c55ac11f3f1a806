"""The value-model recipe as a trainer job (docs/training.md §2.6): graded candidates from the experience store → a
backbone with a scalar head trained on BCE + within-task pairwise ranking → held-out AUC, ECE and the best@N
curve → a versioned checkpoint the value service loads.

Choices [I]:
- The embedded default backbone is all-MiniLM-L6-v2 (mean-pooled); `base_model` may name another Hugging Face
  folder (a causal LM is pooled at its last token). A fresh head starts at zero (every score 0.5) and learns
  HEAD_LR_SCALE times faster than the pretrained backbone.
- Without `epochs` a small store is passed over until MIN_STEPS steps (each epoch a new balanced draw).
- Batches keep a task's candidates together, so the pairwise term sees the within-task pairs.
- The held-out figures are computed on tasks the model never trained on, each task's candidates in a seeded
  random order (best@N takes the first N).
- The lexical part (orchard.value.lexical) is fitted alone first, LEXICAL_STEPS steps of the same balanced
  batches (a second or two: it is linear), then trained on with the rest at LEXICAL_LR_SCALE times the
  backbone's rate: a few dozen CPU steps of the encoder alone do not learn the outcome's phrases on a small store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch

from orchard.checkpoints import STATE_FILE
from orchard.errors import FailedPrecondition
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import optim, value_data
from orchard.trainers.data import load_dataset
from orchard.trainers.job import JobContext
from orchard.trainers.value_loss import value_loss
from orchard.value import metrics as vm
from orchard.value.model import ValueModel, resolve_backbone

log = logging.getLogger("orchard.trainer.value")

HEAD_LR_SCALE = 100.0
LEXICAL_STEPS = 200
LEXICAL_LR = 1e-2
LEXICAL_LR_SCALE = LEXICAL_LR / 3e-5
"""The lexical part's rate relative to the backbone's: LEXICAL_LR at the recipe's default rate."""
DEFAULT_PAIRWISE_WEIGHT = 1.0
DEFAULT_EVAL_FRACTION = 0.1
DEFAULT_BEST_AT_N = (1, 2, 4, 8, 16)
MIN_STEPS = 40
"""Without `epochs`, a job runs the recipe's 4 epochs or as many as give this many optimiser steps: a store of
a few tasks balances down to a handful of candidates per epoch."""
REPORT_FILE = "best_of_n.json"
"""The held-out best-of-N report, written into the final checkpoint."""


def settings(cfg: pb.ValueConfig) -> tuple[float, float, tuple[int, ...], float]:
    """(pairwise weight, eval fraction, best@N sizes, the curve's tie margin) with defaults filled in."""
    return (
        cfg.pairwise_weight if cfg.HasField("pairwise_weight") else DEFAULT_PAIRWISE_WEIGHT,
        cfg.eval_fraction if cfg.HasField("eval_fraction") else DEFAULT_EVAL_FRACTION,
        tuple(sorted(set(cfg.best_at_n))) or DEFAULT_BEST_AT_N,
        cfg.tie_margin if cfg.HasField("tie_margin") else vm.TIE_MARGIN,
    )


def held_out_report(
    model: ValueModel,
    examples: Sequence[value_data.Example],
    ns: Sequence[int],
    seed: int,
    tie_margin: float = vm.TIE_MARGIN,
) -> dict[str, Any]:
    """AUC, ECE and the best@N curve of the model on held-out candidates (each task's in a seeded order), the
    curve ranked with `tie_margin`."""
    if not examples:
        return {}
    probabilities = [vm.sigmoid(x) for x in model.score([e.text for e in examples])]
    candidates = [vm.Candidate(e.task_id, p, e.resolved, e.patch) for e, p in zip(examples, probabilities, strict=True)]
    random.Random(seed).shuffle(candidates)
    return vm.best_of_n_report(candidates, ns, tie_margin=tie_margin)


def report_metrics(report: dict[str, Any]) -> dict[str, float]:
    """The report's figures as flat checkpoint metrics ("auc", "best_at_8", ...)."""
    out = {k: float(report[k]) for k in ("auc", "ece", "pass@1") if report.get(k) is not None}
    out = {k.replace("@", "_at_"): v for k, v in out.items()}
    for row in report.get("curve", []):
        for name in ("random", "best", "pass"):
            out[f"{name}_at_{row['n']}"] = float(row[name])
    return out


def training_plan(
    vd: value_data.ValueData, o: optim.Optim, *, epochs_given: bool
) -> tuple[list[list[value_data.Example]], int]:
    """Every step's batch, and the epochs they cover: without `epochs_given`, enough of them for MIN_STEPS steps."""
    epochs = o.epochs
    if not epochs_given:
        per_epoch = len(value_data.batches(value_data.epoch_sample(vd, 0, o.seed), o.global_batch_size))
        epochs = max(o.epochs, math.ceil(MIN_STEPS / max(per_epoch, 1)))
    plan = [
        b
        for epoch in range(epochs)
        for b in value_data.batches(value_data.epoch_sample(vd, epoch, o.seed), o.global_batch_size)
    ]
    return plan, epochs


def make_optimizer(model: ValueModel, o: optim.Optim) -> torch.optim.Optimizer:
    """AdamW with the head's learning rate HEAD_LR_SCALE times the backbone's and the lexical part's
    LEXICAL_LR_SCALE times ("scale" of each group; the lexical part has no weight decay: most of its buckets
    are absent from a batch)."""
    groups = [
        {"params": list(model.backbone.parameters()), "scale": 1.0},
        {"params": list(model.head.parameters()), "scale": HEAD_LR_SCALE},
    ]
    if model.lexical_parameters():
        groups.append({"params": model.lexical_parameters(), "scale": LEXICAL_LR_SCALE, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=o.learning_rate, betas=o.betas, weight_decay=o.weight_decay, foreach=False)


def fit_lexical(
    lexical: torch.nn.Module,
    vd: value_data.ValueData,
    *,
    seed: int,
    batch_size: int,
    pairwise_weight: float,
    steps: int = LEXICAL_STEPS,
) -> float:
    """The lexical part fitted alone on `steps` batches of the job's balanced epochs; its last loss."""
    plan: list[list[value_data.Example]] = []
    epoch = 0
    while len(plan) < steps:
        plan += value_data.batches(value_data.epoch_sample(vd, epoch, seed), batch_size)
        epoch += 1
    opt = torch.optim.Adam(lexical.parameters(), lr=LEXICAL_LR)
    loss = torch.zeros(())
    for batch in plan[:steps]:
        loss, _ = value_loss(
            lexical([e.text for e in batch]), [e.resolved for e in batch], [e.task_id for e in batch], pairwise_weight
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss.detach())


def train_step(
    model: ValueModel,
    opt: torch.optim.Optimizer,
    batch: Sequence[value_data.Example],
    lr: float,
    max_grad_norm: float,
    pairwise_weight: float,
) -> tuple[float, dict[str, float]]:
    """One optimiser step on `batch`: (loss, figures)."""
    for group in opt.param_groups:
        group["lr"] = lr * group["scale"]
    started = time.perf_counter()
    logits = model.logits([e.text for e in batch])
    loss, parts = value_loss(logits, [e.resolved for e in batch], [e.task_id for e in batch], pairwise_weight)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach()), {
        "learning_rate": lr,
        "grad_norm": grad_norm,
        **parts,
        "candidates_per_second": len(batch) / (time.perf_counter() - started),
    }


def _save(
    ctx: JobContext,
    model: ValueModel,
    opt: torch.optim.Optimizer | None,
    step: int,
    metrics: dict[str, float],
    is_final: bool,
    report: dict[str, Any] | None = None,
) -> None:
    staging = ctx.staging_dir(step)
    model.config.version = ctx.version(step)
    model.config.job = f"jobs/{ctx.job_id}"
    model.config.metrics = dict(metrics)
    model.save(staging)
    torch.save({"step": step, "optimizer": None if is_final or opt is None else opt.state_dict()}, staging / STATE_FILE)
    if report:
        (staging / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    ctx.commit_checkpoint(step, staging, metrics, is_final)


def run(ctx: JobContext) -> None:
    """The value job, from its latest checkpoint when there is one."""
    config = ctx.config
    pairwise_weight, eval_fraction, ns, tie_margin = settings(config.value)
    o = optim.resolve(config.hyperparameters, config.kind)
    data = asyncio.run(load_dataset(config.dataset, ctx.runtime.experience_address))
    if data.openai_samples:
        raise FailedPrecondition(
            f"the dataset holds {len(data.openai_samples)} OpenAI-format samples; the value "
            "recipe trains on graded trajectories (an experience-store filter, or a JSONL of "
            "trajectories with outcome rewards)"
        )
    vd = value_data.build(data.trajectories, eval_fraction=eval_fraction, seed=o.seed)
    log.info("value data: %s", vd.stats)
    resume = ctx.latest_checkpoint()
    backbone, name = resolve_backbone(config.base_model)
    model = ValueModel.load(
        resume.path if resume else backbone,
        base_model=name,
        max_context_tokens=config.value.max_context_tokens or o.max_seq_len,
    )
    torch.manual_seed(o.seed)
    plan, epochs = training_plan(vd, o, epochs_given=bool(config.hyperparameters.epochs))
    total = min(len(plan), o.max_steps) if o.max_steps else len(plan)
    lexical_loss = None
    if resume is None and model.lexical is not None:
        started = time.perf_counter()
        lexical_loss = fit_lexical(
            model.lexical, vd, seed=o.seed, batch_size=o.global_batch_size, pairwise_weight=pairwise_weight
        )
        log.info(
            "lexical part fitted: %d steps in %.1fs, loss %.4f",
            LEXICAL_STEPS,
            time.perf_counter() - started,
            lexical_loss,
        )
    opt = make_optimizer(model, o)
    start = 0
    if resume is not None:
        state = torch.load(resume.path / STATE_FILE, weights_only=False)
        start = int(state["step"])
        if state.get("optimizer") is not None:
            opt.load_state_dict(state["optimizer"])
        log.info("resuming %s from step %d (%s)", ctx.job_id, start, resume.path)
    model.train(True)
    loss_value, step_metrics = 0.0, dict[str, float]()
    for step in range(start, total):
        ctx.check_cancelled()
        lr = optim.lr_at(o, step, total)
        loss_value, step_metrics = train_step(model, opt, plan[step], lr, o.max_grad_norm, pairwise_weight)
        ctx.progress(step + 1, total, loss_value, epoch=(step + 1) * epochs / max(len(plan), 1), **step_metrics)
        if o.save_every_steps and (step + 1) % o.save_every_steps == 0 and step + 1 < total:
            _save(ctx, model, opt, step + 1, {"loss": loss_value}, is_final=False)
    report = held_out_report(model, vd.held_out, ns, o.seed, tie_margin)
    if report:
        report["held_out_tasks"] = sorted({e.task_id for e in vd.held_out})
        log.info("held-out best-of-N:\n%s", vm.format_best_of_n(report))
    final = {**step_metrics, **vd.stats, **report_metrics(report)}
    if lexical_loss is not None:
        final["lexical_fit_loss"] = lexical_loss
    ctx.progress(total, total, loss_value, epoch=total * epochs / max(len(plan), 1), **final)
    _save(ctx, model, None, total, {"loss": loss_value, **final}, is_final=True, report=report or None)
