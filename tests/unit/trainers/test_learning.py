"""The recipes learn on the tabular ToyRepair (toy.py beside it): BAR + GRPO against fixed-N GRPO (docs/training.md §2.3,
toy test 4), CA-SFT rise segments against resolved-only SFT (§2.2, toy test 5) and rubric-mixed rewards in
all-failed groups (§2.5); first, that the exact evaluations they rely on match sampling."""

from __future__ import annotations

import random
from statistics import mean
from typing import cast

import pytest
import toy

from orchard.trainers.ca_sft import extract_rise_segments, interpolate

SEEDS = range(5)
TARGET = 0.6


def test_exact_success_and_localisation_match_sampling() -> None:
    policy = toy.TabularPolicy()
    policy.logits.data[:, toy.RUN_TESTS] += 1.0  # not uniform, so states differ
    policy.logits.data[:, toy.EDIT] += 0.5
    cumulative, rng = policy.sampler(), random.Random(0)
    episodes = [policy.rollout(toy.Task("t", rng.randrange(len(toy.FILES))), cumulative, rng) for _ in range(20_000)]
    assert mean(e.resolved for e in episodes) == pytest.approx(toy.success_rate(policy), abs=0.015)

    def localised(e: toy.Episode) -> bool:
        first = next((a for a in e.actions if toy.CAT <= a < toy.RUN_TESTS), None)
        return first == toy.CAT + e.task.buggy

    assert mean(localised(e) for e in episodes) == pytest.approx(toy.localisation_accuracy(policy), abs=0.015)


def test_environment_rewards_and_truncation() -> None:
    task = toy.Task("t", 1)
    solve = [toy.RUN_TESTS, toy.CAT + 1, toy.EDIT, toy.SUBMIT]
    assert toy.play(task, solve).reward == 1.0
    assert toy.play(task, [toy.CAT + 0, toy.EDIT, toy.SUBMIT]).reward == -1.0  # edited a correct file
    fixed_then_broke = [toy.CAT + 1, toy.EDIT, toy.CAT + 2, toy.EDIT, toy.SUBMIT]
    assert toy.play(task, fixed_then_broke).reward == -1.0
    truncated = toy.play(task, [toy.LS] * 4 + solve)
    assert (truncated.submitted, truncated.reward, len(truncated.actions)) == (False, -1.0, toy.STEP_BUDGET)


@pytest.mark.slow
async def test_bar_reaches_60_percent_in_fewer_env_steps_than_fixed_n_grpo() -> None:
    """Same generation cap per update (4 BAR prompts of up to 16 rollouts, 8 fixed groups of 8), SGD; a run
    that never gets there counts as the whole budget. BAR must need at least 20% fewer steps on average, and
    more of its groups must have a reward spread while learning."""
    budget = 50_000
    bar = [await toy.train_grpo(seed, True, budget, until=TARGET) for seed in SEEDS]
    fixed = [await toy.train_grpo(seed, False, budget, until=TARGET) for seed in SEEDS]
    bar_steps = [c.steps_to(TARGET) for c in bar]
    fixed_steps = [c.steps_to(TARGET) or budget for c in fixed]
    bar_spread = mean(c.spread_fraction(TARGET) for c in bar)
    fixed_spread = mean(c.spread_fraction(TARGET) for c in fixed)
    print(
        f"env steps to {TARGET:.0%}: BAR {bar_steps}, fixed-N {fixed_steps}; "
        f"groups with a reward spread: BAR {bar_spread:.2f}, fixed-N {fixed_spread:.2f}"
    )
    assert None not in bar_steps
    assert mean(cast(list[int], bar_steps)) <= 0.8 * mean(fixed_steps)
    assert bar_spread > fixed_spread


def test_oracle_rise_segments_cover_the_localisation_of_a_failed_rollout() -> None:
    """Run the tests, open the buggy file, then open its caller and fix there: only the first two actions rise."""
    episode = toy.play(toy.Task("t", 1), [toy.RUN_TESTS, toy.CAT + 1, toy.CAT + 2, toy.EDIT, toy.SUBMIT])
    curve = interpolate(toy.oracle_key_steps(episode), len(episode.actions) + 1)
    assert curve == pytest.approx([0.2, 0.5, 0.8, 0.5, 0.1, 0.0])
    assert extract_rise_segments(curve) == [(0, 2)]
    assert toy.trained_pairs(episode) == list(zip(episode.states[:2], episode.actions[:2], strict=False))
    wrong_guess = toy.play(toy.Task("t", 1), [toy.CAT + 0, toy.EDIT, toy.SUBMIT])
    assert toy.trained_pairs(wrong_guess) is None


def test_ca_sft_rise_segments_improve_localisation_at_equal_sample_counts() -> None:
    """40 samples each: resolved only, or 20 resolved and 20 rise-segment samples of failed rollouts."""
    resolved_only = [toy.localisation_accuracy(toy.train_sft(toy.sft_dataset(s, 40, with_rise=False))) for s in SEEDS]
    with_rise = [toy.localisation_accuracy(toy.train_sft(toy.sft_dataset(s, 40, with_rise=True))) for s in SEEDS]
    print(f"localisation: resolved only {mean(resolved_only):.3f}, with rise segments {mean(with_rise):.3f}")
    assert mean(with_rise) >= mean(resolved_only) + 0.05


def test_rubric_judge_spreads_all_failed_groups() -> None:
    spreads = [g for seed in SEEDS for g in toy.rpr_spreads(seed, 32)]
    failed = [g for g in spreads if g.all_failed]
    assert len(failed) >= 100
    assert not any(g.outcome for g in failed)  # outcome rewards alone: all -1, no signal
    assert mean(g.rpr for g in failed) >= 0.9
