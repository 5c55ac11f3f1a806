"""Proof that a value model trained on historical runs reranks best-of-N candidates (docs/training.md §2.6, CPU toy test),
on the toy of tests/unit/trainers/value_toy.py, averaged over fixed seeds: a logistic regression over a bag of tokens, trained
with BCE + within-task pairwise loss on a store of five policies' runs, picks among 8 fresh candidates of a
middling policy on held-out tasks. Baselines from the same run: a random pick (random@N, the ratio's
denominator), the oracle (pass@N), a majority vote over patch clusters, an untrained model, BCE alone; and best@8
as the store grows one experiment at a time. CPU only, no download; prints one JSON object.

    python bench/value_proofs.py [--seeds 5] [--tasks 24] [--eval-tasks 128] [--epochs 30] [--plot PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "trainers"))  # the CPU toys live with their tests

import value_toy

CONTROL_INITS = 4
"""Untrained models per seed: one random direction can rank well by chance."""


def averaged(reports: list[dict[str, Any]]) -> dict[str, float | None]:
    """The headline figures (value_toy.figures) averaged over reports, rounded; None where none has the figure."""
    rows = [value_toy.figures(r) for r in reports]
    out: dict[str, float | None] = {}
    for key in rows[0]:
        values = [v for r in rows if (v := r[key]) is not None]
        out[key] = round(mean(values), 3) if values else None
    return out


def curve(reports: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The best@N curve (random, best, pass for each N) averaged over reports."""
    ns = [row["n"] for row in reports[0]["curve"]]
    return [
        {
            "n": n,
            **{
                k: round(mean(next(row[k] for row in r["curve"] if row["n"] == n) for r in reports), 3)
                for k in ("random", "best", "pass")
            },
        }
        for n in ns
    ]


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, rounded; None when either is missing or the baseline is 0."""
    return round(value / baseline, 3) if value is not None and baseline else None


def plot(path: str, main: list[dict[str, float]], vote: list[dict[str, float]], seeds: int) -> None:
    """The best@N curve as a PNG: random pick, majority vote, the value model and the oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [row["n"] for row in main]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(ns, [r["pass"] for r in main], "k--", marker="o", label="pass@N (oracle)")
    ax.plot(ns, [r["best"] for r in main], marker="o", label="best@N (value model)")
    ax.plot(ns, [r["best"] for r in vote], marker="o", label="majority vote")
    ax.plot(ns, [r["random"] for r in main], marker="o", label="random@N")
    ax.set(
        xscale="log",
        xticks=ns,
        xticklabels=[str(n) for n in ns],
        ylim=(0, 1),
        xlabel="candidates N",
        ylabel="tasks resolved",
        title=f"Value-model reranking on ToyRepair ({seeds} seeds)",
    )
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    if args.quick:
        args.seeds, args.tasks, args.eval_tasks, args.epochs = 1, 4, 8, 2
    seeds, experiments = range(args.seeds), len(value_toy.SKILLS)
    start = time.perf_counter()
    growth = {
        k: [value_toy.proof(s, k, args.tasks, args.eval_tasks, args.epochs) for s in seeds]
        for k in range(1, experiments + 1)
    }
    reports = growth[experiments]
    vote = [value_toy.majority_vote(s, args.eval_tasks) for s in seeds]
    control = [
        value_toy.untrained(s * CONTROL_INITS + i, s, args.eval_tasks) for s in seeds for i in range(CONTROL_INITS)
    ]
    bce = [
        value_toy.proof(s, experiments, args.tasks, args.eval_tasks, args.epochs, pairwise_weight=0.0) for s in seeds
    ]
    figures, vote_figures = averaged(reports), averaged(vote)
    main_curve, vote_curve = curve(reports), curve(vote)
    if args.plot:
        plot(args.plot, main_curve, vote_curve, args.seeds)
    return {
        "seeds": args.seeds,
        "skills": list(value_toy.SKILLS),
        "eval_skill": value_toy.EVAL_SKILL,
        "history_tasks_per_experiment": args.tasks,
        "eval_tasks": args.eval_tasks,
        "candidates_per_task": value_toy.N_CANDIDATES,
        "epochs": args.epochs,
        "pairwise_weight": 1.0,
        **figures,
        "ratio_best_to_random_at_8": ratio(figures["best@8"], figures["random@8"]),
        "ratio_best_to_pass_at_8": ratio(figures["best@8"], figures["pass@8"]),
        "curve": main_curve,
        "per_seed": [
            {"seed": s, **{k: None if v is None else round(v, 3) for k, v in value_toy.figures(r).items()}}
            for s, r in zip(seeds, reports, strict=False)
        ],
        "store_growth": [
            {"experiments": k, "best@8": averaged(rs)["best@8"], "auc": averaged(rs)["auc"]} for k, rs in growth.items()
        ],
        "baseline_majority_vote": {
            "best@8": vote_figures["best@8"],
            "curve": vote_curve,
            "ratio_best_to_vote_at_8": ratio(figures["best@8"], vote_figures["best@8"]),
        },
        "baseline_untrained": {"models": len(control), **{k: averaged(control)[k] for k in ("auc", "best@8", "ece")}},
        "ablation_bce_only": {k: averaged(bce)[k] for k in ("auc", "best@8", "ece")},
        "seconds": round(time.perf_counter() - start, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..n-1")
    parser.add_argument("--tasks", type=int, default=24, help="tasks per historical experiment (8 rollouts each)")
    parser.add_argument("--eval-tasks", type=int, default=128, help="held-out tasks (8 fresh candidates each)")
    parser.add_argument("--epochs", type=int, default=30, help="rounds over the store")
    parser.add_argument("--plot", default="", help="write the best@N curve as a PNG to this path")
    parser.add_argument("--quick", action="store_true", help="1 seed at tiny sizes (the smoke test)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    print(json.dumps(main(parser.parse_args())))
