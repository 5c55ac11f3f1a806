"""The SFT and credit-assignment SFT recipes as trainer jobs (docs/training.md §2.1, §2.2): data → samples → AdamW steps
on the exact token mean of each global batch → checkpoints the inference service can load.

Choices [I]:
- A global batch is `global_batch_size` samples; it is split into micro-batches of `micro_batch_size` samples,
  each packed into rows (block-diagonal attention), and every micro-batch loss is its summed token loss divided
  by the trained-token count of the *whole* global batch (over every rank), so micro-batching and the number of
  processes do not change the loss or the gradient.
- The data order is a shuffle seeded by (seed, epoch), so a resumed job sees the batches it would have seen.
- CA-SFT annotates unresolved trajectories once, before the first step, through the inference service
  (`annotator_model`, else the trajectory's own policy model); a failed annotation leaves that trajectory
  out and is counted in the progress metrics ("annotation_failures"), it does not fail the job.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from typing import Any

import torch

from orchard import clients
from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import ca_sft, distributed, optim
from orchard.trainers.data import Dataset, TemplateRenderer, load_dataset, openai_sample, resolved, trajectory_sample
from orchard.trainers.job import JobContext
from orchard.trainers.sft import Sample, masked_token_logprobs, pack, truncate_left

log = logging.getLogger("orchard.trainer.sft")


def sft_config(config: pb.JobConfig) -> pb.SftConfig:
    if config.kind == pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT:
        return config.credit_assignment_sft.sft
    return config.sft


def make_samples(
    renderer: TemplateRenderer,
    data: Dataset,
    cfg: pb.SftConfig,
    max_seq_len: int,
    trained: dict[str, set[int] | None] | None = None,
) -> tuple[list[Sample], int]:
    """Samples of every record (per trajectory or per turn), fitted to max_seq_len; also how many were dropped.

    `trained` maps a trajectory id to the steps CA-SFT trains (None: every step); trajectories absent from it are
    left out. Without it every trajectory trains every step."""
    samples: list[Sample] = []
    for traj in data.trajectories:
        if trained is not None and traj.trajectory_id not in trained:
            continue
        steps = trained[traj.trajectory_id] if trained is not None else None
        if cfg.sample_mode == pb.SFT_SAMPLE_MODE_PER_TURN:
            for turn in steps if steps is not None else range(len(traj.steps)):
                samples.append(_cut(trajectory_sample(renderer, traj, {turn})))
        else:
            samples.append(_cut(trajectory_sample(renderer, traj, steps)))
    samples += [openai_sample(renderer, record) for record in data.openai_samples]
    kept, dropped = [], 0
    for s in samples:
        if not any(s.loss_mask):
            dropped += 1
        elif len(s.token_ids) <= max_seq_len:
            kept.append(s)
        elif cfg.overflow_policy == pb.OVERFLOW_POLICY_DROP:
            dropped += 1
        else:
            kept.append(truncate_left(s, max_seq_len))
    return kept, dropped


def _cut(sample: Sample) -> Sample:
    """The sample up to its last trained token (the observations after it are never trained on: no compute)."""
    if not any(sample.loss_mask):
        return sample
    end = max(i for i, m in enumerate(sample.loss_mask) if m) + 1
    return Sample(sample.token_ids[:end], sample.loss_mask[:end])


async def ca_trained_steps(ctx: JobContext, data: Dataset) -> tuple[dict[str, set[int] | None], dict[str, float]]:
    """CA-SFT's trained steps per trajectory: all for resolved ones, the rise-segment actions for the others."""
    cfg = ctx.config.credit_assignment_sft
    epsilon = cfg.epsilon if cfg.HasField("epsilon") else ca_sft.EPSILON
    trained: dict[str, set[int] | None] = {}
    failures = segments_total = 0
    async with clients.connect("inference", ctx.runtime.inference_address) as inference:
        for traj in data.trajectories:
            if resolved(traj):
                trained[traj.trajectory_id] = None
                continue
            if not traj.steps:
                continue
            annotator = ca_sft.InferenceAnnotator(inference, cfg.annotator_model or traj.policy.model)
            try:
                values = await ca_sft.annotate_values(traj, False, annotator)
            except (ValueError, OrchardError) as err:
                failures += 1
                log.warning("annotation of %s failed, left out: %s", traj.trajectory_id, err)
                continue
            segments = ca_sft.extract_rise_segments(values, epsilon, cfg.merge_gap)
            segments_total += len(segments)
            steps = set(ca_sft.trained_steps(segments))
            if steps:
                trained[traj.trajectory_id] = steps
    return trained, {"annotation_failures": float(failures), "rise_segments": float(segments_total)}


def micro_batches(batch: list[Sample], size: int, ranks: int) -> list[list[Sample]]:
    """The global batch in micro-batches of at most `size` samples, as many as a multiple of `ranks` (every rank
    runs the same number of passes), sizes as equal as possible; none empty while len(batch) >= that count."""
    count = ranks * math.ceil(len(batch) / (ranks * size))
    return [batch[i::count] for i in range(count) if batch[i::count]]


def micro_loss(model: Any, batch: list[Sample], pad_id: int, denominator: float) -> tuple[torch.Tensor, int]:
    """The summed token loss of a packed micro-batch divided by `denominator`, and its token count."""
    packed = pack(batch, max(len(s.token_ids) for s in batch), pad_id)
    logp = masked_token_logprobs(
        model,
        packed.input_ids,
        packed.loss_mask,
        position_ids=packed.position_ids,
        attention_mask=packed.attention_mask(),
    )
    return -(logp * packed.loss_mask).sum() / denominator, int((packed.seq_ids >= 0).sum())


def run(ctx: JobContext) -> None:
    """The SFT or CA-SFT job, from its latest checkpoint when there is one."""
    config = ctx.config
    o = optim.resolve(config.hyperparameters, config.kind)
    data = asyncio.run(load_dataset(config.dataset, ctx.runtime.experience_address))
    resume = ctx.latest_checkpoint()
    model_path = resume.path if resume else optim.base_model_path(ctx)
    model, tokenizer = optim.load_model(model_path)
    renderer = TemplateRenderer(tokenizer)
    cfg = sft_config(config)
    extra_metrics: dict[str, float] = {}
    trained = None
    if config.kind == pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT:
        trained, extra_metrics = asyncio.run(ca_trained_steps(ctx, data))
    samples, dropped = make_samples(renderer, data, cfg, o.max_seq_len, trained)
    if not samples:
        raise FailedPrecondition(
            f"none of the {len(data)} records gives a trainable sample ({dropped} dropped: no "
            "assistant token to train, or longer than max_seq_len with overflow DROP)"
        )
    if o.global_batch_size % ctx.dist.world_size:
        raise InvalidArgument(
            f"global_batch_size {o.global_batch_size} must be a multiple of the {ctx.dist.world_size} processes",
            field="config.hyperparameters.global_batch_size",
        )
    # A dataset smaller than the batch gives smaller batches (never a sample twice in one step).
    global_batch = max(
        ctx.dist.world_size, min(o.global_batch_size, len(samples)) // ctx.dist.world_size * ctx.dist.world_size
    )
    steps_per_epoch = math.ceil(len(samples) / global_batch)
    total = steps_per_epoch * o.epochs
    if o.max_steps:
        total = min(total, o.max_steps)
    torch.manual_seed(o.seed)
    distributed.shard(model, ctx.dist)
    opt = optim.optimizer(model, o)
    start = 0
    if resume is not None:
        state = optim.resume_state(resume.path)
        start = int(state["step"])
        if state["optimizer"] is not None and ctx.dist.world_size == 1:
            opt.load_state_dict(state["optimizer"])
        log.info("resuming %s from step %d (%s)", ctx.job_id, start, resume.path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    metrics: dict[str, float] = {}
    loss_value = 0.0
    for step in range(start, total):
        ctx.check_cancelled()
        epoch, index = divmod(step, steps_per_epoch)
        order = list(range(len(samples)))
        random.Random(o.seed * 1000 + epoch).shuffle(order)
        # Always a full global batch: the epoch's last one wraps around to its first samples.
        batch = [samples[order[(index * global_batch + k) % len(order)]] for k in range(global_batch)]
        local = distributed.rank_slice(micro_batches(batch, o.micro_batch_size, ctx.dist.world_size), ctx.dist)
        trained_tokens = sum(sum(s.loss_mask[1:]) for s in batch)  # every rank sees the whole global batch
        lr = optim.lr_at(o, step, total)
        for group in opt.param_groups:
            group["lr"] = lr
        started = time.perf_counter()
        loss_sum, tokens = 0.0, 0
        for mb in local:
            loss, n = micro_loss(model, mb, pad_id, max(trained_tokens, 1))
            loss.backward()  # summed over ranks by `shard`: each rank's loss is already over the global count
            loss_sum += float(loss.detach())
            tokens += n
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), o.max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_value = distributed.global_sum(loss_sum, ctx.dist)
        seconds = time.perf_counter() - started
        all_tokens = distributed.global_sum(tokens, ctx.dist)
        metrics = {
            "learning_rate": lr,
            "grad_norm": grad_norm,
            "tokens_per_second": all_tokens / seconds,
            "trained_tokens": float(trained_tokens),
            "samples": float(len(samples)),
            "samples_dropped": float(dropped),
            **extra_metrics,
        }
        ctx.progress(step + 1, total, loss_value, epoch=(step + 1) / steps_per_epoch, **metrics)
        if o.save_every_steps and (step + 1) % o.save_every_steps == 0 and step + 1 < total:
            optim.save(ctx, model, tokenizer, opt, step + 1, {"loss": loss_value}, is_final=False)
    optim.save(ctx, model, tokenizer, opt, total, {"loss": loss_value, **metrics}, is_final=True)
