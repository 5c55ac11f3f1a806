"""Many rollouts at once: k samples of every task, a bounded number in flight (each holds a sandbox), each
graded in a fresh sandbox as soon as it ends, with its outcome reward added to the trajectory and published."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from orchard import events, outcomes
from orchard.harness.base import Harness
from orchard.harness.loop import AgentLoop
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.grading import GradeResult, grade
from orchard.tasks.instance import TaskInstance
from orchard.types.v1 import types_pb2 as tpb


@dataclass(frozen=True)
class RolloutResult:
    """A finished rollout and its grade (None when grading was off)."""

    trajectory: tpb.Trajectory
    grade: GradeResult | None


class Task(Protocol):
    """What the runner needs of any task: its id. Repository tasks (TaskInstance) are graded by the runner; web and
    assistant tasks are judged by their harness (`Harness.outcome`)."""

    @property
    def instance_id(self) -> str: ...


TaskT = TypeVar("TaskT", bound=Task)
HarnessFactory = Callable[[TaskT], Harness]
OnResult = Callable[[RolloutResult], Awaitable[None] | None]


def ungraded(trajectory: tpb.Trajectory) -> tuple[GradeResult, tpb.Reward]:
    """The grade and reward of a rollout that did not submit: unresolved when it ran out of budget, an error
    (to mask out of training) when the model or environment failed."""
    error = "" if outcomes.truncated(trajectory.stop_reason) else (trajectory.stop_detail or "the rollout was aborted")
    result = GradeResult(
        instance_id=trajectory.task_id,
        patch_exists=False,
        patch_applied=False,
        resolved=False,
        error=error,
        sample_index=trajectory.sample_index,
    )
    reward = result.to_reward()
    if not error:
        reward.outcome.status = tpb.OUTCOME_STATUS_TRUNCATED
    return result, reward


async def run_one(
    loop: AgentLoop,
    client: AsyncSandboxClient,
    make_harness: HarnessFactory[TaskT],
    instance: TaskT,
    sample: int,
    *,
    grade_patches: bool = True,
    test_timeout_s: float = 600.0,
) -> RolloutResult:
    """One rollout of `instance` as sample `sample` (its trajectory id is `<run>-<instance>-<sample>`), graded in a
    fresh sandbox unless grade_patches is off, with its outcome reward added to the trajectory and published."""
    harness = make_harness(instance)
    trajectory = await loop.run(
        harness,
        sample_index=sample,
        group_id=f"{loop.run_id}/{instance.instance_id}",
        trajectory_id=f"{loop.run_id}-{instance.instance_id}-{sample}",
    )
    if not grade_patches:
        return RolloutResult(trajectory, None)
    if trajectory.stop_reason == tpb.STOP_REASON_SUBMITTED and (own := harness.outcome()) is not None:
        result = replace(own, sample_index=sample)  # the harness judged its own rollout (a web task's check)
        reward = result.to_reward(source=f"orchard.harness.{harness.name}", name="task_check")
    elif trajectory.stop_reason == tpb.STOP_REASON_SUBMITTED:
        if not isinstance(instance, TaskInstance):
            raise TypeError(
                f"task {instance.instance_id!r} is not a repository task, and its harness {harness.name!r} "
                "judged nothing (Harness.outcome returned None)"
            )
        result = await grade(
            client, instance, trajectory.final_patch, sample_index=sample, test_timeout_s=test_timeout_s
        )
        reward = result.to_reward()
    else:
        result, reward = ungraded(trajectory)
    trajectory.rewards.append(reward)
    trajectory.metadata["verify_status"] = "resolved" if result.resolved else "unresolved"
    await loop.emit(events.reward(trajectory.run_id, trajectory.trajectory_id, reward, len(trajectory.rewards) - 1))
    return RolloutResult(trajectory, result)


async def run_rollouts(
    instances: Sequence[TaskT],
    k: int,
    *,
    loop: AgentLoop,
    client: AsyncSandboxClient,
    make_harness: HarnessFactory[TaskT],
    concurrency: int = 4,
    grade_patches: bool = True,
    on_result: OnResult | None = None,
    test_timeout_s: float = 600.0,
) -> list[RolloutResult]:
    """Run k rollouts of every instance, at most `concurrency` at a time; results in (task, sample) order.

    `on_result` is called as each rollout finishes (graded), e.g. to store it and update a progress bar.
    """
    slots = asyncio.Semaphore(concurrency)

    async def one(instance: TaskT, sample: int) -> RolloutResult:
        async with slots:
            done = await run_one(
                loop, client, make_harness, instance, sample, grade_patches=grade_patches, test_timeout_s=test_timeout_s
            )
        if on_result is not None:
            maybe = on_result(done)
            if inspect.isawaitable(maybe):
                await maybe
        return done

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(instance, sample)) for instance in instances for sample in range(k)]
    return [t.result() for t in tasks]
