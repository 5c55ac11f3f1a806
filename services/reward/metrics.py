"""The reward service's Prometheus metrics: the judge's per-criterion scores and what its test-evidence guards did,
so a batch of agents that run tests without checking anything shows (many test runs, low R4/R5 means)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from orchard.services.reward.guards import Guarded

JUDGE_SCORE = Histogram(
    "orchard_reward_judge_score",
    "Judge scores after the guards, by rubric and criterion (J for the aggregate); the mean is _sum / _count.",
    ["rubric", "criterion"],
    buckets=tuple(i / 10 for i in range(11)),
)
JUDGED = Counter(
    "orchard_reward_judged_trajectories",
    "Trajectories the judge scored, by rubric and whether any step ran a test (unknown: unguarded).",
    ["rubric", "ran_tests"],
)
GUARD_ADJUSTMENTS = Counter(
    "orchard_reward_judge_guard_adjustments",
    "Scores the test-evidence guards lowered, by rubric and criterion (J for the cap).",
    ["rubric", "criterion"],
)


def observe_judged(rubric: str, guarded: Guarded) -> None:
    """Record one judged trajectory: its scores, whether it ran a test, and what the guards lowered."""
    for criterion, score in guarded.scores.items():
        JUDGE_SCORE.labels(rubric, criterion).observe(score)
    JUDGE_SCORE.labels(rubric, "J").observe(guarded.judge_score)
    JUDGED.labels(rubric, "unknown" if guarded.ran_tests is None else str(guarded.ran_tests).lower()).inc()
    for criterion, _ in guarded.adjustments:
        GUARD_ADJUSTMENTS.labels(rubric, criterion).inc()
