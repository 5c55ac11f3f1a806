"""Request validation of the reward servicer: bad input becomes INVALID_ARGUMENT naming the field (no I/O: the
conversions run before any grading, judge or teacher call)."""

from __future__ import annotations

from typing import Any

import pytest
from scripted_models import ScriptedModels

from orchard.errors import InvalidArgument
from orchard.reward.v1 import reward_pb2 as pb
from orchard.services.reward.judge import Judge
from orchard.services.reward.outcome import OutcomeGrader
from orchard.services.reward.rubric import BUNDLED_RUBRIC, load_rubric
from orchard.services.reward.servicer import RewardServicer
from orchard.services.reward.settings import RewardSettings
from orchard.services.reward.teacher import Teacher
from orchard.types.v1 import types_pb2 as tpb

OUTCOME = tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, value=1.0)
TRAJ = tpb.Trajectory(messages=[tpb.Message(role=tpb.ROLE_USER, content="Fix it.")], final_patch="diff")


@pytest.fixture
def servicer() -> RewardServicer:
    models = ScriptedModels()
    grader = OutcomeGrader(None, 1, 10, 10)  # type: ignore[arg-type]  # never reached: validation only
    return RewardServicer(
        RewardSettings(), load_rubric(BUNDLED_RUBRIC), grader, Judge(models, 1, 10), Teacher(models, 1, 10)
    )


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({}, "spec", r"set task_set \(e.g. 'toyrepair'\) or spec"),
        ({"task_set": "toyrepair", "spec": pb.TestSpec(image="x")}, "task_set", "both task_set and spec"),
        ({"task_set": "toyrepair"}, "task_id", "task_id is empty"),
        ({"task_set": "toyrepair", "task_id": "t", "sandbox_id": "sb"}, "sandbox_id", "only with spec"),
        ({"spec": pb.TestSpec(eval_script="pytest")}, "spec.image", "spec.image is empty"),
        ({"spec": pb.TestSpec(image="i")}, "spec.eval_script", "eval_script is empty"),
        ({"spec": pb.TestSpec(image="i", eval_script="x", log_parser="junit")}, "spec.log_parser", "pytest_v2"),
        ({"spec": pb.TestSpec(image="i", eval_script="x", log_parser="pytest_v2")}, "spec.fail_to_pass", "is empty"),
        (
            {"task_set": "toyrepair", "task_id": "t", "config": pb.OutcomeRewardConfig(resolved_reward=float("nan"))},
            "config.resolved_reward",
            "finite",
        ),
    ],
)
def test_outcome_requests(servicer: RewardServicer, fields: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        servicer._outcome_input(pb.ComputeOutcomeRewardRequest(**fields))
    assert caught.value.field == field


def test_truncated_rollouts_need_no_spec(servicer: RewardServicer) -> None:
    item = servicer._outcome_input(pb.ComputeOutcomeRewardRequest(stop_reason=tpb.STOP_REASON_STEP_LIMIT))
    assert item.spec is None and item.values.truncated == -1.0


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"trajectory": tpb.Trajectory(), "outcome": OUTCOME}, "trajectory", "trajectory is empty"),
        ({"trajectory": TRAJ}, "outcome", "outcome is required"),
        ({"trajectory": TRAJ, "outcome": tpb.Reward(kind=tpb.REWARD_KIND_RPR)}, "outcome.kind", "got REWARD_KIND_RPR"),
        ({"trajectory": tpb.Trajectory(final_patch="d"), "outcome": OUTCOME}, "problem_statement", "give the task"),
        ({"trajectory": TRAJ, "outcome": OUTCOME, "config": pb.JudgeConfig(alpha=-1)}, "config.alpha", ">= 0"),
        (
            {"trajectory": TRAJ, "outcome": OUTCOME, "config": pb.JudgeConfig(max_tokens=-5)},
            "config.max_tokens",
            ">= 0",
        ),
        (
            {
                "trajectory": TRAJ,
                "outcome": OUTCOME,
                "config": pb.JudgeConfig(
                    rubric=[pb.RubricCriterion(criterion_id="A", name="a", weight=0.5, description="d")]
                ),
            },
            "config.rubric",
            "weights sum to 0.5, not 1",
        ),
    ],
)
def test_judge_requests(servicer: RewardServicer, fields: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as caught:
        servicer._judge_input(pb.JudgeTrajectoryRequest(**fields))
    assert caught.value.field == field


def test_judge_defaults(servicer: RewardServicer) -> None:
    item = servicer._judge_input(pb.JudgeTrajectoryRequest(trajectory=TRAJ, outcome=OUTCOME))
    assert (item.alpha, item.temperature, item.max_tokens, item.problem_statement) == (0.5, 0.6, 1024, "Fix it.")
    assert len(item.rubric.criteria) == 7 and item.reference is None


@pytest.mark.parametrize(
    ("span", "extra", "field"),
    [
        (tpb.TokenSpan(), {}, "response.token_ids"),
        (tpb.TokenSpan(token_ids=[1, 2]), {}, "response.mask"),
        (tpb.TokenSpan(token_ids=[1, 2], mask=[1, 2]), {}, "response.mask"),
        (tpb.TokenSpan(token_ids=[1, 2], mask=[1, 1], logprobs=[-1.0]), {}, "response.logprobs"),
        (tpb.TokenSpan(token_ids=[1, -2], mask=[1, 1]), {}, "response.token_ids"),
        (tpb.TokenSpan(token_ids=[1], mask=[1]), {"prompt_token_ids": [-1]}, "prompt_token_ids"),
        (tpb.TokenSpan(token_ids=[1], mask=[1]), {"max_context_tokens": -1}, "max_context_tokens"),
    ],
)
def test_teacher_requests(servicer: RewardServicer, span: tpb.TokenSpan, extra: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        servicer._teacher_input(pb.ComputeTeacherLogprobsRequest(response=span, **extra))
    assert caught.value.field == field


def test_batch_errors_name_the_request(servicer: RewardServicer) -> None:
    good = pb.ComputeTeacherLogprobsRequest(response=tpb.TokenSpan(token_ids=[1], mask=[1]))
    with pytest.raises(InvalidArgument, match=r"requests\[1\]: response.mask has 0 entries") as caught:
        [
            servicer._prefixed(i, servicer._teacher_input, r)
            for i, r in enumerate([good, pb.ComputeTeacherLogprobsRequest(response=tpb.TokenSpan(token_ids=[1]))])
        ]
    assert caught.value.field == "requests[1].response.mask"
