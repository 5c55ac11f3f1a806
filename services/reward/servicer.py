"""RewardService servicer: validates requests and translates protos to the grader, judge and teacher, running
batches concurrently under their bounds and within the caller's deadline. Errors raised here are OrchardErrors;
the runtime's interceptor maps them to status codes."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from orchard.chat import render
from orchard.errors import InvalidArgument, OrchardError
from orchard.reward.v1 import reward_pb2 as pb
from orchard.reward.v1 import reward_pb2_grpc
from orchard.services.reward.judge import Judge, JudgeInput, log_batch
from orchard.services.reward.outcome import EvalSpec, OutcomeGrader, OutcomeInput, OutcomeValues, check_log_parser
from orchard.services.reward.rubric import Criterion, Rubric, RubricError, build_rubric
from orchard.services.reward.settings import RewardSettings
from orchard.services.reward.teacher import Teacher, TeacherInput
from orchard.types.v1 import types_pb2 as tpb

T = TypeVar("T")
R = TypeVar("R")
DEADLINE_MARGIN_S = 0.25
"""Time kept back from the caller's deadline so a fallback answer still reaches it."""


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds left for the work of this call, or None when the caller set no deadline."""
    remaining = context.time_remaining()
    return None if remaining is None else max(0.001, remaining - min(DEADLINE_MARGIN_S, remaining / 10))


async def run_all(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Await all, in order; the first failure cancels the rest and is raised, naming its request."""

    async def one(i: int, coro: Awaitable[T]) -> T:
        try:
            return await coro
        except OrchardError as err:
            err.message = f"requests[{i}]: {err.message}"
            err.args = (err.message,)
            err.field = f"requests[{i}].{err.field}" if err.field else f"requests[{i}]"
            raise

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, c)) for i, c in enumerate(coros)]
    except BaseExceptionGroup as failed:
        leaf: BaseException = failed
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None
    return [t.result() for t in tasks]


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value):
        raise InvalidArgument(f"{field} must be a finite number; got {value}", field=field)
    return value


class RewardServicer(reward_pb2_grpc.RewardServiceServicer):
    """gRPC face of the outcome grader, the RPR judge and the OPD teacher."""

    def __init__(
        self, settings: RewardSettings, rubric: Rubric, grader: OutcomeGrader, judge: Judge, teacher: Teacher
    ) -> None:
        self.settings = settings
        self.rubric = rubric
        self.grader = grader
        self.judge = judge
        self.teacher = teacher

    def _check_batch(self, n: int) -> None:
        if n == 0:
            raise InvalidArgument("requests is empty; give at least one", field="requests")
        if n > self.settings.max_batch_size:
            raise InvalidArgument(
                f"{n} requests exceed the batch limit of {self.settings.max_batch_size}; split the batch",
                field="requests",
            )

    # -- outcome ------------------------------------------------------------------------------------------------

    def _outcome_input(self, r: pb.ComputeOutcomeRewardRequest) -> OutcomeInput:
        c = r.config
        values = OutcomeValues(
            resolved=_finite(c.resolved_reward, "config.resolved_reward") if c.HasField("resolved_reward") else 1.0,
            unresolved=_finite(c.unresolved_reward, "config.unresolved_reward")
            if c.HasField("unresolved_reward")
            else -1.0,
            truncated=_finite(c.truncated_reward, "config.truncated_reward")
            if c.HasField("truncated_reward")
            else -1.0,
        )
        item = OutcomeInput(
            task_id=r.task_id,
            patch=r.patch,
            stop_reason=r.stop_reason,
            values=values,
            task_set=r.task_set,
            sandbox_id=r.sandbox_id,
        )
        if r.stop_reason not in (tpb.STOP_REASON_UNSPECIFIED, tpb.STOP_REASON_SUBMITTED):
            return item  # graded without running anything
        if r.task_set and r.HasField("spec"):
            raise InvalidArgument("both task_set and spec are set; set one", field="task_set")
        if r.task_set:
            if not r.task_id:
                raise InvalidArgument("task_id is empty; name the instance of the task set to grade", field="task_id")
            if r.sandbox_id:
                raise InvalidArgument(
                    "sandbox_id works only with spec; a task set's instance is graded in a fresh sandbox",
                    field="sandbox_id",
                )
            return item
        if not r.HasField("spec"):
            raise InvalidArgument("say how to grade: set task_set (e.g. 'toyrepair') or spec", field="spec")
        s = r.spec
        if not s.image and not r.sandbox_id:
            raise InvalidArgument("spec.image is empty; give the task's image (or a sandbox_id)", field="spec.image")
        if not s.eval_script.strip():
            raise InvalidArgument(
                "spec.eval_script is empty; give the script that runs the tests", field="spec.eval_script"
            )
        check_log_parser(s.log_parser)
        if s.log_parser and not s.fail_to_pass:
            raise InvalidArgument(
                "spec.fail_to_pass is empty; a log parser grades the named tests", field="spec.fail_to_pass"
            )
        timeout = s.timeout.ToTimedelta().total_seconds()
        if timeout < 0:
            raise InvalidArgument("spec.timeout must not be negative", field="spec.timeout")
        spec = EvalSpec(
            image=s.image,
            workdir=s.workdir,
            eval_script=s.eval_script,
            log_parser=s.log_parser,
            fail_to_pass=list(s.fail_to_pass),
            pass_to_pass=list(s.pass_to_pass),
            timeout_s=timeout or None,
        )
        return dataclasses.replace(item, spec=spec)

    async def ComputeOutcomeReward(
        self, request: pb.ComputeOutcomeRewardRequest, context: grpc.aio.ServicerContext
    ) -> pb.ComputeOutcomeRewardResponse:
        item = self._outcome_input(request)
        return pb.ComputeOutcomeRewardResponse(reward=await self.grader.reward(item, deadline_of(context)))

    # -- judge --------------------------------------------------------------------------------------------------

    def _rubric(self, criteria: Sequence[pb.RubricCriterion]) -> Rubric:
        if not criteria:
            return self.rubric
        try:
            return build_rubric(
                "request",
                [
                    Criterion(id=c.criterion_id, name=c.name, weight=c.weight, description=c.description)
                    for c in criteria
                ],
            )
        except RubricError as err:
            raise InvalidArgument(f"config.rubric: {err}", field="config.rubric") from None

    def _judge_input(self, r: pb.JudgeTrajectoryRequest) -> JudgeInput:
        t = r.trajectory
        if not (t.steps or t.messages or t.final_patch):
            raise InvalidArgument("trajectory is empty; give its steps or messages", field="trajectory")
        if not r.HasField("outcome"):
            raise InvalidArgument(
                "outcome is required: the trajectory's OUTCOME reward R_bin (from ComputeOutcomeReward)",
                field="outcome",
            )
        if r.outcome.kind != tpb.REWARD_KIND_OUTCOME:
            raise InvalidArgument(
                f"outcome must be an OUTCOME reward; got {tpb.RewardKind.Name(r.outcome.kind)}", field="outcome.kind"
            )
        _finite(r.outcome.value, "outcome.value")
        problem = r.problem_statement or render.problem_statement(t)
        if not problem.strip():
            raise InvalidArgument(
                "problem_statement is empty and the trajectory has no user message; give the task",
                field="problem_statement",
            )
        c = r.config
        alpha = _finite(c.alpha, "config.alpha") if c.HasField("alpha") else self.settings.alpha
        if alpha < 0:
            raise InvalidArgument(
                f"config.alpha must be >= 0 (0 makes no judge call); got {alpha}", field="config.alpha"
            )
        temperature = c.temperature if c.HasField("temperature") else self.settings.judge_temperature
        if not temperature >= 0:
            raise InvalidArgument(f"config.temperature must be >= 0; got {temperature}", field="config.temperature")
        if c.max_tokens < 0:
            raise InvalidArgument(f"config.max_tokens must be >= 0; got {c.max_tokens}", field="config.max_tokens")
        reference = None
        if r.HasField("reference"):
            ref = r.reference
            reference = render.Reference(
                gold_patch=ref.gold_patch,
                changed_files=list(ref.changed_files),
                test_files=list(ref.test_files),
                fail_to_pass=list(ref.fail_to_pass),
            )
        return JudgeInput(
            trajectory=t,
            problem_statement=problem,
            outcome=r.outcome,
            reference=reference,
            rubric=self._rubric(c.rubric),
            model=c.judge_model or self.settings.judge_model,
            alpha=alpha,
            temperature=temperature,
            max_tokens=c.max_tokens or self.settings.judge_max_tokens,
        )

    async def JudgeTrajectory(
        self, request: pb.JudgeTrajectoryRequest, context: grpc.aio.ServicerContext
    ) -> pb.JudgeTrajectoryResponse:
        item = self._judge_input(request)
        return pb.JudgeTrajectoryResponse(reward=await self.judge.judge(item, deadline_of(context)))

    async def BatchJudgeTrajectories(
        self, request: pb.BatchJudgeTrajectoriesRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchJudgeTrajectoriesResponse:
        self._check_batch(len(request.requests))
        items = [self._prefixed(i, self._judge_input, r) for i, r in enumerate(request.requests)]
        deadline = deadline_of(context)
        rewards = await run_all([self.judge.judge(item, deadline) for item in items])
        log_batch(rewards)
        return pb.BatchJudgeTrajectoriesResponse(rewards=rewards)

    # -- teacher ------------------------------------------------------------------------------------------------

    def _teacher_input(self, r: pb.ComputeTeacherLogprobsRequest) -> TeacherInput:
        span = r.response
        ids = list(span.token_ids)
        if not ids:
            raise InvalidArgument(
                "response.token_ids is empty; give the student's tokens to score", field="response.token_ids"
            )
        if len(span.mask) != len(ids):
            raise InvalidArgument(
                f"response.mask has {len(span.mask)} entries for {len(ids)} tokens; give one per "
                "token (1 = student-generated, 0 = tool/observation)",
                field="response.mask",
            )
        if any(m not in (0, 1) for m in span.mask):
            raise InvalidArgument("response.mask holds values other than 0 and 1", field="response.mask")
        if span.logprobs and len(span.logprobs) != len(ids):
            raise InvalidArgument(
                f"response.logprobs has {len(span.logprobs)} entries for {len(ids)} tokens; give one per token or none",
                field="response.logprobs",
            )
        for name, values in (("prompt_token_ids", r.prompt_token_ids), ("response.token_ids", ids)):
            bad = next((t for t in values if t < 0), None)
            if bad is not None:
                raise InvalidArgument(f"{name} holds a negative token id ({bad})", field=name)
        if r.max_context_tokens < 0:
            raise InvalidArgument(
                "max_context_tokens must not be negative (0 = the teacher's context)", field="max_context_tokens"
            )
        return TeacherInput(
            model=r.teacher_model or self.settings.teacher_model,
            prompt_ids=list(r.prompt_token_ids),
            response_ids=ids,
            mask=list(span.mask),
            student_logprobs=list(span.logprobs),
            max_context_tokens=r.max_context_tokens,
        )

    async def ComputeTeacherLogprobs(
        self, request: pb.ComputeTeacherLogprobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ComputeTeacherLogprobsResponse:
        item = self._teacher_input(request)
        return pb.ComputeTeacherLogprobsResponse(reward=await self.teacher.score(item, deadline_of(context)))

    async def BatchComputeTeacherLogprobs(
        self, request: pb.BatchComputeTeacherLogprobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.BatchComputeTeacherLogprobsResponse:
        self._check_batch(len(request.requests))
        items = [self._prefixed(i, self._teacher_input, r) for i, r in enumerate(request.requests)]
        deadline = deadline_of(context)
        rewards = await run_all([self.teacher.score(item, deadline) for item in items])
        return pb.BatchComputeTeacherLogprobsResponse(rewards=rewards)

    @staticmethod
    def _prefixed(i: int, convert: Callable[[R], T], request: R) -> T:
        """convert(request), with an InvalidArgument naming requests[i]."""
        try:
            return convert(request)
        except InvalidArgument as err:
            raise InvalidArgument(
                f"requests[{i}]: {err.message}", field=f"requests[{i}].{err.field}" if err.field else f"requests[{i}]"
            ) from None
