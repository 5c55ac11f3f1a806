"""Rubric-based process reward mixing (docs/training.md §2.5): R' = R_bin + alpha · J with alpha = 0.5 and J in [0, 1]
the judge's aggregate score, then GRPO advantages over the mixed rewards. J spreads rewards inside groups that
are all resolved or all failed, so those groups keep a learning signal. The judge itself (rubric, rendering,
snapping) is the reward service's; this module only mixes its score in.

Outcome rewards R_bin: resolved +1, submitted but unresolved `unresolved_reward` (-1; 0 in the OPD run),
truncated -1. With alpha < 2 the resolved range [1, 1 + alpha] stays above the others.

Choices [I]:
- A missing judge score (alpha = 0, judge error, unparsable output) falls back to R' = R_bin.
- J is clamped to [0, 1] again here, so a misbehaving judge cannot break the outcome ordering.
- An ERROR outcome (grading failed) has no reward: it is masked out of training, never scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from orchard.trainers.rl import grpo_advantages
from orchard.types.v1 import types_pb2 as tpb

ALPHA = 0.5
UNRESOLVED_REWARD = -1.0


def outcome_reward(status: int, unresolved_reward: float = UNRESOLVED_REWARD) -> float:
    """R_bin of a types.v1 OutcomeStatus."""
    if status == tpb.OUTCOME_STATUS_RESOLVED:
        return 1.0
    if status == tpb.OUTCOME_STATUS_UNRESOLVED:
        return unresolved_reward
    if status == tpb.OUTCOME_STATUS_TRUNCATED:
        return -1.0
    raise ValueError(
        f"outcome status {tpb.OutcomeStatus.Name(status)} has no reward; mask the trajectory out of training instead"
    )


def mix(r_bin: float, judge_score: float | None, alpha: float = ALPHA) -> float:
    """R' = R_bin + alpha · J; R_bin alone when there is no judge score or alpha is 0."""
    if not 0 <= alpha < 2:
        raise ValueError(f"alpha must be in [0, 2) to keep resolved rewards above the others, got {alpha}")
    if judge_score is None or alpha == 0:
        return r_bin
    return r_bin + alpha * min(1.0, max(0.0, judge_score))


def group_rewards(
    statuses: Sequence[int],
    judge_scores: Sequence[float | None],
    alpha: float = ALPHA,
    unresolved_reward: float = UNRESOLVED_REWARD,
) -> torch.Tensor:
    """The mixed rewards R' of one group, [G]."""
    return torch.tensor(
        [mix(outcome_reward(s, unresolved_reward), j, alpha) for s, j in zip(statuses, judge_scores, strict=True)],
        dtype=torch.double,
    )


def rpr_advantages(
    statuses: Sequence[int],
    judge_scores: Sequence[float | None],
    alpha: float = ALPHA,
    unresolved_reward: float = UNRESOLVED_REWARD,
) -> torch.Tensor:
    """GRPO advantages of one group over the mixed rewards, [G]."""
    return grpo_advantages(group_rewards(statuses, judge_scores, alpha, unresolved_reward))
