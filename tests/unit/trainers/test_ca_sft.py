"""Credit-assignment SFT (docs/training.md §2.2): rise segments, interpolation, masks and annotation parsing."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_helpers import make_trajectory, tiny_lm

from orchard.trainers.ca_sft import (
    KeyStep,
    annotate_values,
    annotation_prompt,
    ca_sample,
    credits,
    extract_rise_segments,
    interpolate,
    parse_key_steps,
    trained_steps,
)
from orchard.trainers.sft import from_trajectory, sft_loss, token_logprobs
from orchard.types.v1 import types_pb2 as tpb


@pytest.mark.parametrize(
    ("values", "segments"),
    [
        ([0.3] * 6, []),  # flat
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], [(0, 5)]),  # monotonic +0.1: one full segment
        ([0.0, 0.04, 0.08, 0.12, 0.16], []),  # +0.04 noise is under epsilon
        ([0.10, 0.15, 0.20], [(0, 2)]),  # exactly +0.05 is included (>=)
        ([0.0, 0.2, 0.2, 0.2, 0.5, 0.6, 0.6], [(0, 1), (3, 5)]),  # two separated rises
        ([0.2, 0.4, 0.6, 0.8, 0.6, 0.3, 0.1], [(0, 3)]),  # inverted U: only the rising prefix
        ([0.5, 0.4, 0.6], [(1, 2)]),
        ([0.5], []),
        ([], []),
    ],
)
def test_extract_rise_segments(values: list[float], segments: list[tuple[int, int]]) -> None:
    assert extract_rise_segments(values) == segments


def test_merge_gap_joins_close_segments_only() -> None:
    values = [0.0, 0.2, 0.2, 0.4, 0.4, 0.4, 0.6]  # rises [0,1], [2,3], [5,6]
    assert extract_rise_segments(values) == [(0, 1), (2, 3), (5, 6)]
    assert extract_rise_segments(values, merge_gap=1) == [(0, 3), (5, 6)]
    assert extract_rise_segments(values, merge_gap=2) == [(0, 6)]


def test_credits_and_trained_steps() -> None:
    assert credits([0.0, 0.5, 0.25]) == [0.5, -0.25]
    assert trained_steps([(0, 2), (4, 5)]) == [0, 1, 4]


def test_interpolation_keeps_key_values_and_is_piecewise_linear() -> None:
    curve = interpolate([KeyStep(1, 0.2), KeyStep(5, 1.0), KeyStep(7, 0.0)], n_states=9)
    assert curve == pytest.approx([0.2, 0.2, 0.4, 0.6, 0.8, 1.0, 0.5, 0.0, 0.0])
    assert (curve[1], curve[5], curve[7]) == (0.2, 1.0, 0.0)  # exact at key steps


def test_interpolation_errors() -> None:
    with pytest.raises(ValueError, match="without any key step"):
        interpolate([], 3)
    with pytest.raises(ValueError, match=r"\[0, 2\]"):
        interpolate([KeyStep(3, 0.5)], 3)


TRAJ = make_trajectory([1, 2], [([10, 11], [20]), ([12], [21, 22]), ([13], [23]), ([14, 15], [24])])


def test_resolved_trajectory_trains_every_assistant_token() -> None:
    sample = ca_sample(TRAJ, resolved=True, segments=[])
    assert sample == from_trajectory(TRAJ)
    assert sample.loss_mask == [0, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0]


def test_unresolved_mask_is_one_exactly_on_segment_actions_and_cut_after_the_last() -> None:
    # segment [1, 3] trains a_1 and a_2; a_3 and every tool token stay 0; the sample ends after a_2
    sample = ca_sample(TRAJ, resolved=False, segments=[(1, 3)])
    assert sample.token_ids == [1, 2, 10, 11, 20, 12, 21, 22, 13]
    assert sample.loss_mask == [0, 0, 0, 0, 0, 1, 0, 0, 1]


def test_unresolved_without_segments_gives_no_sample() -> None:
    assert ca_sample(TRAJ, resolved=False, segments=[]) is None


def test_loss_ignores_logits_at_masked_positions() -> None:
    """Gradient isolation: perturbing the logits that predict masked tokens leaves the loss unchanged."""
    sample = ca_sample(TRAJ, resolved=False, segments=[(1, 3)])
    ids, mask = torch.tensor([sample.token_ids]), torch.tensor([sample.loss_mask], dtype=torch.float)
    model = tiny_lm(vocab=64)
    logits = model(input_ids=ids).logits.detach().requires_grad_(True)
    loss = sft_loss(token_logprobs(logits, ids), mask)
    loss.backward()
    predicts_masked = torch.cat([mask[0, 1:], torch.zeros(1)]) == 0  # logits at t predict token t + 1
    assert (logits.grad[0, predicts_masked] == 0).all()
    assert (logits.grad[0, ~predicts_masked] != 0).any()
    perturbed = logits.detach().clone()
    perturbed[0, predicts_masked] += 10 * torch.randn(int(predicts_masked.sum()), 64)
    assert sft_loss(token_logprobs(perturbed, ids), mask).item() == pytest.approx(loss.item(), abs=1e-6)


def test_parse_key_steps_clamps_and_drops_out_of_range() -> None:
    text = (
        'Here: {"key_steps": [{"step": 0, "value": 0.1}, {"step": 2, "value": 1.4, "why": "w"}, '
        '{"step": 9, "value": 0.5}]} done'
    )
    assert parse_key_steps(text, n_states=4) == [KeyStep(0, 0.1), KeyStep(2, 1.0, "w")]
    with pytest.raises(ValueError, match="no JSON"):
        parse_key_steps("no idea", 4)


async def test_annotate_values_builds_the_curve_from_the_teachers_key_steps() -> None:
    """The teacher is a fixed reply here: the inference service is not part of a unit test."""
    traj = make_trajectory([1], [([2], [3]), ([4], [5]), ([6], [])])
    traj.messages.add(role=tpb.ROLE_USER, content="fix the bug")
    seen: list[list[tpb.Message]] = []

    async def teacher(messages: list[tpb.Message]) -> str:
        seen.append(messages)
        return json.dumps({"key_steps": [{"step": 0, "value": 0.2}, {"step": 2, "value": 0.6}]})

    assert await annotate_values(traj, False, teacher) == pytest.approx([0.2, 0.4, 0.6, 0.6])
    assert seen[0] == annotation_prompt(traj, False)
    assert "NOT resolved" in seen[0][1].content and "T = 3" in seen[0][1].content
