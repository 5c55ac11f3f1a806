"""The value model's loss (docs/training.md §2.6): BCE on the outcome plus beta times a logistic ranking loss over every
within-task (resolved, unresolved) pair, so the score ranks a task's candidates and not only tasks."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def value_loss(
    logits: torch.Tensor, resolved: Sequence[bool], task_ids: Sequence[str], pairwise_weight: float = 1.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, parts): mean BCE plus pairwise_weight x the mean of log(1 + exp(-(s+ - s-))) over the batch's
    within-task pairs (no pair term when the batch has none)."""
    labels = torch.tensor([float(y) for y in resolved], dtype=logits.dtype)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    task = torch.tensor([hash(t) for t in task_ids])
    positive = labels.bool()
    # pairs[i, j]: i resolved, j not, same task.
    pairs = (task[:, None] == task[None, :]) & positive[:, None] & ~positive[None, :]
    pos, neg = pairs.nonzero(as_tuple=True)
    if len(pos):
        pairwise = torch.nn.functional.softplus(-(logits[pos] - logits[neg])).mean()
    else:
        pairwise = logits.sum() * 0.0
    loss = bce + pairwise_weight * pairwise
    return loss, {"bce": float(bce.detach()), "pairwise": float(pairwise.detach()), "pairs": float(len(pos))}
