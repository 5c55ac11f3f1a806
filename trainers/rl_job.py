"""The RL recipe as a trainer job (docs/training.md §2.3–2.5): each rollout step samples groups of agent-loop rollouts of
task instances from the inference service's policy, rewards them (outcome, optionally mixed with the RPR judge),
filters the groups, takes one clipped policy-gradient step (plus the OPD term) on the trainer's own copy of the
policy, saves it and loads it into the inference service, so the next step samples on-policy.

    rollouts (harness, BAR or fixed N) -> rewards (outcome ± judge) -> group filter -> GRPO advantages
      -> loss on the sampled token ids (ratio to the behaviour log-probs) -> checkpoint -> UpdateWeights

Choices [I]:
- The trainer's model starts from base_model, which must be the weights the inference service serves; each step
  reports how far the trainer's log-probs of the sampled tokens are from the behaviour ones
  ("logprob_diff_mean"/"_max": ~0 on-policy). A resumed job pushes its checkpoint before its first rollout.
- Prompts: `prompts_per_step + oversample_prompts` distinct instances per step, taken in order from a shuffle of
  the task pool seeded by (seed, pass), so a resumed job sees the prompts it would have seen. The first
  `prompts_per_step` groups that pass the filter are trained on. max_steps 0 is one pass over the pool.
- Rewards: resolved / unresolved / truncated per `outcome_reward` (+1 / -1 / -1); with a judge (alpha > 0),
  R' = R_bin + alpha·J (rpr.mix; R' = R_bin where the judge fell back or failed). BAR balances resolved against
  unresolved rollouts (the outcome's ±1); the filter and the advantages see R'. A rollout without a reward (its
  grading failed, or a model or environment error aborted it) gets advantage 0 and no loss, and makes its group
  count as aborted for the DEFAULT filter.
- The loss is computed on the stored sampled token ids, in micro-batches weighted so the step's loss is the token
  (or sequence) mean over the whole batch; only positions that predict a sampled token go through the output
  layer. The OPD term is its own token mean over the tokens the teacher scored.
- Each step reports what it learned from: "advantage_abs_mean"/"advantage_std" of the members trained on (0 when
  every kept group was uniform), and "kl", KL(before ‖ after) of the update on the step's sampled tokens (k3
  estimator, one extra forward pass).
- max_staleness 1 starts the rollouts of step k+1 as soon as those of step k are in, so they run while step k
  trains; the inference service swaps in step k's update between two generations (a rollout's turns can then
  span two versions; each token keeps its own behaviour log-prob). "stale_turn_fraction" reports the share of
  model calls sampled with older weights than the ones being trained.
- Run id = job id. Each worker attempt owns its own range of sample indices per task instance (so a resumed
  worker never reuses a trajectory id of the one it replaced); rollout events go to NATS when the trainer service
  has a bus address (ctx.runtime.nats_url, for the experience store), else nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchard import clients
from orchard.errors import FailedPrecondition, InvalidArgument, OrchardError, Unimplemented
from orchard.events import EventPublisher
from orchard.harness import AgentLoop, EventSink, InferenceModel, Limits, NullSink, SamplingConfig, SWEHarness
from orchard.harness.assistant import AssistantHarness
from orchard.inference.v1 import inference_pb2 as ipb
from orchard.reward.v1 import reward_pb2 as rpb
from orchard.sdk import AsyncSandboxClient
from orchard.sdk.transport import Transport
from orchard.tasks import TaskInstance, load_instances
from orchard.tasks.grading import patched_files
from orchard.tasks.instance import BUNDLED
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainers import bar, opd, optim, rl, rpr, sft
from orchard.trainers.bar import BarConfig, GroupFilter  # for fields: the `bar` field shadows the module
from orchard.trainers.bar_source import HarnessRolloutSource
from orchard.trainers.job import CheckpointRecord, JobContext
from orchard.types.v1 import types_pb2 as tpb

log = logging.getLogger("orchard.trainer.rl")

DEFAULT_GROUP_SIZE = 4
"""N when rl.group_size is 0: the v2 SWE script's (the paper's 8 is a GPU-cluster figure)."""
DEFAULT_TEMPERATURE = DEFAULT_TOP_P = 0.95
DEFAULT_STEP_TOKENS = 4096
DEFAULT_CONCURRENCY = 4
NO_CAP = 10**9
PUSH_TIMEOUT_S, REWARD_TIMEOUT_S = 600.0, 1800.0
REWARD_BATCH = 256
"""Requests per reward-service batch call (the service refuses more than its max_batch_size, 512 by default)."""
DIFF_WARNING = 0.05
"""A mean |trainer - behaviour| log-prob gap on-policy above which the weights are not the served ones."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_UPDATES_PER_STEP = 64
GROUP_FILTERS = {
    pb.GROUP_FILTER_UNSPECIFIED: bar.GroupFilter.DEFAULT,
    pb.GROUP_FILTER_DEFAULT: bar.GroupFilter.DEFAULT,
    pb.GROUP_FILTER_NONZERO_STD: bar.GroupFilter.NONZERO_STD,
    pb.GROUP_FILTER_NO_ABORTED: bar.GroupFilter.NO_ABORTED,
    pb.GROUP_FILTER_NONE: bar.GroupFilter.NONE,
}
AGGREGATIONS = {
    pb.LOSS_AGGREGATION_UNSPECIFIED: rl.Aggregation.TOKEN_MEAN,
    pb.LOSS_AGGREGATION_TOKEN_MEAN: rl.Aggregation.TOKEN_MEAN,
    pb.LOSS_AGGREGATION_SEQUENCE_MEAN: rl.Aggregation.SEQUENCE_MEAN,
}
OPD_LOSSES = {
    pb.OPD_LOSS_TYPE_UNSPECIFIED: opd.OpdLoss.JS_SKEW,
    pb.OPD_LOSS_TYPE_K1: opd.OpdLoss.K1,
    pb.OPD_LOSS_TYPE_K2: opd.OpdLoss.K2,
    pb.OPD_LOSS_TYPE_K3: opd.OpdLoss.K3,
    pb.OPD_LOSS_TYPE_JS_SKEW: opd.OpdLoss.JS_SKEW,
}
ASSISTANT = AssistantHarness.name
"""The assistant harness (the Claw recipe): its tasks are assistant tasks ("claw" = the bundled set)."""
HARNESSES = ("", SWEHarness.name, ASSISTANT)


def task_pool(path: str, harness: str) -> list[Any]:
    """The tasks at `path`: SWE instances, or assistant tasks for the assistant harness."""
    if harness == ASSISTANT:
        from orchard.tasks.assistant import load_tasks

        return list(load_tasks(None if path in ("", "claw") else path))
    return list(load_instances(path))


def chosen(pool: list[Any], ids: list[str]) -> list[Any]:
    """The tasks of `pool` named by `ids` (all when empty), in the pool's order; InvalidArgument names unknown ids."""
    if not ids:
        return pool
    known = {_task_id(t) for t in pool}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise InvalidArgument(
            f"{len(unknown)} task id(s) are not in the task file: {unknown[:5]}", field="config.dataset.task_ids"
        )
    wanted = set(ids)
    return [t for t in pool if _task_id(t) in wanted]


def _task_id(task: Any) -> str:
    return str(getattr(task, "instance_id", None) or task.task_id)


def harness_factory(harness: str, client: Any, task_set: str) -> Callable[[Any], Any]:
    """A new harness per rollout: the SWE harness, or the assistant harness."""
    if harness == ASSISTANT:
        return lambda t: AssistantHarness(t, client, task_set=task_set)
    return lambda t: SWEHarness(t, client, task_set=task_set)


@dataclass(frozen=True)
class Settings:
    """The RL config with its defaults filled in and checked."""

    group_size: int
    bar: BarConfig | None
    prompts_per_step: int
    oversample_prompts: int
    group_filter: GroupFilter
    clip_low: float
    clip_high: float
    aggregation: rl.Aggregation
    sampling: SamplingConfig
    limits: Limits
    concurrency: int
    outcome: tuple[float, float, float]
    """(resolved, unresolved, truncated) rewards."""
    alpha: float
    """The judge weight; 0 is no judge."""
    opd_coef: float
    """The OPD term's weight; 0 is no teacher."""
    opd_loss: opd.OpdLoss
    opd_lambda: float
    opd_only: bool
    max_staleness: int
    updates_per_step: int
    """Optimiser steps over the same rollouts per rollout step (PPO's epochs)."""
    negative_scale: float
    """Multiplies negative advantages (1: GRPO; 0: the better rollouts of each group only)."""


def settings(config: pb.JobConfig, o: optim.Optim) -> Settings:
    """The job's RL settings; InvalidArgument or Unimplemented names the field at fault."""
    r = config.rl
    if r.algorithm not in (pb.RL_ALGORITHM_UNSPECIFIED, pb.RL_ALGORITHM_GRPO):
        raise Unimplemented(
            f"rl.algorithm {pb.RlAlgorithm.Name(r.algorithm)} is not available; use RL_ALGORITHM_GRPO",
            field="config.rl.algorithm",
        )
    if r.kl_coef or r.entropy_coef:
        raise Unimplemented(
            "rl.kl_coef and rl.entropy_coef are not available (no recipe uses a KL term); set 0", field="config.rl"
        )
    if r.harness not in HARNESSES:
        raise InvalidArgument(
            f"rl.harness {r.harness!r} cannot record token-level rollouts; use {SWEHarness.name!r}"
            f" (or leave it empty) or {ASSISTANT!r}",
            field="config.rl.harness",
        )
    if r.sampling.top_k or r.sampling.stop:
        raise InvalidArgument(
            "rl.sampling.top_k and stop are not supported by the harness; set temperature, top_p and max_tokens",
            field="config.rl.sampling",
        )
    for name in (
        "group_size",
        "prompts_per_step",
        "oversample_prompts",
        "max_turns",
        "max_trajectory_tokens",
        "max_concurrent_rollouts",
    ):
        if getattr(r, name) < 0:
            raise InvalidArgument(f"rl.{name} is {getattr(r, name)}; it must be >= 0", field=f"config.rl.{name}")
    if not 0 <= r.updates_per_step <= MAX_UPDATES_PER_STEP:
        raise InvalidArgument(
            f"rl.updates_per_step is {r.updates_per_step}; it must be 0 (one) to {MAX_UPDATES_PER_STEP}",
            field="config.rl.updates_per_step",
        )
    negative_scale = r.negative_advantage_scale if r.HasField("negative_advantage_scale") else 1.0
    if not 0 <= negative_scale <= 1:
        raise InvalidArgument(
            f"rl.negative_advantage_scale is {negative_scale}; it must be in [0, 1]",
            field="config.rl.negative_advantage_scale",
        )
    if r.max_staleness not in (0, 1):
        raise InvalidArgument(
            f"rl.max_staleness is {r.max_staleness}; it must be 0 (on-policy) or 1", field="config.rl.max_staleness"
        )
    n = r.group_size or DEFAULT_GROUP_SIZE
    bar_config = None
    if r.HasField("bar"):
        if not r.bar.max_group_size or not r.bar.rho_max:
            raise InvalidArgument("rl.bar needs max_group_size (> group_size) and rho_max", field="config.rl.bar")
        try:
            bar_config = bar.BarConfig(
                n=n,
                n_max=r.bar.max_group_size,
                stride=r.bar.stride or r.bar.max_group_size,
                rho_min=r.bar.rho_min,
                rho_max=r.bar.rho_max,
            )
        except ValueError as err:
            raise InvalidArgument(f"rl.bar: {err}", field="config.rl.bar") from None
    s = r.sampling
    alpha = 0.0
    if r.HasField("judge"):
        alpha = r.judge.alpha if r.judge.HasField("alpha") else rpr.ALPHA
        if not 0 <= alpha < 2:
            raise InvalidArgument(f"rl.judge.alpha is {alpha}; it must be in [0, 2)", field="config.rl.judge.alpha")
        if alpha and r.harness == ASSISTANT:
            raise Unimplemented(
                "the RPR judge grades SWE rollouts against a gold patch; assistant rollouts are "
                "scored by their tasks' checks: leave rl.judge unset",
                field="config.rl.judge",
            )
    out, d = r.outcome_reward, r.opd
    return Settings(
        group_size=n,
        bar=bar_config,
        prompts_per_step=r.prompts_per_step or max(1, o.global_batch_size // n),
        oversample_prompts=r.oversample_prompts,
        group_filter=GROUP_FILTERS[r.group_filter],
        clip_low=r.clip_eps_low if r.HasField("clip_eps_low") else rl.CLIP_LOW,
        clip_high=r.clip_eps_high if r.HasField("clip_eps_high") else rl.CLIP_HIGH,
        aggregation=AGGREGATIONS[r.loss_aggregation],
        sampling=SamplingConfig(
            temperature=s.temperature if s.HasField("temperature") else DEFAULT_TEMPERATURE,
            top_p=s.top_p if s.HasField("top_p") else DEFAULT_TOP_P,
            max_step_tokens=s.max_tokens or DEFAULT_STEP_TOKENS,
            seed=s.seed if s.HasField("seed") else o.seed,
        ),
        limits=Limits(
            max_steps=r.max_turns or NO_CAP,
            max_tokens=r.max_trajectory_tokens or o.max_seq_len,
            wall_clock_s=r.rollout_timeout.ToTimedelta().total_seconds() or NO_CAP,
        ),
        concurrency=r.max_concurrent_rollouts or DEFAULT_CONCURRENCY,
        outcome=(
            out.resolved_reward if out.HasField("resolved_reward") else 1.0,
            out.unresolved_reward if out.HasField("unresolved_reward") else rpr.UNRESOLVED_REWARD,
            out.truncated_reward if out.HasField("truncated_reward") else -1.0,
        ),
        alpha=alpha,
        opd_coef=(d.kl_coef if d.HasField("kl_coef") else 1.0) if r.HasField("opd") else 0.0,
        opd_loss=OPD_LOSSES[d.loss_type],
        opd_lambda=d.js_mixture_weight if d.HasField("js_mixture_weight") else opd.JS_LAMBDA,
        opd_only=d.opd_only,
        max_staleness=r.max_staleness,
        updates_per_step=r.updates_per_step or 1,
        negative_scale=negative_scale,
    )


def step_prompts(pool: int, step: int, count: int, seed: int) -> list[int]:
    """The distinct pool indices of rollout step `step`: the next `count` of an endless stream of seeded shuffles
    of the pool, one per pass (an index already taken this step is skipped)."""
    count = min(count, pool)
    chosen: list[int] = []
    position = step * count
    while len(chosen) < count:
        passes, i = divmod(position, pool)
        order = list(range(pool))
        random.Random(seed * 1000 + passes).shuffle(order)
        if order[i] not in chosen:
            chosen.append(order[i])
        position += 1
    return chosen


def outcome_value(reward: tpb.Reward, values: tuple[float, float, float]) -> float | None:
    """R_bin of a graded rollout per the (resolved, unresolved, truncated) values; None when grading failed."""
    status = reward.outcome.status
    if status == tpb.OUTCOME_STATUS_RESOLVED:
        return values[0]
    if status == tpb.OUTCOME_STATUS_UNRESOLVED:
        return values[1]
    if status == tpb.OUTCOME_STATUS_TRUNCATED:
        return values[2]
    return None


@dataclass(frozen=True)
class Row:
    """One trajectory as the loss sees it: its exact token sequence, mask, behaviour log-probs and advantage."""

    token_ids: list[int]
    mask: list[int]
    """1 on sampled (model) tokens."""
    logprobs: list[float]
    """The behaviour policy's log-prob of each sampled token (0 elsewhere)."""
    prompt_len: int
    """How many leading tokens are the prompt."""
    advantage: float = 0.0
    teacher: list[float] | None = None
    """The OPD teacher's log-prob of each token (0 on the prompt), when there is a teacher."""
    teacher_mask: list[int] | None = None


def trajectory_row(traj: tpb.Trajectory, advantage: float = 0.0) -> Row:
    """The prompt and every step's tokens in order, cut after the last sampled token (later context has no
    loss)."""
    ids, mask = list(traj.prompt_tokens.token_ids), [0] * len(traj.prompt_tokens.token_ids)
    logprobs = [0.0] * len(ids)
    prompt_len = len(ids)
    for step in traj.steps:
        t = step.tokens
        ids += t.token_ids
        mask += t.mask if t.mask else [0] * len(t.token_ids)
        logprobs += t.logprobs if t.logprobs else [0.0] * len(t.token_ids)
    end = max((i + 1 for i, m in enumerate(mask) if m), default=0)
    return Row(
        ids[:end],
        mask[:end],
        [lp if m else 0.0 for lp, m in zip(logprobs[:end], mask[:end], strict=True)],
        min(prompt_len, end),
        advantage,
    )


@dataclass(frozen=True)
class Collected:
    """One step's rollouts: a group per prompt, and every trajectory generated for them (BAR's pool included)."""

    prompts: list[TaskInstance]
    results: list[bar.BarResult]
    generated: list[tpb.Trajectory]
    seconds: float


@dataclass
class Scored:
    """One prompt's group after scoring."""

    instance: TaskInstance
    rollouts: list[bar.Rollout]
    """Each with `reward` = its training reward R' (-1 where grading failed)."""
    rewards: list[float | None]
    """R' per member; None where grading failed (no reward, no loss)."""


# -- the torch side ---------------------------------------------------------------------------------------------


def batch_tensors(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """The rows right-padded into [B, L] tensors: ids, attention, mask (0 at position 0, which has no context),
    behaviour and teacher log-probs, teacher mask."""
    width = max(len(r.token_ids) for r in rows)
    t = {
        "ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
        **{k: torch.zeros(len(rows), width) for k in ("attention", "mask", "old", "teacher", "teacher_mask")},
    }
    for i, r in enumerate(rows):
        n = len(r.token_ids)
        t["ids"][i, :n] = torch.tensor(r.token_ids)
        t["attention"][i, :n] = 1
        t["mask"][i, 1:n] = torch.tensor(r.mask[1:], dtype=torch.float)
        t["old"][i, :n] = torch.tensor(r.logprobs)
        if r.teacher is not None and r.teacher_mask is not None:
            t["teacher"][i, :n] = torch.tensor(r.teacher)
            t["teacher_mask"][i, :n] = torch.tensor(r.teacher_mask, dtype=torch.float)
    return t


def sampled_logprobs(model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log p(x_t | x_<t) where mask is 1 (0 elsewhere), [B, L]: the sampled tokens of right-padded rows."""
    return sft.masked_token_logprobs(model, ids, mask, attention_mask=attention.long())


def update(
    model: Any, opt: torch.optim.Optimizer, rows: list[Row], s: Settings, o: optim.Optim, lr: float, pad_id: int
) -> dict[str, float]:
    """`s.updates_per_step` optimiser steps on the rows (each with at least one sampled token after position 0),
    each in micro-batches whose losses are weighted so the sum is the loss aggregated over all rows; returns the
    figures of the first pass (the loss, and the log-prob gap to the behaviour policy: on-policy, ~0), the clip
    fraction of the last (how much of the batch the trust region held back) and the KL of all passes together."""
    for group in opt.param_groups:
        group["lr"] = lr
    first = one_pass(model, opt, rows, s, o, pad_id)
    before = first.pop("before")
    last = first
    for _ in range(s.updates_per_step - 1):
        last = one_pass(model, opt, rows, s, o, pad_id)
        del last["before"]
    figures = first | {"clip_fraction": last["clip_fraction"], "mean_ratio": last["mean_ratio"]}
    figures["sequence_tokens"] *= s.updates_per_step  # the tokens the passes went through, for tokens_per_second
    if figures["trained_tokens"]:  # nothing was compared without a trained token
        figures["kl"] = step_kl(model, before)
    else:
        for key in ("logprob_diff_mean", "logprob_diff_max"):
            figures.pop(key)
    return figures


def one_pass(
    model: Any, opt: torch.optim.Optimizer, rows: list[Row], s: Settings, o: optim.Optim, pad_id: int
) -> dict[str, Any]:
    """One optimiser step over all rows; its figures, and under "before" each micro-batch with its sampled
    log-probs before the step (the loss's own forward), for the KL of the step. A row whose advantage is 0 (and
    that has no OPD term) has no gradient: it is left out of the passes but not of the loss's denominator, so the
    update is the same as with it, for less compute (with `negative_advantage_scale` 0, about half the rows).
    The figures (trained tokens, clip fraction, log-prob gap) are those of the rows that went through. When no row
    has a gradient, all go through: the step keeps its log-prob check and weight decay."""
    tokens = sum(sum(r.mask[1:]) for r in rows)
    opd_tokens = sum(sum(m * t for m, t in zip(r.mask[1:], (r.teacher_mask or [])[1:], strict=False)) for r in rows)
    total_rows = len(rows)
    rows = [r for r in rows if s.opd_coef or (r.advantage != 0.0 and not s.opd_only)] or rows
    active = sum(sum(r.mask[1:]) for r in rows)
    loss_sum = pg_sum = opd_sum = clipped = ratio = diff_sum = diff_max = seen = 0.0
    before: list[tuple[dict[str, torch.Tensor], torch.Tensor]] = []
    for start in range(0, len(rows), o.micro_batch_size):
        mb = rows[start : start + o.micro_batch_size]
        t = batch_tensors(mb, pad_id)
        mask = t["mask"]
        logp = sampled_logprobs(model, t["ids"], t["attention"], mask)
        before.append((t, logp.detach()))
        advantages = torch.tensor([0.0 if s.opd_only else r.advantage for r in mb])
        pg, stats = rl.policy_loss(logp, t["old"], advantages, mask, s.clip_low, s.clip_high, s.aggregation)
        mb_tokens = float(mask.sum())
        weight = mb_tokens / tokens if s.aggregation == rl.Aggregation.TOKEN_MEAN else len(mb) / total_rows
        loss = pg * weight
        pg_sum += float(pg.detach()) * weight
        if s.opd_coef:
            both = mask * t["teacher_mask"]
            term = opd.opd_loss(logp, t["teacher"], both, s.opd_loss, s.opd_lambda) * (
                float(both.sum()) / max(opd_tokens, 1)
            )
            loss = loss + s.opd_coef * term
            opd_sum += float(term.detach())
        loss.backward()
        loss_sum += float(loss.detach())
        clipped += stats.clip_fraction * mb_tokens
        ratio += stats.mean_ratio * mb_tokens
        diff = (logp.detach() - t["old"]).abs() * mask
        diff_sum += float(diff.sum())
        diff_max = max(diff_max, float(diff.max()))
        seen += float(t["attention"].sum())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), o.max_grad_norm)) if rows else 0.0
    if rows:
        opt.step()
    opt.zero_grad(set_to_none=True)
    n = max(active, 1)
    figures: dict[str, Any] = {
        "loss": loss_sum,
        "pg_loss": pg_sum,
        "clip_fraction": clipped / n,
        "mean_ratio": ratio / n,
        "grad_norm": grad_norm,
        "trained_tokens": float(active),
        "trained_trajectories": float(len(rows)),
        "sequence_tokens": seen,
        "logprob_diff_mean": diff_sum / n,
        "logprob_diff_max": diff_max,
        "before": before,
    }
    return {**figures, "opd_loss": opd_sum} if s.opd_coef else figures


@torch.no_grad()
def step_kl(model: Any, before: list[tuple[dict[str, torch.Tensor], torch.Tensor]]) -> float:
    """How far the step moved the policy: KL(before ‖ after) on the step's sampled tokens, the k3 estimator
    (e^d − 1 − d with d = log p_after − log p_before, ≥ 0, averaged over tokens); `before` holds each micro-batch
    with its sampled log-probs from the loss's forward pass. One extra forward pass after the step, no backward."""
    total = count = 0.0
    for t, old in before:
        mask = t["mask"]
        d = (sampled_logprobs(model, t["ids"], t["attention"], mask) - old) * mask
        total += float(((d.exp() - 1 - d) * mask).sum())
        count += float(mask.sum())
    return total / max(count, 1.0)


# -- the job ----------------------------------------------------------------------------------------------------


def run(ctx: JobContext) -> None:
    """The RL job, from its latest checkpoint when there is one; rollout events go to the runtime's NATS (none
    when it has no nats_url)."""
    train(ctx, None)


def train(ctx: JobContext, sink: EventSink | None) -> None:
    """The RL job, publishing every rollout's events to `sink` under run id = job id (None: to the runtime's
    NATS, when it names one)."""
    config = ctx.config
    if ctx.dist.world_size > 1:
        raise Unimplemented(
            "RL jobs run in one process; set compute.cpu_processes to 1", field="config.compute.cpu_processes"
        )
    o = optim.resolve(config.hyperparameters, pb.JOB_KIND_RL, opd_only=config.rl.opd.opd_only)
    resume = ctx.latest_checkpoint()
    state = optim.resume_state(resume.path) if resume is not None else {"step": 0, "optimizer": None, "extra": {}}
    o = dataclasses.replace(o, seed=state["extra"].get("seed", o.seed))  # an unset seed was drawn once, at step 0
    s = settings(config, o)
    instances = chosen(task_pool(config.dataset.path, config.rl.harness), list(config.dataset.task_ids))
    instances = instances[: config.dataset.limit or None]
    for path in config.dataset.eval_task_files:
        leaked = sorted(
            {i.instance_id for i in task_pool(path, config.rl.harness)} & {i.instance_id for i in instances}
        )
        if leaked:
            raise FailedPrecondition(
                f"{len(leaked)} task(s) of the pool are in the evaluation set {path}: "
                f"{leaked[:5]}; training on them would contaminate the evaluation. Drop them "
                "from the pool or the file",
                field="config.dataset.eval_task_files",
            )
    model, tokenizer = optim.load_model(resume.path if resume else optim.base_model_path(ctx))
    torch.manual_seed(o.seed)
    opt = optim.optimizer(model, o)
    start = int(state["step"])
    if state["optimizer"] is not None:
        opt.load_state_dict(state["optimizer"])
    if resume is not None:
        log.info("resuming %s from step %d (%s)", ctx.job_id, start, resume.path)
    total = o.max_steps or math.ceil(len(instances) / s.prompts_per_step)
    task_set = config.dataset.path if config.dataset.path in BUNDLED else Path(config.dataset.path).stem
    asyncio.run(RlRun(ctx, s, o, instances, task_set, model, tokenizer, opt, sink).run(start, total, resume))


class RlRun:
    """The rollout-step loop of one worker process: collect, score, train, save, push."""

    inference: Transport
    reward: Transport
    source: HarnessRolloutSource
    """Set by `run`, which owns the channels."""

    def __init__(
        self,
        ctx: JobContext,
        s: Settings,
        o: optim.Optim,
        instances: list[TaskInstance],
        task_set: str,
        model: Any,
        tokenizer: Any,
        opt: torch.optim.Optimizer,
        sink: EventSink | None,
    ) -> None:
        self.ctx, self.s, self.o, self.instances, self.task_set = ctx, s, o, instances, task_set
        self.model, self.tokenizer, self.opt, self.sink = model, tokenizer, opt, sink
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.policy_model = ctx.config.rl.policy_model
        self.pushed = ""
        """The weights version this job last loaded into the inference service ("" before its first push)."""

    async def run(self, start: int, total: int, resume: CheckpointRecord | None) -> None:
        ctx, s = self.ctx, self.s
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        policy = InferenceModel(ctx.runtime.inference_address, self.policy_model, s.sampling)
        self.inference = clients.transport("inference", ctx.runtime.inference_address)
        self.reward = clients.transport("reward", ctx.runtime.reward_address, options=options)
        async with AsyncSandboxClient(ctx.runtime.env_address) as client:
            pending: asyncio.Task[Collected] | None = None
            events = contextlib.AsyncExitStack()
            try:
                sink = self.sink
                if sink is None:
                    sink = (
                        await events.enter_async_context(EventPublisher.connect(ctx.runtime.nats_url))
                        if ctx.runtime.nats_url
                        else NullSink()
                    )
                await policy.connect()
                if resume is not None:  # the service may serve older weights (it restarted, or a push was lost)
                    await self.push(resume.path, resume.version)
                loop = AgentLoop(policy, s.limits, s.sampling, sink=sink, run_id=ctx.job_id)
                # Sample indices (and so trajectory ids) never repeat across the workers of one job: a step samples an
                # instance at most once, so worker a (ctx.attempt) owns the range [a*T*P, (a+1)*T*P) per instance
                # and a resumed worker never reuses the ids of the one it replaces (even its unfinished rollouts).
                per_step = s.bar.n_max if s.bar else s.group_size
                self.source = HarnessRolloutSource(
                    loop,
                    client,
                    harness_factory(self.ctx.config.rl.harness, client, self.task_set),
                    concurrency=s.concurrency,
                    first_sample=(ctx.attempt * total + start) * per_step,
                )
                for step in range(start, total):
                    ctx.check_cancelled()
                    collected = await (pending or asyncio.create_task(self.collect(step)))
                    # Bounded staleness: the next step's rollouts run while this one trains.
                    pending = (
                        asyncio.create_task(self.collect(step + 1)) if s.max_staleness and step + 1 < total else None
                    )
                    await self.step(step, total, collected)
            finally:
                if pending is not None:
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
                await policy.close()
                await self.inference.close()
                await self.reward.close()
                await events.aclose()  # flushes the rollouts' events

    async def collect(self, step: int) -> Collected:
        """The step's groups (BAR, or fixed N), one per prompt, and every trajectory generated for them."""
        s = self.s
        started = time.perf_counter()
        indices = step_prompts(len(self.instances), step, s.prompts_per_step + s.oversample_prompts, self.o.seed)
        prompts = [self.instances[i] for i in indices]

        async def fixed(prompt: TaskInstance) -> bar.BarResult:
            group = await self.source.sample(prompt, s.group_size)
            return bar.BarResult(group, bar.Mode.STRICT, 1, len(group))

        async with asyncio.TaskGroup() as tg:
            tasks = [
                tg.create_task(bar.balanced_rollout(self.source, p, s.bar) if s.bar else fixed(p)) for p in prompts
            ]
        # Collections never overlap (the next starts after this one returned), so these are all this step's.
        generated, self.source.trajectories = self.source.trajectories, []
        return Collected(prompts, [t.result() for t in tasks], generated, time.perf_counter() - started)

    async def score(self, collected: Collected) -> tuple[list[Scored], dict[str, float]]:
        """Every group member's training reward: the outcome value, plus alpha·J when there is a judge."""
        s = self.s
        scored = [
            Scored(
                instance,
                list(result.group),
                [outcome_value(r.trajectory.rewards[-1], s.outcome) if r.trajectory else None for r in result.group],
            )
            for instance, result in zip(collected.prompts, collected.results, strict=True)
        ]
        metrics: dict[str, float] = {}
        judged = [(g, i) for g in scored for i, r in enumerate(g.rewards) if r is not None]
        if s.alpha and judged:
            scores = await self.judge(
                [
                    (g.instance, g.rollouts[i].trajectory, g.rewards[i])  # type: ignore[misc]
                    for g, i in judged
                ]
            )
            for (g, i), j in zip(judged, scores, strict=True):
                g.rewards[i] = rpr.mix(g.rewards[i], j, s.alpha)  # type: ignore[arg-type]
            given = [j for j in scores if j is not None]
            metrics["judge_fallback_fraction"] = 1 - len(given) / len(scores)
            if given:
                metrics["judge_score_mean"] = statistics.fmean(given)
        for g in scored:
            g.rollouts = [
                dataclasses.replace(r, reward=-1.0 if x is None else x)
                for r, x in zip(g.rollouts, g.rewards, strict=True)
            ]
        return scored, metrics

    async def judge(self, items: list[tuple[TaskInstance, tpb.Trajectory, float]]) -> list[float | None]:
        """The RPR judge's score J of each (instance, trajectory, R_bin) through the reward service; None where
        the judge fell back. A failed call leaves every score None: judge errors never stop training."""
        config = rpb.JudgeConfig()
        config.CopyFrom(self.ctx.config.rl.judge)
        config.alpha = self.s.alpha
        requests = []
        for instance, traj, r_bin in items:
            outcome = tpb.Reward()
            outcome.CopyFrom(traj.rewards[-1])
            outcome.value = r_bin
            reference = rpb.JudgeReference(
                gold_patch=instance.patch,
                changed_files=patched_files(instance.patch),
                test_files=patched_files(instance.test_patch),
                fail_to_pass=instance.fail_to_pass,
            )
            requests.append(
                rpb.JudgeTrajectoryRequest(
                    trajectory=traj,
                    problem_statement=instance.problem_statement,
                    outcome=outcome,
                    reference=reference,
                    config=config,
                )
            )
        scores: list[float | None] = []
        try:
            for chunk in range(0, len(requests), REWARD_BATCH):
                response = await self.reward.unary(
                    "BatchJudgeTrajectories",
                    rpb.BatchJudgeTrajectoriesRequest(requests=requests[chunk : chunk + REWARD_BATCH]),
                    idempotent=True,
                    timeout=REWARD_TIMEOUT_S,
                )
                scores += [None if r.judge.fell_back else r.judge.judge_score for r in response.rewards]
        except OrchardError as err:
            log.warning("the judge failed for %d rollouts; they keep their outcome reward: %s", len(requests), err)
            return [None] * len(requests)
        return scores

    async def teacher(self, rows: list[Row]) -> tuple[list[Row], float]:
        """The rows with the OPD teacher's log-probs of their exact tokens (the prompt is context only), and the
        mean teacher-minus-student log-prob over sampled tokens."""
        d = self.ctx.config.rl.opd
        requests = [
            rpb.ComputeTeacherLogprobsRequest(
                teacher_model=d.teacher_model,
                prompt_token_ids=r.token_ids[: r.prompt_len],
                response=tpb.TokenSpan(
                    token_ids=r.token_ids[r.prompt_len :],
                    logprobs=r.logprobs[r.prompt_len :],
                    mask=r.mask[r.prompt_len :],
                ),
                max_context_tokens=d.teacher_max_context_tokens,
            )
            for r in rows
        ]
        rewards: list[tpb.Reward] = []
        for chunk in range(0, len(requests), REWARD_BATCH):
            response = await self.reward.unary(
                "BatchComputeTeacherLogprobs",
                rpb.BatchComputeTeacherLogprobsRequest(requests=requests[chunk : chunk + REWARD_BATCH]),
                idempotent=True,
                timeout=REWARD_TIMEOUT_S,
            )
            rewards += response.rewards
        out = [
            dataclasses.replace(
                r,
                teacher=[0.0] * r.prompt_len + list(w.teacher.teacher_logprobs),
                teacher_mask=[0] * r.prompt_len + list(w.teacher.mask),
            )
            for r, w in zip(rows, rewards, strict=True)
        ]
        return out, statistics.fmean(w.value for w in rewards) if rewards else 0.0

    async def step(self, step: int, total: int, collected: Collected) -> None:
        """Score, filter, train on the kept groups, save the weights and load them into the inference service."""
        ctx, s, o = self.ctx, self.s, self.o
        scored, metrics = await self.score(collected)
        passed = [g for g in scored if bar.keep_group(g.rollouts, s.group_filter)]
        kept = passed[: s.prompts_per_step]
        members = [
            (k, r, x)
            for k, g in enumerate(kept)
            for r, x in zip(g.rollouts, g.rewards, strict=True)
            if x is not None and r.trajectory is not None
        ]
        advantages = rl.group_advantages(
            torch.tensor([x for _, _, x in members], dtype=torch.double), [str(k) for k, _, _ in members]
        )
        advantages = rl.scale_negative(advantages, s.negative_scale)
        if len(advantages):
            metrics["advantage_abs_mean"] = float(advantages.abs().mean())
            metrics["advantage_std"] = float(advantages.std(unbiased=False))
        rows = [
            row
            for (_, r, _), a in zip(members, advantages.tolist(), strict=True)
            if any((row := trajectory_row(r.trajectory, a)).mask[1:])
        ]  # type: ignore[arg-type]
        if s.opd_coef and rows:
            rows, metrics["teacher_logprob_gap"] = await self.teacher(rows)
        ctx.check_cancelled()  # a cancel that came during the rollouts: no update
        lr = optim.lr_at(o, step, total)
        metrics["updates"] = float(s.updates_per_step if rows else 0)
        started = time.perf_counter()
        figures = await asyncio.to_thread(update, self.model, self.opt, rows, s, o, lr, self.pad_id)
        train_s = time.perf_counter() - started
        loss = figures.pop("loss")
        if not s.max_staleness and figures.get("logprob_diff_mean", 0.0) > DIFF_WARNING:
            log.warning(
                "the trainer's log-probs of the sampled tokens differ from the inference service's by %.3f "
                "on average: is %r serving base_model?",
                figures["logprob_diff_mean"],
                self.policy_model or "the default model",
            )
        rewards = [x for g in scored for x in g.rewards if x is not None]
        generated = collected.generated
        turns = [turn for t in generated for turn in t.steps]
        sampled = sum(turn.completion_token_count for turn in turns)
        # Turns sampled with other weights than the ones just trained (known once the job has pushed its own).
        stale = sum(turn.weights_version != self.pushed for turn in turns) if self.pushed else 0
        metrics.update(
            {
                "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
                "reward_std": statistics.pstdev(rewards) if rewards else 0.0,
                "resolved_fraction": sum(
                    t.rewards[-1].outcome.status == tpb.OUTCOME_STATUS_RESOLVED for t in generated if t.rewards
                )
                / max(len(generated), 1),
                "submitted_fraction": sum(t.stop_reason == tpb.STOP_REASON_SUBMITTED for t in generated)
                / max(len(generated), 1),
                "groups_kept_fraction": len(passed) / max(len(scored), 1),
                "groups_trained": float(len(kept)),
                "nonzero_variance_groups": float(sum(len({x for x in g.rewards if x is not None}) > 1 for g in scored)),
                "rollouts": float(len(generated)),
                "env_steps": float(len(turns)),
                "stale_turn_fraction": stale / max(len(turns), 1),
                "trained_trajectories": float(len(rows)),  # those with a gradient, from `figures` when trained
                "learning_rate": lr,
                "rollout_seconds": collected.seconds,
                "rollout_tokens_per_second": sampled / max(collected.seconds, 1e-9),
                "train_seconds": train_s,
                "tokens_per_second": figures.pop("sequence_tokens") / max(train_s, 1e-9),
                **figures,
            }
        )
        final = step + 1 == total
        path = await asyncio.to_thread(
            optim.save,
            ctx,
            self.model,
            self.tokenizer,
            self.opt,
            step + 1,
            {"loss": loss, "reward_mean": metrics["reward_mean"]},
            final,
            {"seed": o.seed},
        )
        ctx.check_cancelled()  # a cancelled job never changes what the inference service serves (its checkpoint stays)
        metrics["push_seconds"] = await self.push(path, ctx.version(step + 1))
        ctx.progress(step + 1, total, loss, **metrics)

    async def push(self, path: Path, version: str) -> float:
        """Load checkpoint `path` into the policy model of the inference service; the seconds it took."""
        started = time.perf_counter()
        await self.inference.unary(
            "UpdateWeights",
            ipb.UpdateWeightsRequest(model=self.policy_model, checkpoint_path=str(path), weights_version=version),
            idempotent=True,
            timeout=PUSH_TIMEOUT_S,
        )
        self.pushed = version
        log.info("inference now serves %s (%s)", version, path)
        return time.perf_counter() - started
