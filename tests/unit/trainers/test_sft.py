"""SFT samples, truncation, packing and the masked loss (docs/training.md §2.1)."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import make_trajectory, tiny_lm

from orchard.trainers.sft import Sample, from_trajectory, pack, per_turn, sft_loss, token_logprobs, truncate_left

TRAJ = make_trajectory([1, 2, 3], [([10, 11], [20, 21, 22]), ([12], [23]), ([13, 14], [])])


def test_trajectory_mask_is_one_exactly_on_model_tokens() -> None:
    sample = from_trajectory(TRAJ)
    assert sample.token_ids == [1, 2, 3, 10, 11, 20, 21, 22, 12, 23, 13, 14]
    assert sample.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 1]


def test_trajectory_mask_keeps_only_the_given_steps() -> None:
    assert from_trajectory(TRAJ, trained_steps=[1]).loss_mask == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
    assert not any(from_trajectory(TRAJ, trained_steps=[]).loss_mask)


def test_per_turn_samples_train_each_output_on_its_own_context() -> None:
    samples = per_turn(TRAJ)
    assert [s.token_ids for s in samples] == [
        [1, 2, 3, 10, 11],
        [1, 2, 3, 10, 11, 20, 21, 22, 12],
        [1, 2, 3, 10, 11, 20, 21, 22, 12, 23, 13, 14],
    ]
    assert [sum(s.loss_mask) for s in samples] == [2, 1, 2]
    assert samples[1].loss_mask == [0] * 8 + [1]


def test_truncate_left_keeps_the_end_and_untrains_the_first_token() -> None:
    sample = Sample([1, 2, 3, 4, 5], [0, 1, 1, 0, 1])
    assert truncate_left(sample, 3) == Sample([3, 4, 5], [0, 0, 1])
    assert truncate_left(sample, 5) is sample


def test_pack_first_fit_decreasing_with_position_resets() -> None:
    samples = [Sample([1, 2], [0, 1]), Sample([3, 4, 5, 6], [1, 1, 0, 1]), Sample([7, 8, 9], [0, 1, 1])]
    packed = pack(samples, seq_len=6, pad_id=0)
    # longest first: row 0 = [3,4,5,6] + [1,2]; row 1 = [7,8,9] + padding
    assert packed.input_ids.tolist() == [[3, 4, 5, 6, 1, 2], [7, 8, 9, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 1, 2]]
    assert packed.seq_ids.tolist() == [[0, 0, 0, 0, 1, 1], [0, 0, 0, -1, -1, -1]]
    # each sample's first token is never trained (nothing of its own precedes it)
    assert packed.loss_mask.tolist() == [[0, 1, 0, 1, 0, 1], [0, 1, 1, 0, 0, 0]]


def test_attention_mask_is_block_diagonal_causal() -> None:
    packed = pack([Sample([1, 2], [0, 1]), Sample([3], [0])], seq_len=4)
    assert packed.attention_mask()[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]


def test_pack_rejects_samples_longer_than_a_row() -> None:
    with pytest.raises(ValueError, match="truncate_left"):
        pack([Sample([1] * 5, [0] * 5)], seq_len=4)


def test_packed_logits_equal_each_sample_run_alone() -> None:
    model = tiny_lm().eval()
    samples = [Sample([5, 6, 7, 8, 9], [0] * 5), Sample([10, 11, 12], [0] * 3), Sample([3, 4], [0] * 2)]
    packed = pack(samples, seq_len=12)
    with torch.no_grad():
        logits = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=packed.attention_mask()
        ).logits
        for j, sample in enumerate(samples):
            where = packed.seq_ids[0] == j
            alone = model(input_ids=torch.tensor([sample.token_ids])).logits[0]
            assert torch.allclose(logits[0][where], alone, atol=1e-5)


def test_token_logprobs_align_with_the_predicted_token() -> None:
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # after token 0, token 2 has p = 3/6
    lp = token_logprobs(logits, torch.tensor([[1, 2, 0]]))
    assert lp[0].tolist() == pytest.approx([0.0, math.log(0.5), math.log(0.25)])


def test_sft_loss_is_the_mean_over_trained_tokens() -> None:
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -3.0], [-4.0, -5.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    loss = sft_loss(logprobs, mask)
    assert loss.item() == pytest.approx((1 + 3 + 5) / 3)
    loss.backward()
    assert logprobs.grad is not None
    assert (logprobs.grad == -mask / 3).all()


def test_sft_loss_with_an_empty_mask_is_zero_without_gradient() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss = sft_loss(logprobs, torch.zeros(1, 2))
    loss.backward()
    assert logprobs.grad is not None
    assert loss.item() == 0.0 and (logprobs.grad == 0).all()
