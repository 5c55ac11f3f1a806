"""Balanced Adaptive Rollout (docs/training.md §2.3) on hand-built pools and a seeded Bernoulli rollout source."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_helpers import make_trajectory

from orchard.trainers.bar import (
    BarConfig,
    GroupFilter,
    Mode,
    Rollout,
    Status,
    balanced_rollout,
    collect_batch,
    keep_group,
    rollout_from_trajectory,
    top_ranked,
    try_assemble,
)
from orchard.trainers.rl import grpo_advantages
from orchard.types.v1 import types_pb2 as tpb

C, T, A = Status.COMPLETED, Status.TRUNCATED, Status.ABORTED


def pos(length: int = 10, status: Status = C) -> Rollout:
    return Rollout(1.0, status, length)


def neg(length: int = 10, status: Status = C) -> Rollout:
    return Rollout(-1.0, status, length)


def n_pos(group: list[Rollout]) -> int:
    return sum(r.reward > 0 for r in group)


def test_assemble_picks_the_count_closest_to_rho_star() -> None:
    group = try_assemble([pos()] * 5 + [neg()] * 5, 8, 0.375, 0.625, 0.5)
    assert len(group) == 8 and n_pos(group) == 4


@pytest.mark.parametrize(
    ("n_p", "n_q", "lo", "hi", "expected"),
    [
        (2, 10, 0.25, 0.75, 2),  # n_lo = ceil(2.0) = 2 is the closest feasible count to n* = 4
        (2, 10, 0.375, 0.625, None),  # n_lo = ceil(3.0) = 3 > |P|
        (7, 1, 0.25, 0.75, None),  # n_hi = 6 needs 2 negatives
        (7, 1, 0.0, 1.0, 7),  # relaxed: 4, 3, 5, 2, 6, 1 fail; 7 fits
        (1, 5, 0.3, 0.7, None),  # N = 4: n_lo = ceil(1.2) = 2, n_hi = floor(2.8) = 2
        (3, 3, 0.3, 0.7, 2),
        (0, 8, 0.0, 1.0, 0),
        (3, 4, 0.0, 1.0, None),  # fewer than N usable
    ],
)
def test_assemble_bounds(n_p: int, n_q: int, lo: float, hi: float, expected: int | None) -> None:
    n = 4 if (lo, hi) == (0.3, 0.7) else 8
    group = try_assemble([pos()] * n_p + [neg()] * n_q, n, lo, hi, (lo + hi) / 2 if hi < 1 else 0.5)
    assert (None if group is None else n_pos(group)) == expected
    if group is not None:
        assert len(group) == n


def test_assemble_rounds_n_star_half_to_even() -> None:
    # N = 5, rho* = 0.5: n* = round(2.5) = 2
    assert n_pos(try_assemble([pos()] * 5 + [neg()] * 5, 5, 0.0, 1.0, 0.5)) == 2


def test_assemble_orders_by_status_then_length_and_never_uses_backfill() -> None:
    p_trunc_short, p_long, p_short = pos(5, T), pos(50), pos(20)
    pool = [p_trunc_short, p_long, p_short, pos(1, A), pos(2, A), neg(30, T), neg(40), neg(3, A)]
    group = try_assemble(pool, 4, 0.5, 0.5, 0.5)
    assert group == [p_short, p_long, neg(40), neg(30, T)]
    assert try_assemble(pool, 6, 0.0, 1.0, 0.5) is None  # 5 usable: the aborted ones never count


def test_top_ranked_fills_with_backfill() -> None:
    pool = [neg(9, A), pos(4, T), neg(7), pos(1, A)]
    assert top_ranked(pool, 3) == [neg(7), pos(4, T), pos(1, A)]


def test_group_filter() -> None:
    assert keep_group([pos(), neg()])
    assert not keep_group([neg(), neg()])  # std 0
    assert not keep_group([pos(), pos()])  # std 0
    assert not keep_group([pos(), neg(), neg(status=A)])  # an aborted member
    assert not keep_group([Rollout(0.0, C, 1), Rollout(-1.0, C, 1)])  # no positive reward
    assert keep_group([Rollout(0.0, C, 1), Rollout(-1.0, C, 1)], GroupFilter.NONZERO_STD)
    assert keep_group([neg(), neg()], GroupFilter.NO_ABORTED)
    assert keep_group([neg(status=A)], GroupFilter.NONE)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="divide"):
        BarConfig(n=4, n_max=8, stride=3)
    with pytest.raises(ValueError, match="N < N_max"):
        BarConfig(n=8, n_max=8, stride=8)
    assert BarConfig(rho_min=0.25, rho_max=0.75).rho_star == 0.5


def test_rollout_from_trajectory() -> None:
    traj = make_trajectory([1, 2], [([3, 4], [5]), ([6], [])])
    traj.stop_reason = tpb.STOP_REASON_STEP_LIMIT
    assert rollout_from_trajectory(traj, -1.0) == Rollout(-1.0, T, 3, traj)
    traj.stop_reason = tpb.STOP_REASON_TIME_LIMIT  # over the wall clock: backfill
    assert rollout_from_trajectory(traj, -1.0).status == A


class BernoulliSource:
    """A synthetic rollout source: prompt = success probability p; random statuses and lengths, seeded per
    (seed, prompt, call) so results do not depend on scheduling. It records every rollout it generated."""

    def __init__(self, seed: int, abort_rate: float = 0.05, truncate_rate: float = 0.15) -> None:
        self.seed, self.abort_rate, self.truncate_rate = seed, abort_rate, truncate_rate
        self.calls: dict[str, int] = {}
        self.generated: dict[str, list[Rollout]] = {}

    async def sample(self, prompt: str, n: int) -> list[Rollout]:
        k = self.calls.get(prompt, 0)
        self.calls[prompt] = k + 1
        rng = random.Random(f"{self.seed}/{prompt}/{k}")
        p = float(prompt.split("#")[0])
        out = []
        for _ in range(n):
            u = rng.random()
            status = A if u < self.abort_rate else T if u < self.abort_rate + self.truncate_rate else C
            success = status == C and rng.random() < p
            out.append(Rollout(1.0 if success else -1.0, status, rng.randint(10, 100)))
        self.generated.setdefault(prompt, []).extend(out)
        return out


P_VALUES = ["0", "0.05", "0.3", "0.5", "0.9", "1"]
V1_STRIDED = BarConfig(n=8, n_max=16, stride=4, rho_min=0.375, rho_max=0.625)


@pytest.mark.parametrize("p", P_VALUES)
async def test_bar_properties_on_a_bernoulli_policy(p: str) -> None:
    config = V1_STRIDED
    for seed in range(20):
        source = BernoulliSource(seed)
        result = await balanced_rollout(source, p, config)
        pool = source.generated[p]
        assert len(result.group) == config.n and result.generated == len(pool) == result.rounds * config.stride
        # generation stopped at the first stride where a strict group existed
        for k in range(1, result.rounds):
            assert try_assemble(pool[: k * config.stride], 8, 0.375, 0.625, 0.5) is None
        if result.mode == Mode.STRICT:
            assert 3 <= n_pos(result.group) <= 5
        else:
            assert result.rounds == config.n_max // config.stride
        if p == "0":
            assert result.mode == Mode.RELAXED and n_pos(result.group) == 0
            assert not keep_group(result.group)


async def test_bar_is_deterministic_under_a_seed() -> None:
    runs = [[await balanced_rollout(BernoulliSource(7), p, V1_STRIDED) for p in P_VALUES] for _ in range(2)]
    assert runs[0] == runs[1]


async def test_top_ranked_when_too_few_usable() -> None:
    result = await balanced_rollout(BernoulliSource(0, abort_rate=0.8), "0.5", BarConfig(n=4, n_max=8, stride=4))
    assert result.mode == Mode.TOP_RANKED and len(result.group) == 4 and not keep_group(result.group)


async def test_over_sampled_prompts_replace_dropped_groups() -> None:
    batch = await collect_batch(
        BernoulliSource(1, abort_rate=0.0), ["1", "0", "0.5#a", "0.5#b", "0.5#c"], 2, BarConfig(n=4, n_max=8, stride=8)
    )
    assert len(batch.results) == 5 and len(batch.groups) == 2
    assert batch.groups == [batch.results[2].group, batch.results[3].group]
    assert batch.generated == 40


def _efficiency(groups: list[list[Rollout]]) -> tuple[float, float]:
    """(fraction of groups with non-zero reward variance, token-weighted mean |A|)."""
    nonzero, abs_adv, tokens = 0, 0.0, 0
    for group in groups:
        adv = grpo_advantages(torch.tensor([r.reward for r in group]))
        nonzero += bool(adv.abs().sum() > 0)
        abs_adv += sum(abs(a) * r.length for a, r in zip(adv.tolist(), group, strict=False))
        tokens += sum(r.length for r in group)
    return nonzero / len(groups), abs_adv / tokens


async def test_bar_beats_fixed_n_grpo_at_the_same_generation_budget() -> None:
    difficulties = ["0.05", "0.1", "0.3", "0.5", "0.7", "0.9"]
    source = BernoulliSource(3, abort_rate=0.0)
    bar_groups, budget = [], 0
    for i in range(60):
        result = await balanced_rollout(source, f"{difficulties[i % 6]}#{i}", V1_STRIDED)
        bar_groups.append(result.group)
        budget += result.generated
    fixed_groups = [await source.sample(f"{difficulties[i % 6]}#fixed{i}", 8) for i in range(budget // 8)]
    bar_nonzero, bar_adv = _efficiency(bar_groups)
    fixed_nonzero, fixed_adv = _efficiency(fixed_groups)
    assert bar_nonzero > fixed_nonzero
    assert bar_adv > fixed_adv
