"""`orchard learn`'s report without a stack: pass@1 per part from a rollout report, the reranked picks, the RL job's
figures, the table and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchard.cli.learn import RUN_ID, format_table, pass_at_1, picked, plot, rl_summary

ROLLOUT_REPORT = {
    "tasks": [
        {"instance_id": "a", "samples": 4, "resolved": 4},
        {"instance_id": "b", "samples": 4, "resolved": 1},
        {"instance_id": "c", "samples": 4, "resolved": 0},
    ]
}
RL_REPORT = {
    "job_id": "x-rl",
    "per_step": [
        {"step": 1, "reward_mean": -0.5, "groups_kept_fraction": 0.5, "advantage_abs_mean": 0.8, "kl": 0.01},
        {"step": 2, "reward_mean": 0.25, "groups_kept_fraction": 1.0, "advantage_abs_mean": 0.6, "kl": 0.02},
    ],
}


def test_pass_at_1_is_the_mean_over_the_tasks_asked_for() -> None:
    assert pass_at_1(ROLLOUT_REPORT, ["a", "b"]) == pytest.approx(0.625)
    assert pass_at_1(ROLLOUT_REPORT, ["c"]) == 0.0
    assert pass_at_1(ROLLOUT_REPORT, ["z"]) is None


def test_picked_counts_resolved_picks() -> None:
    best_of = {"picks": [{"task_id": "a", "resolved": True}, {"task_id": "b", "resolved": False}]}
    assert picked(best_of, ["a", "b"]) == 0.5 and picked(best_of, ["a"]) == 1.0 and picked(best_of, []) is None


def _report() -> dict[str, Any]:
    stages = [
        {"stage": "base", "what": "the served policy", "train": 0.0, "held_out": 0.0},
        {"stage": "distilled", "what": "SFT", "train": 0.5, "held_out": 0.0},
        {"stage": "best-of-4", "what": "picks", "train": 0.75, "held_out": None},
    ]
    return {
        "tasks": "toyrepair",
        "train_ids": ["a", "b"],
        "held_out_ids": ["c"],
        "samples": 4,
        "seconds": 90.0,
        "stages": stages,
        "rl": rl_summary(RL_REPORT),
    }


def test_rl_summary_and_table() -> None:
    rl = rl_summary(RL_REPORT)
    assert rl["reward_per_step"] == [-0.5, 0.25] and rl["groups_kept_per_step"] == [0.5, 1.0]
    assert rl["logprob_diff_max"] == 0.0  # no step reported one
    lines = format_table(_report()).splitlines()
    assert lines[0] == "learning on toyrepair: 2 training tasks, 1 held out, pass@1 of 4 samples per task (1.5 min)"
    assert lines[1].split() == ["STAGE", "TRAIN", "HELD-OUT", "WHAT"]
    assert lines[3].split()[:3] == ["distilled", "0.500", "0.000"] and lines[4].split()[:3] == [
        "best-of-4",
        "0.750",
        "-",
    ]
    assert lines[5].startswith("RL job x-rl: reward per step -0.50 +0.25; groups kept 0.75, |advantage| 0.70")


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (installed by scripts/install.sh)")
    assert plot(_report(), tmp_path / "l.png") and (tmp_path / "l.png").stat().st_size > 1000


@pytest.mark.parametrize(("run_id", "ok"), [("main-1", True), ("Main", False), ("-x", False), ("a" * 51, False)])
def test_run_ids_make_valid_job_ids(run_id: str, ok: bool) -> None:
    assert bool(RUN_ID.match(run_id)) == ok
