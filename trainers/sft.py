"""SFT on trajectories (docs/training.md §2.1): samples with a loss mask on assistant tokens only, left truncation that
keeps the end, and packing of several samples into fixed-length rows.

Choices [I]:
- Packing isolates sequences *both* ways: position ids restart at 0 for every sample, and `attention_mask()`
  gives a block-diagonal causal mask (a token sees only earlier tokens of its own sample). Pass both to the
  model (HF models take the 4-D boolean mask with the sdpa attention; eager ignores it). A packed sample's
  logits then equal those of the sample run alone.
- Rows are filled first-fit decreasing (longest sample first, into the first row with room); deterministic.
- The first token of every sample (after truncation too) has no context to be predicted from, so its mask
  is forced to 0.
- The loss is the mean over every trained token of the batch (no per-sample 1/T_i weight).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from orchard.types.v1 import types_pb2 as tpb


@dataclass(frozen=True)
class Sample:
    """One training sequence: token ids and a parallel loss mask (1 = trained assistant token)."""

    token_ids: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask):
            raise ValueError(f"sample has {len(self.token_ids)} tokens but {len(self.loss_mask)} mask entries")


def _span(span: tpb.TokenSpan, trained: bool) -> tuple[list[int], list[int]]:
    ids = list(span.token_ids)
    mask = list(span.mask) if trained and span.mask else [0] * len(ids)
    return ids, mask


def from_trajectory(traj: tpb.Trajectory, trained_steps: Iterable[int] | None = None) -> Sample:
    """The whole token sequence of a trajectory; the mask keeps the model tokens of `trained_steps` (all when
    None) and is 0 on prompt, tool and observation tokens."""
    keep = None if trained_steps is None else set(trained_steps)
    ids, mask = _span(traj.prompt_tokens, False)
    for step in traj.steps:
        step_ids, step_mask = _span(step.tokens, keep is None or step.index in keep)
        ids += step_ids
        mask += step_mask
    return Sample(ids, mask)


def per_turn(traj: tpb.Trajectory) -> list[Sample]:
    """One sample per model call: the context that call saw (mask 0), then its output (mask 1)."""
    ids, _ = _span(traj.prompt_tokens, False)
    samples = []
    for step in traj.steps:
        step_ids, step_mask = _span(step.tokens, True)
        n_out = sum(step_mask)  # the sampled tokens come first in a step's span
        samples.append(Sample(ids + step_ids[:n_out], [0] * len(ids) + step_mask[:n_out]))
        ids = ids + step_ids
    return samples


def truncate_left(sample: Sample, max_len: int) -> Sample:
    """The last `max_len` tokens (the oldest are dropped, so the trained end stays); first token untrained."""
    if len(sample.token_ids) <= max_len:
        return sample
    ids, mask = sample.token_ids[-max_len:], sample.loss_mask[-max_len:]
    return Sample(ids, [0, *mask[1:]])


@dataclass(frozen=True)
class Packed:
    """Samples packed into rows of `seq_len` tokens; every tensor is [rows, seq_len]."""

    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    """1.0 where a token is trained (predicted from the tokens before it in its own sample)."""
    position_ids: torch.Tensor
    """Positions restart at 0 for each sample; padding continues from 0 too."""
    seq_ids: torch.Tensor
    """Which sample of the row a token belongs to (0, 1, ...); -1 for padding."""

    def attention_mask(self) -> torch.Tensor:
        """The block-diagonal causal mask, [rows, 1, seq_len, seq_len], True where attention is allowed."""
        length = self.seq_ids.shape[1]
        causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
        same = self.seq_ids[:, :, None] == self.seq_ids[:, None, :]
        return (causal & same)[:, None]


def pack(samples: Sequence[Sample], seq_len: int, pad_id: int = 0) -> Packed:
    """Packs samples into as few rows as first-fit decreasing finds; each must already fit `seq_len`."""
    for i, s in enumerate(samples):
        if not 0 < len(s.token_ids) <= seq_len:
            raise ValueError(
                f"sample {i} has {len(s.token_ids)} tokens; it must have 1 to {seq_len} (truncate_left it first)"
            )
    rows: list[list[int]] = []  # sample indices per row
    room: list[int] = []
    for i in sorted(range(len(samples)), key=lambda k: -len(samples[k].token_ids)):
        n = len(samples[i].token_ids)
        row = next((r for r, free in enumerate(room) if free >= n), None)
        if row is None:
            rows.append([])
            room.append(seq_len)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= n
    shape = (len(rows), seq_len)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    loss_mask = torch.zeros(shape)
    position_ids = torch.zeros(shape, dtype=torch.long)
    seq_ids = torch.full(shape, -1, dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for j, i in enumerate(members):
            s, n = samples[i], len(samples[i].token_ids)
            input_ids[r, at : at + n] = torch.tensor(s.token_ids)
            loss_mask[r, at : at + n] = torch.tensor([0, *s.loss_mask[1:]], dtype=torch.float)
            position_ids[r, at : at + n] = torch.arange(n)
            seq_ids[r, at : at + n] = j
            at += n
        position_ids[r, at:] = torch.arange(seq_len - at)
    return Packed(input_ids, loss_mask, position_ids, seq_ids)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(x_t | x_<t) for every position t, [B, L]; position 0 (no context) gets 0."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))


def masked_token_logprobs(model: Any, input_ids: torch.Tensor, mask: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """token_logprobs where mask is 1 (0 elsewhere), [B, L], from the model's forward with `inputs`. Only the
    positions that predict a masked token go through the output layer: most of an agent trajectory is prompt and
    observations, and projecting every position onto a 49K vocabulary would dominate a small model's step."""
    wanted = mask > 0
    keep = torch.zeros_like(wanted)
    keep[:, :-1] = wanted[:, 1:]
    logits = model(input_ids=input_ids, logits_to_keep=keep, use_cache=False, **inputs).logits
    logp = torch.log_softmax(logits.float(), -1).gather(-1, input_ids[wanted][:, None])[:, 0]
    return torch.zeros(mask.shape, dtype=logp.dtype).masked_scatter(wanted, logp)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of `values` over mask-1 entries; 0 (still differentiable) when the mask is empty."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def sft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Negative log-likelihood averaged over every trained token of the batch."""
    return -masked_mean(logprobs, loss_mask)
