"""Rubric-based process reward mixing (docs/training.md §2.5): R' = R_bin + alpha * J and its GRPO advantages."""

from __future__ import annotations

import pytest

from orchard.trainers.rpr import group_rewards, mix, outcome_reward, rpr_advantages
from orchard.types.v1 import types_pb2 as tpb

RESOLVED, UNRESOLVED, TRUNCATED = (
    tpb.OUTCOME_STATUS_RESOLVED,
    tpb.OUTCOME_STATUS_UNRESOLVED,
    tpb.OUTCOME_STATUS_TRUNCATED,
)


@pytest.mark.parametrize(
    ("status", "judge", "alpha", "expected"),
    [
        (RESOLVED, 0.8, 0.5, 1.4),
        (RESOLVED, 0.0, 0.5, 1.0),
        (UNRESOLVED, 0.6, 0.5, -0.7),
        (TRUNCATED, 1.0, 0.5, -0.5),
        (RESOLVED, 0.8, 0.0, 1.0),  # alpha = 0: outcome only
        (UNRESOLVED, None, 0.5, -1.0),  # judge failed: fall back to R_bin
        (UNRESOLVED, 1.7, 0.5, -0.5),  # J clamped to [0, 1]
    ],
)
def test_mixing_table(status: int, judge: float | None, alpha: float, expected: float) -> None:
    assert mix(outcome_reward(status), judge, alpha) == pytest.approx(expected)


def test_unresolved_reward_is_configurable_and_errors_have_no_reward() -> None:
    assert outcome_reward(UNRESOLVED, unresolved_reward=0.0) == 0.0
    assert outcome_reward(TRUNCATED, unresolved_reward=0.0) == -1.0
    with pytest.raises(ValueError, match="mask the trajectory out"):
        outcome_reward(tpb.OUTCOME_STATUS_ERROR)
    with pytest.raises(ValueError, match="alpha"):
        mix(1.0, 0.5, alpha=2.0)


def test_outcome_ordering_is_preserved_for_alpha_under_two() -> None:
    worst_resolved = mix(1.0, 0.0, 1.99)
    best_other = max(mix(outcome_reward(s), 1.0, 1.99) for s in (UNRESOLVED, TRUNCATED))
    assert worst_resolved > best_other


WEIGHTS = {"R1": 0.15, "R2": 0.18, "R3": 0.12, "R4": 0.15, "R5": 0.14, "R6": 0.12, "R7": 0.14}


def mock_judge(actions: list[str]) -> float:
    """A deterministic rule-based judge of a ToyRepair action list (stands in for the LLM judge)."""
    ran_tests = [i for i, a in enumerate(actions) if a == "run_tests"]
    edits = [i for i, a in enumerate(actions) if a.startswith("edit")]
    scores = {
        "R1": 1.0 if len(edits) == 1 else 0.5 if edits else 0.0,
        "R2": 1.0 if ran_tests and edits and ran_tests[0] < edits[0] else 0.0,  # repro, then an edit
        "R3": 0.0,
        "R4": 1.0 if ran_tests and edits and ran_tests[-1] > edits[-1] else 0.0,  # re-ran after editing
        "R5": 0.5 if ran_tests else 0.0,
        "R6": 1.0 if len(ran_tests) >= 2 else 0.0,
        "R7": 1.0 if actions[-1] == "submit" and ran_tests and edits and ran_tests[-1] > edits[-1] else 0.0,
    }
    return sum(WEIGHTS[k] * v for k, v in scores.items())


FAILED_GROUP = [
    ["ls", "cat a.py", "run_tests", "edit a.py x y", "run_tests", "submit"],  # careful but wrong fix
    ["ls", "edit a.py x y", "submit"],  # blind edit
    ["cat a.py", "edit a.py x y", "edit a.py y z", "run_tests", "submit"],
    ["ls", "ls", "ls", "ls", "ls", "ls", "ls", "ls"],  # truncated
]
STATUSES = [UNRESOLVED, UNRESOLVED, UNRESOLVED, TRUNCATED]


def test_judge_spreads_an_all_failed_group() -> None:
    scores = [mock_judge(a) for a in FAILED_GROUP]
    assert scores == pytest.approx([0.15 + 0.18 + 0.15 + 0.07 + 0.12 + 0.14, 0.15, 0.075 + 0.15 + 0.07 + 0.14, 0.0])
    assert rpr_advantages(STATUSES, scores, alpha=0.0).abs().max().item() == 0.0  # outcome only: no signal
    adv = rpr_advantages(STATUSES, scores)
    assert adv.var().item() > 0
    assert adv.argmax().item() == 0 and adv.argmin().item() == 3  # the best-verified attempt gets the credit
    assert group_rewards(STATUSES, scores).tolist() == pytest.approx([-1 + 0.5 * s for s in scores])
