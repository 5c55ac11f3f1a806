"""The RPR judge: robust JSON parsing, snapping, aggregation, the reward mix, alpha = 0 and the fallback on
failure. The judge model is a scripted fake (tests/unit/services/reward/scripted_models.py), since no real model
runs in unit tests; tests/integration/test_reward_service.py uses the real one."""

from __future__ import annotations

import asyncio
import json

import pytest
from scripted_models import ScriptedModels

from orchard.errors import Unavailable
from orchard.services.reward.judge import (
    Judge,
    JudgeInput,
    JudgeOutputError,
    parse_judge_output,
    snap,
    system_prompt,
)
from orchard.services.reward.rubric import BUNDLED_RUBRIC, aggregate, load_rubric
from orchard.types.v1 import types_pb2 as tpb

RUBRIC = load_rubric(BUNDLED_RUBRIC)
SCORES = {"R1": 0.8, "R2": 1.0, "R3": 0.5, "R4": 0.7, "R5": 0.6, "R6": 0.0, "R7": 0.9}
J = 0.15 * 0.8 + 0.18 * 1.0 + 0.12 * 0.5 + 0.15 * 0.7 + 0.14 * 0.6 + 0.12 * 0.0 + 0.14 * 0.9
ANSWER = json.dumps({"reasoning": "Step 2 reproduces the bug; step 5 reruns it.", "scores": SCORES})


@pytest.mark.parametrize(
    "text",
    [
        ANSWER,
        f"```json\n{ANSWER}\n```",
        f"Here is my grading:\n{ANSWER}\nI hope this helps! {{not json}}",
        ANSWER.replace('"', "'"),
        ANSWER.replace('"R7": 0.9', '"R7": 0.9,'),
        json.dumps(
            {
                "reasoning": "Step 2 reproduces the bug; step 5 reruns it.",
                "scores": {f"{k} {c.name}": str(v) for (k, v), c in zip(SCORES.items(), RUBRIC.criteria, strict=True)},
            }
        ),
        json.dumps(
            {
                "reasoning": "Step 2 reproduces the bug; step 5 reruns it.",
                "scores": {k.lower(): {"score": v} for k, v in SCORES.items()},
            }
        ),
    ],
)
def test_parse_accepts_near_json(text: str) -> None:
    parsed = parse_judge_output(text, RUBRIC)
    assert parsed.raw_scores == SCORES and parsed.reasoning.startswith("Step 2")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("I cannot grade this.", "no JSON object"),
        (ANSWER[:-20], "not closed"),
        (json.dumps({"scores": {k: v for k, v in SCORES.items() if k not in ("R3", "R6")}}), "R3, R6 are missing"),
        (ANSWER.replace("0.7", '"high"'), "score R4 is not a number: 'high'"),
        (ANSWER.replace("0.7", "true"), "score R4 is a boolean"),
        ('{"scores": [1, 2]}', "'scores' is not an object"),
        ("{reasoning: nope}", "neither JSON nor a Python literal"),
    ],
)
def test_parse_failures_say_why(text: str, message: str) -> None:
    with pytest.raises(JudgeOutputError, match=None) as caught:
        parse_judge_output(text, RUBRIC)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "snapped"),
    [
        (0.0, 0.0),
        (0.04, 0.0),
        (0.05, 0.1),
        (0.77, 0.8),
        (0.35, 0.4),
        (0.25, 0.3),
        (1.0, 1.0),
        (1.7, 1.0),
        (-0.2, 0.0),
        (0.9999, 1.0),
    ],
)
def test_snap_to_the_tenth_grid(raw: float, snapped: float) -> None:
    assert snap(raw) == snapped


def test_aggregate_is_the_weighted_mean_clamped() -> None:
    assert aggregate(SCORES, RUBRIC) == pytest.approx(J)
    assert aggregate(dict.fromkeys(SCORES, 1.0), RUBRIC) == 1.0
    assert aggregate(dict.fromkeys(SCORES, 0.0), RUBRIC) == 0.0


def test_system_prompt_lists_the_rubric_and_the_schema() -> None:
    prompt = system_prompt(RUBRIC)
    assert "R2 Self-test relevance (weight 0.18)" in prompt and '"R7": <0.0-1.0>' in prompt


def outcome(status: tpb.OutcomeStatus, value: float) -> tpb.Reward:
    return tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, value=value, outcome=tpb.OutcomeDetails(status=status))


def item(out: tpb.Reward, alpha: float = 0.5) -> JudgeInput:
    traj = tpb.Trajectory(
        trajectory_id="t1",
        final_patch="diff --git a/a.py b/a.py\n",
        steps=[
            tpb.Step(
                index=0,
                model_output=tpb.Message(content="run it"),
                actions=[tpb.ToolCall(name="bash", arguments='{"command": "pytest"}')],
                observations=[tpb.Observation(message=tpb.Message(content="1 failed"), exit_code=1)],
            )
        ],
    )
    return JudgeInput(
        trajectory=traj,
        problem_statement="Fix it.",
        outcome=out,
        reference=None,
        rubric=RUBRIC,
        model="judge-m",
        alpha=alpha,
        temperature=0.6,
        max_tokens=1024,
    )


@pytest.mark.parametrize(
    ("status", "r_bin"),
    [(tpb.OUTCOME_STATUS_RESOLVED, 1.0), (tpb.OUTCOME_STATUS_UNRESOLVED, -1.0), (tpb.OUTCOME_STATUS_TRUNCATED, -1.0)],
)
async def test_reward_mix_across_outcomes(status: tpb.OutcomeStatus, r_bin: float) -> None:
    models = ScriptedModels(
        chat_reply=f"```json\n{json.dumps({'reasoning': 'ok', 'scores': {**SCORES, 'R1': 0.77}})}\n```"
    )
    reward = await Judge(models, 4, 10).judge(item(outcome(status, r_bin)))
    j = J + 0.15 * (0.8 - 0.8)  # R1 0.77 snaps to 0.8
    assert reward.kind == tpb.REWARD_KIND_RPR and reward.value == pytest.approx(r_bin + 0.5 * j)
    d = reward.judge
    assert not d.fell_back and d.judge_score == pytest.approx(j) and d.outcome_reward == r_bin and d.alpha == 0.5
    assert [(s.criterion_id, s.score, s.raw_score) for s in d.scores][0] == ("R1", 0.8, 0.77)
    assert d.judge_model == "judge-m" and d.reasoning == "ok" and not d.reference_guided
    _, system, user = models.chats[0]
    assert "Fix it." in user and "Command: pytest" in user and "Return code: 1" in user and "R7" in system
    # Outcome ordering holds for alpha < 2: resolved rewards lie in [1, 1.5], the others in [-1, -0.5].
    assert (reward.value >= 1.0) == (status == tpb.OUTCOME_STATUS_RESOLVED)


async def test_alpha_zero_makes_no_call() -> None:
    models = ScriptedModels(chat_reply=ANSWER)
    reward = await Judge(models, 4, 10).judge(item(outcome(tpb.OUTCOME_STATUS_RESOLVED, 1.0), alpha=0.0))
    assert models.chats == [] and reward.value == 1.0
    assert reward.judge.fell_back and reward.judge.fallback_reason == "alpha is 0: no judge call made"


@pytest.mark.parametrize(
    ("models", "reason"),
    [
        (ScriptedModels(chat_reply=Unavailable("inference down")), "judge call failed (UNAVAILABLE): inference down"),
        (ScriptedModels(chat_reply="Looks good to me!"), "judge output unusable: no JSON object in the answer"),
        (ScriptedModels(chat_reply=json.dumps({"scores": {"R1": 1}})), "scores for R2, R3, R4, R5, R6, R7 are missing"),
        (ScriptedModels(chat_reply=ANSWER, chat_delay_s=5), "judge call timed out after 0.2s"),
    ],
)
async def test_judge_failure_falls_back_to_the_outcome(models: ScriptedModels, reason: str) -> None:
    reward = await Judge(models, 4, 10).judge(item(outcome(tpb.OUTCOME_STATUS_UNRESOLVED, -1.0)), deadline_s=0.2)
    d = reward.judge
    assert reward.value == -1.0 and d.fell_back and reason in d.fallback_reason
    assert d.judge_score == 0.0 and not d.scores


async def test_error_outcomes_are_not_judged() -> None:
    models = ScriptedModels(chat_reply=ANSWER)
    reward = await Judge(models, 4, 10).judge(item(outcome(tpb.OUTCOME_STATUS_ERROR, 0.0)))
    assert models.chats == [] and reward.judge.fell_back and "ERROR" in reward.judge.fallback_reason


async def test_concurrency_is_bounded() -> None:
    models = ScriptedModels(chat_reply=ANSWER, chat_delay_s=0.05)
    judge = Judge(models, 3, 10)
    rewards = await asyncio.gather(*(judge.judge(item(outcome(tpb.OUTCOME_STATUS_RESOLVED, 1.0))) for _ in range(10)))
    assert models.peak == 3 and all(not r.judge.fell_back for r in rewards)
