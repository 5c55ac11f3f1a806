"""GRPO advantages and the asymmetric-clip policy loss (docs/training.md §2.3)."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import tiny_lm

from orchard.trainers.rl import Aggregation, group_advantages, grpo_advantages, policy_loss, scale_negative
from orchard.trainers.sft import token_logprobs


@pytest.mark.parametrize(
    ("rewards", "expected"),
    [
        ([1.0, -1.0, -1.0, -1.0], [1.5, -0.5, -0.5, -0.5]),  # mean -0.5, sample std 1
        ([1.0, 0.0, 1.0, 0.0], [math.sqrt(0.75), -math.sqrt(0.75), math.sqrt(0.75), -math.sqrt(0.75)]),
        ([2.0, 4.0], [-math.sqrt(0.5), math.sqrt(0.5)]),
        ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]),  # all equal: no signal
        ([-1.0] * 8, [0.0] * 8),
        ([0.7], [0.0]),  # a group of one
    ],
)
def test_grpo_advantages(rewards: list[float], expected: list[float]) -> None:
    assert grpo_advantages(torch.tensor(rewards)).tolist() == pytest.approx(expected)


def test_group_advantages_normalise_within_each_group() -> None:
    adv = group_advantages(torch.tensor([1.0, -1.0, 5.0, 5.0, 3.0, 1.0]), ["a", "a", "b", "b", "c", "c"])
    s = math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([s, -s, 0.0, 0.0, s, -s])


# (advantage, ratio) -> (token loss, whether the gradient flows)
CASES = [
    (1.0, 1.5, -1.28, False),  # positive advantage, ratio above 1 + eps_high: clipped
    (1.0, 1.1, -1.1, True),
    (1.0, 0.5, -0.5, True),  # positive advantage never clips below
    (-1.0, 0.5, 0.8, False),  # negative advantage, ratio under 1 - eps_low: clipped
    (-1.0, 0.9, 0.9, True),
    (-1.0, 1.5, 1.5, True),  # negative advantage never clips above
    (2.0, 1.28, -2.56, None),  # exactly on the boundary
    (0.0, 3.0, 0.0, False),
]


def test_scale_negative_scales_only_the_worse_rollouts() -> None:
    advantages = group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), ["g"] * 4)
    assert scale_negative(advantages, 1.0).tolist() == advantages.tolist()
    assert scale_negative(advantages, 0.0).tolist() == [1.5, 0.0, 0.0, 0.0]
    assert scale_negative(advantages, 0.5).tolist() == [1.5, -0.25, -0.25, -0.25]


@pytest.mark.parametrize(("adv", "ratio", "loss", "flows"), CASES)
def test_policy_loss_asymmetric_clipping(adv: float, ratio: float, loss: float, flows: bool | None) -> None:
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    value, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1))
    assert value.item() == pytest.approx(loss, rel=1e-6)
    value.backward()
    assert logp.grad is not None
    if flows is not None:
        assert (logp.grad.abs() > 0).item() == flows


def test_token_mean_and_sequence_mean_aggregation() -> None:
    logp = torch.zeros(2, 4)  # ratio 1: token loss = -A
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    token, _ = policy_loss(logp, logp, adv, mask)
    seq, _ = policy_loss(logp, logp, adv, mask, aggregation=Aggregation.SEQUENCE_MEAN)
    assert token.item() == pytest.approx((-1 * 3 + 2 * 1) / 4)
    assert seq.item() == pytest.approx((-1 + 2) / 2)


def test_masked_tokens_get_no_gradient_and_stats_count_clips() -> None:
    logp = torch.log(torch.tensor([[1.5, 1.0, 1.0]])).requires_grad_(True)
    loss, stats = policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.tensor([[1.0, 1.0, 0.0]]))
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5, 0.0])
    assert stats.clip_fraction == 0.5 and stats.mean_ratio == pytest.approx(1.25)


def test_empty_mask_gives_zero_loss() -> None:
    loss, stats = policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([1.0]), torch.zeros(1, 2))
    assert loss.item() == 0.0 and stats.clip_fraction == 0.0


def test_one_grpo_step_moves_probability_towards_the_better_sample() -> None:
    model = tiny_lm()
    seqs = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10], [1, 11, 12, 13]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]] * 3)
    adv = grpo_advantages(torch.tensor([1.0, -1.0, -1.0]))
    with torch.no_grad():
        old = token_logprobs(model(input_ids=seqs).logits, seqs)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss, _ = policy_loss(token_logprobs(model(input_ids=seqs).logits, seqs), old, adv, mask)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        new = token_logprobs(model(input_ids=seqs).logits, seqs)
    delta = ((new - old) * mask).sum(-1)
    assert delta[0] > 0 and delta[1] < 0 and delta[2] < 0
