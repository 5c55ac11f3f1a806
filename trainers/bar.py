"""Balanced Adaptive Rollout (docs/training.md §2.3): per prompt, generate rollouts a stride at a time until a group of N
with a positive fraction in [rho_min, rho_max] can be assembled; then the relaxed range [0, 1]; then the best
N of the pool. The group filter then decides which groups enter the batch; over-sampled prompts replace the
dropped ones. Rollouts come from a `RolloutSource` (a harness-backed one drives the agent loop and env).

Choices [I]:
- Usable = completed (submitted) or truncated by a step, token or format budget; backfill (never usable) =
  aborted by the model or environment, cancelled, or over the wall-clock limit.
- n* = round(rho*·N) with Python's round (half to even); n_lo = ceil(lo·N), n_hi = floor(hi·N), each with 1e-9
  of float slack. Candidates equally far from n* are tried smaller n+ first.
- TOP_RANKED sorts the whole pool by (status rank, response length) and takes the first N.
- Within P and Q, ties in (status rank, length) keep generation order (the sort is stable).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol, TypeVar

from orchard import outcomes
from orchard.types.v1 import types_pb2 as tpb

SLACK = 1e-9
Prompt = TypeVar("Prompt")
PromptIn = TypeVar("PromptIn", contravariant=True)


class Status(IntEnum):
    """A rollout's status; the value is its rank (lower is preferred)."""

    COMPLETED = 0
    TRUNCATED = 1
    ABORTED = 2


@dataclass(frozen=True)
class Rollout:
    """One scored rollout as BAR sees it."""

    reward: float
    status: Status
    length: int
    """The response length in tokens (model tokens only)."""
    trajectory: tpb.Trajectory | None = None
    """The trajectory itself, when the source has one (synthetic sources leave it None)."""

    @property
    def usable(self) -> bool:
        return self.status != Status.ABORTED


STATUS_OF_STOP = {stop: Status.COMPLETED if outcomes.submitted(stop) else Status.TRUNCATED for stop in outcomes.USABLE}
"""Stop reasons of usable rollouts (orchard.outcomes); every other one (time limit, model or env error, cancel) is
backfill."""


def rollout_from_trajectory(traj: tpb.Trajectory, reward: float) -> Rollout:
    """A graded trajectory as a BAR rollout."""
    length = sum(sum(s.tokens.mask) for s in traj.steps)
    return Rollout(reward, STATUS_OF_STOP.get(traj.stop_reason, Status.ABORTED), length, traj)


def _rank(r: Rollout) -> tuple[int, int]:
    return int(r.status), r.length


def try_assemble(pool: Sequence[Rollout], n: int, lo: float, hi: float, rho_star: float) -> list[Rollout] | None:
    """N usable rollouts with n+ positives, n+ in [ceil(lo·N), floor(hi·N)] closest to round(rho*·N); None if
    no such group exists in the pool. Positives come first in the group."""
    positives = sorted((r for r in pool if r.usable and r.reward > 0), key=_rank)
    negatives = sorted((r for r in pool if r.usable and r.reward <= 0), key=_rank)
    if len(positives) + len(negatives) < n:
        return None
    n_star = round(rho_star * n)
    n_lo, n_hi = math.ceil(lo * n - SLACK), math.floor(hi * n + SLACK)
    for n_pos in sorted(range(n_lo, n_hi + 1), key=lambda k: abs(k - n_star)):
        if n_pos <= len(positives) and n - n_pos <= len(negatives):
            return positives[:n_pos] + negatives[: n - n_pos]
    return None


def top_ranked(pool: Sequence[Rollout], n: int) -> list[Rollout]:
    """The best-effort group: the first N of the pool by (status rank, length), backfill included."""
    return sorted(pool, key=_rank)[:n]


@dataclass(frozen=True)
class BarConfig:
    """BAR's per-prompt settings (defaults: the v1 paper's 8 / 16 / 16, [0.375, 0.625])."""

    n: int = 8
    """The training group size N."""
    n_max: int = 16
    """The generation budget N_max per prompt."""
    stride: int = 16
    """Rollouts per round s; s = N_max is one round."""
    rho_min: float = 0.375
    rho_max: float = 0.625

    def __post_init__(self) -> None:
        if not 0 < self.n < self.n_max:
            raise ValueError(f"BAR needs 0 < N < N_max, got N={self.n}, N_max={self.n_max}")
        if self.stride <= 0 or self.n_max % self.stride:
            raise ValueError(f"the stride {self.stride} must divide N_max={self.n_max}")
        if not 0 <= self.rho_min <= self.rho_max <= 1:
            raise ValueError(f"need 0 <= rho_min <= rho_max <= 1, got [{self.rho_min}, {self.rho_max}]")

    @property
    def rho_star(self) -> float:
        return (self.rho_min + self.rho_max) / 2


class Mode(StrEnum):
    """How a group was assembled."""

    STRICT = "strict"
    RELAXED = "relaxed"
    TOP_RANKED = "top_ranked"


@dataclass(frozen=True)
class BarResult:
    """One prompt's group and how it was found."""

    group: list[Rollout]
    mode: Mode
    rounds: int
    generated: int
    """Rollouts generated for this prompt (the pool size)."""


class RolloutSource(Protocol[PromptIn]):
    """Generates scored rollouts of a prompt: the variation point between synthetic tests and the harness."""

    async def sample(self, prompt: PromptIn, n: int) -> list[Rollout]:
        """n fresh rollouts of `prompt`, generated in parallel, each scored by the reward."""
        ...


async def balanced_rollout(source: RolloutSource[Prompt], prompt: Prompt, config: BarConfig) -> BarResult:
    """BAR for one prompt: stride rounds until a balanced group exists, else the relaxed or best-effort group."""
    pool: list[Rollout] = []
    rounds = 0
    for rounds in range(1, config.n_max // config.stride + 1):
        pool += await source.sample(prompt, config.stride)
        group = try_assemble(pool, config.n, config.rho_min, config.rho_max, config.rho_star)
        if group is not None:
            return BarResult(group, Mode.STRICT, rounds, len(pool))
    group = try_assemble(pool, config.n, 0.0, 1.0, config.rho_star)
    if group is not None:
        return BarResult(group, Mode.RELAXED, rounds, len(pool))
    return BarResult(top_ranked(pool, config.n), Mode.TOP_RANKED, rounds, len(pool))


class GroupFilter(StrEnum):
    """Which groups enter the batch (after rewards are known)."""

    DEFAULT = "default"
    """Drop a group when a member aborted, its reward std is 0, or no reward is positive."""
    NONZERO_STD = "nonzero_std"
    NO_ABORTED = "no_aborted"
    NONE = "none"


def keep_group(group: Sequence[Rollout], kind: GroupFilter = GroupFilter.DEFAULT) -> bool:
    """Whether a group passes the filter."""
    rewards = [r.reward for r in group]
    aborted = any(not r.usable for r in group)
    spread = len(rewards) > 1 and max(rewards) - min(rewards) > 0
    if kind == GroupFilter.DEFAULT:
        return not aborted and spread and max(rewards, default=0.0) > 0
    if kind == GroupFilter.NONZERO_STD:
        return spread
    if kind == GroupFilter.NO_ABORTED:
        return not aborted
    return True


@dataclass(frozen=True)
class Batch:
    """One rollout step's groups."""

    groups: list[list[Rollout]]
    """The kept groups, at most n_groups, in prompt order."""
    results: list[BarResult] = field(default_factory=list)
    """Every prompt's BAR result, kept or not (for metrics)."""

    @property
    def generated(self) -> int:
        return sum(r.generated for r in self.results)


async def collect_batch(
    source: RolloutSource[Prompt],
    prompts: Sequence[Prompt],
    n_groups: int,
    config: BarConfig,
    kind: GroupFilter = GroupFilter.DEFAULT,
) -> Batch:
    """Runs BAR on every prompt (the step's prompts plus the over-sampled ones) concurrently, filters the groups
    and keeps the first `n_groups` that pass, in prompt order: later prompts replace dropped ones."""
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(balanced_rollout(source, p, config)) for p in prompts]
    results = [t.result() for t in tasks]
    kept = [r.group for r in results if keep_group(r.group, kind)][:n_groups]
    return Batch(kept, results)
