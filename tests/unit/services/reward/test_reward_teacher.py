"""The OPD teacher: the context window, the mask carried through, the OPD value and vocabulary errors. The
teacher model is a scripted fake (scripted_models.py); the integration test scores with the real model."""

from __future__ import annotations

import pytest
from scripted_models import ScriptedModels

from orchard.errors import DeadlineExceeded, FailedPrecondition
from orchard.services.reward.teacher import Teacher, TeacherInput, opd_value, window


@pytest.mark.parametrize(
    ("prompt", "response", "cap", "context", "continuation", "first", "dropped"),
    [
        ([1, 2, 3], [4, 5], 10, [1, 2, 3], [4, 5], 0, 0),
        ([1, 2, 3], [4, 5], 4, [2, 3], [4, 5], 0, 1),
        ([1, 2, 3], [4, 5, 6, 7], 3, [5], [6, 7], 2, 4),  # the whole prompt and one response token dropped
        ([], [4, 5, 6], 10, [4], [5, 6], 1, 0),  # no prompt: the first response token is the context
        ([1], [4], 10, [1], [4], 0, 0),
    ],
)
def test_window_drops_from_the_start(
    prompt: list[int],
    response: list[int],
    cap: int,
    context: list[int],
    continuation: list[int],
    first: int,
    dropped: int,
) -> None:
    w = window(prompt, response, cap)
    assert (w.context, w.continuation, w.first_scored, w.dropped) == (context, continuation, first, dropped)


def test_opd_value() -> None:
    assert opd_value([-1.0, -2.0, -3.0], [-1.5, -1.0, -9.0], [1, 1, 0]) == pytest.approx((0.5 - 1.0) / 2)
    assert opd_value([-1.0], [], [1]) == 0.0
    assert opd_value([-1.0], [-2.0], [0]) == 0.0


def inp(
    prompt: list[int], response: list[int], mask: list[int], student: list[float] | None = None, cap: int = 0
) -> TeacherInput:
    return TeacherInput(
        model="",
        prompt_ids=prompt,
        response_ids=response,
        mask=mask,
        student_logprobs=student or [],
        max_context_tokens=cap,
    )


async def test_scores_the_exact_tokens_and_carries_the_mask() -> None:
    models = ScriptedModels(score_fn=lambda ctx, cont: [-0.1 * t for t in cont])
    reward = await Teacher(models, 4, 10).score(inp([1, 2], [3, 4, 5, 6], [1, 0, 0, 1], [-0.2, 0, 0, -0.8]))
    assert models.scores == [([1, 2], [3, 4, 5, 6])]
    t = reward.teacher
    assert list(t.teacher_logprobs) == pytest.approx([-0.3, -0.4, -0.5, -0.6]) and list(t.mask) == [1, 0, 0, 1]
    assert t.truncated_tokens == 0 and t.teacher_model == "scripted-teacher" and t.teacher_weights_version == "v0"
    assert reward.value == pytest.approx(((-0.3 + 0.2) + (-0.6 + 0.8)) / 2)


async def test_truncation_masks_the_dropped_tokens() -> None:
    models = ScriptedModels(context=3)
    reward = await Teacher(models, 4, 10).score(inp([1, 2, 3], [4, 5, 6], [1, 1, 1]))
    assert models.scores == [([4], [5, 6])]  # the prompt dropped; the first response token is only context
    assert list(reward.teacher.mask) == [0, 1, 1] and list(reward.teacher.teacher_logprobs) == [0.0, -0.5, -0.5]
    assert reward.teacher.truncated_tokens == 3
    models = ScriptedModels(context=100)  # the request's cap, when below the teacher's context, wins
    capped = await Teacher(models, 4, 10).score(inp([1, 2, 3], [4, 5, 6], [1, 1, 1], cap=5))
    assert models.scores == [([2, 3], [4, 5, 6])]
    assert list(capped.teacher.mask) == [1, 1, 1] and capped.teacher.truncated_tokens == 1


async def test_tokens_outside_the_teachers_vocabulary_fail_the_precondition() -> None:
    with pytest.raises(FailedPrecondition, match="the teacher cannot score these tokens: .*outside the vocabulary"):
        await Teacher(ScriptedModels(vocab=100), 4, 10).score(inp([1], [5, 500], [1, 1]))


async def test_a_deadline_is_deadline_exceeded() -> None:
    class Slow(ScriptedModels):
        async def context_length(self, model: str, *, timeout: float) -> int:
            import asyncio

            await asyncio.sleep(5)
            return 10

    with pytest.raises(DeadlineExceeded, match="took longer than 0.1s"):
        await Teacher(Slow(), 4, 10).score(inp([1], [2], [1]), deadline_s=0.1)
