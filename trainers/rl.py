"""GRPO-style policy gradient (docs/training.md §2.3): group-relative advantages A_i = (r_i - mean(r)) / std(r),
broadcast to every assistant token of trajectory i, and the PPO clipped loss with asymmetric clipping
(eps_low 0.2, eps_high 0.28, no KL term), aggregated as the mean over every assistant token of the batch.

Choices [I]:
- std is the sample (unbiased, n - 1) standard deviation, as torch.std and the GRPO reference code use;
  a group of one, or one whose std is below 1e-8, gets zero advantages (no signal, no division by ~0).
- The per-token loss is max(-A·ratio, -A·clip(ratio, 1 - eps_low, 1 + eps_high)) with
  ratio = exp(logp - old_logp); tokens with mask 0 (prompt, tool, observation) contribute nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

from orchard.trainers.sft import masked_mean

CLIP_LOW, CLIP_HIGH = 0.2, 0.28
STD_FLOOR = 1e-8


class Aggregation(StrEnum):
    """How per-token losses become the batch loss."""

    TOKEN_MEAN = "token_mean"
    """The mean over every assistant token of the batch (no per-trajectory 1/T_i weight)."""
    SEQUENCE_MEAN = "sequence_mean"
    """The mean over each trajectory's tokens, then over trajectories."""


def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(r - mean) / std over one group's rewards, [G]; zeros when the group has no spread."""
    rewards = rewards.double()
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    std = rewards.std()
    if std < STD_FLOOR:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / std


def group_advantages(rewards: torch.Tensor, group_ids: list[str]) -> torch.Tensor:
    """GRPO advantages of a batch, each trajectory normalised within its group, [B]."""
    out = torch.zeros(len(group_ids), dtype=torch.double)
    for gid in dict.fromkeys(group_ids):
        idx = torch.tensor([i for i, g in enumerate(group_ids) if g == gid])
        out[idx] = grpo_advantages(rewards[idx])
    return out


def scale_negative(advantages: torch.Tensor, scale: float) -> torch.Tensor:
    """The advantages with the negative ones multiplied by `scale` (1: unchanged; 0: only the rollouts better than
    their group's mean train)."""
    return torch.where(advantages < 0, advantages * scale, advantages)


@dataclass(frozen=True)
class LossStats:
    """What a loss step reports, for logging."""

    clip_fraction: float
    """The fraction of assistant tokens whose ratio was clipped (the gradient is then 0)."""
    mean_ratio: float


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation = Aggregation.TOKEN_MEAN
) -> torch.Tensor:
    """The batch loss from per-token losses [B, L] and the assistant mask [B, L]."""
    if aggregation == Aggregation.TOKEN_MEAN:
        return masked_mean(token_loss, mask)
    per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    has_tokens = (mask.sum(-1) > 0).float()
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = CLIP_LOW,
    clip_high: float = CLIP_HIGH,
    aggregation: Aggregation = Aggregation.TOKEN_MEAN,
) -> tuple[torch.Tensor, LossStats]:
    """The PPO clipped policy-gradient loss with asymmetric clipping.

    Args:
        logprobs: the current policy's log-probs of the sampled tokens, [B, L].
        old_logprobs: the behaviour policy's log-probs, [B, L].
        advantages: per trajectory [B] (broadcast to its tokens) or per token [B, L].
        mask: 1 on assistant tokens, [B, L].
    """
    mask = mask.float()
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    token_loss = torch.maximum(-advantages * ratio, -advantages * clipped)
    loss = aggregate(token_loss, mask, aggregation)
    with torch.no_grad():
        was_clipped = ((-advantages * clipped) > (-advantages * ratio)).float()
        n = mask.sum().clamp(min=1)
        stats = LossStats(
            clip_fraction=float((was_clipped * mask).sum() / n), mean_ratio=float((ratio * mask).sum() / n)
        )
    return loss, stats
