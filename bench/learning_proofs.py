"""Proof that the recipes learn, on the toys of trainers/toy.py, each against its baseline measured in the same run
and averaged over fixed seeds: BAR + GRPO against fixed-N GRPO at the same generation cap per update (environment
steps to 60% success, groups with a reward spread while learning, success at the end; SGD, and the steps with Adam),
CA-SFT with rise segments against resolved-only SFT at equal sample counts (localisation accuracy), OPD towards a
bigram teacher (exact KL before and after), and RPR against outcome-only rewards (groups with an advantage spread,
all-failed ones included). CPU only, no download; prints one JSON object.

    python bench/learning_proofs.py [--seeds 5] [--env-steps 60000] [--sft-samples 40] [--opd-steps 200]
                                    [--rpr-groups 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from statistics import mean

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "trainers"))  # the CPU toys live with their tests

import toy

TARGET = 0.6


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, rounded; None when either is missing or the baseline is 0."""
    return round(value / baseline, 3) if value is not None and baseline else None


async def grpo(seeds: range, env_steps: int) -> dict[str, object]:
    """BAR and fixed-N GRPO runs over the whole budget with SGD; Adam runs until the target."""
    figures: dict[str, dict[str, float]] = {}
    for name, use_bar in (("bar", True), ("fixed_n", False)):
        curves = [await toy.train_grpo(seed, use_bar, env_steps) for seed in seeds]
        adam = [await toy.train_grpo(seed, use_bar, env_steps, adam=True, until=TARGET) for seed in seeds]
        figures[name] = {
            "env_steps_to_target": round(mean(c.steps_to(TARGET) or env_steps for c in curves)),
            "seeds_reaching_target": sum(c.steps_to(TARGET) is not None for c in curves),
            "spread_group_fraction": round(mean(c.spread_fraction(TARGET) for c in curves), 3),
            "final_success": round(mean(c.final_success for c in curves), 3),
            "adam_env_steps_to_target": round(mean(c.steps_to(TARGET) or env_steps for c in adam)),
        }
    bar, fixed = figures["bar"], figures["fixed_n"]
    return {
        "target_success": TARGET,
        "env_step_budget": env_steps,
        **bar,
        "baseline_fixed_n": fixed,
        **{
            f"ratio_{key}": ratio(bar[key], fixed[key])
            for key in ("env_steps_to_target", "spread_group_fraction", "final_success", "adam_env_steps_to_target")
        },
    }


def ca_sft(seeds: range, samples: int) -> dict[str, object]:
    with_rise = mean(toy.localisation_accuracy(toy.train_sft(toy.sft_dataset(s, samples, True))) for s in seeds)
    resolved = mean(toy.localisation_accuracy(toy.train_sft(toy.sft_dataset(s, samples, False))) for s in seeds)
    return {
        "samples": samples,
        "localisation_accuracy": round(with_rise, 3),
        "baseline_resolved_only": round(resolved, 3),
        "ratio": ratio(with_rise, resolved),
    }


def opd(seeds: range, steps: int) -> dict[str, object]:
    runs = [toy.distill_bigram(seed, steps) for seed in seeds]
    after_to_before = mean(after / before for before, after in runs)
    return {
        "steps": steps,
        "kl_before": round(mean(b for b, _ in runs), 3),
        "kl_after": round(mean(a for _, a in runs), 3),
        "ratio_kl_after_to_before": round(after_to_before, 3),
        "kl_cut": round(1 - after_to_before, 3),
    }


def fraction(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def rpr(seeds: range, n_groups: int) -> dict[str, object]:
    groups = [g for seed in seeds for g in toy.rpr_spreads(seed, n_groups)]
    failed = [g for g in groups if g.all_failed]
    spread, outcome = fraction([g.rpr for g in groups]), fraction([g.outcome for g in groups])
    return {
        "groups": len(groups),
        "all_failed_groups": len(failed),
        "all_failed_spread_fraction": rounded(fraction([g.rpr for g in failed])),
        "baseline_outcome_only_all_failed_spread_fraction": rounded(fraction([g.outcome for g in failed])),
        "spread_group_fraction": rounded(spread),
        "baseline_outcome_only_spread_group_fraction": rounded(outcome),
        "ratio_spread_group_fraction": ratio(spread, outcome),
    }


async def main(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    seeds = range(args.seeds)
    start = time.perf_counter()
    report: dict[str, object] = {"seeds": args.seeds}
    report["bar_grpo"] = await grpo(seeds, args.env_steps)
    report["ca_sft"] = ca_sft(seeds, args.sft_samples)
    report["opd"] = opd(seeds, args.opd_steps)
    report["rpr"] = rpr(seeds, args.rpr_groups)
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..n-1 for every toy")
    parser.add_argument("--env-steps", type=int, default=60_000, help="environment steps per GRPO run")
    parser.add_argument("--sft-samples", type=int, default=40, help="CA-SFT samples per training set")
    parser.add_argument("--opd-steps", type=int, default=200)
    parser.add_argument("--rpr-groups", type=int, default=64, help="groups of 8 per seed")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
