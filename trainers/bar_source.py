"""BAR's rollouts from the harness (docs/training.md §2.3): each one an agent-loop run of a SWE task instance in its own
sandbox, graded in a fresh sandbox, returned as a BAR `Rollout` that carries its trajectory.

Choices [I]:
- Sample indices continue per instance across BAR's rounds (and across concurrent calls), so trajectory ids
  `<run>-<instance>-<sample>` never repeat within a run; `run_rollouts` restarts them at 0 on every call.
- A rollout whose grading failed (reward status ERROR) is backfill, like an aborted one: its -1 says nothing
  about the policy.
- Each rollout runs through the harness's `run_one`, so its reward is added and published to the loop's event
  sink like any rollout's; `trajectories` also keeps every one, graded, for the caller.
"""

from __future__ import annotations

import asyncio
import dataclasses

from orchard.harness import AgentLoop
from orchard.harness.runner import HarnessFactory, run_one
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.instance import TaskInstance
from orchard.trainers.bar import Rollout, Status, rollout_from_trajectory
from orchard.types.v1 import types_pb2 as tpb


class HarnessRolloutSource:
    """A `RolloutSource[TaskInstance]`: n graded agent-loop rollouts per call, at most `concurrency` at a time
    over all calls (each holds a sandbox, then a grading sandbox)."""

    def __init__(
        self,
        loop: AgentLoop,
        client: AsyncSandboxClient,
        make_harness: HarnessFactory[TaskInstance],
        *,
        concurrency: int = 4,
        test_timeout_s: float = 600.0,
        first_sample: int = 0,
    ) -> None:
        self.loop = loop
        self.client = client
        self.make_harness = make_harness
        self.test_timeout_s = test_timeout_s
        self.trajectories: list[tpb.Trajectory] = []
        """Every finished trajectory, with its reward, in the order they finished."""
        self._slots = asyncio.Semaphore(concurrency)
        self.first_sample = first_sample
        """Where every instance's sample indices start (a resumed RL job starts past the ones it already used)."""
        self._next_sample: dict[str, int] = {}

    async def sample(self, prompt: TaskInstance, n: int) -> list[Rollout]:
        """n fresh graded rollouts of `prompt`, with sample indices after the ones it already had."""
        # Reserved before the first await, so concurrent calls for one instance get disjoint indices.
        first = self._next_sample.get(prompt.instance_id, self.first_sample)
        self._next_sample[prompt.instance_id] = first + n
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._one(prompt, first + i)) for i in range(n)]
        return [t.result() for t in tasks]

    async def _one(self, instance: TaskInstance, sample: int) -> Rollout:
        async with self._slots:
            done = await run_one(
                self.loop, self.client, self.make_harness, instance, sample, test_timeout_s=self.test_timeout_s
            )
        trajectory = done.trajectory
        self.trajectories.append(trajectory)
        reward = trajectory.rewards[-1]
        rollout = rollout_from_trajectory(trajectory, reward.value)
        if reward.outcome.status == tpb.OUTCOME_STATUS_ERROR:
            rollout = dataclasses.replace(rollout, status=Status.ABORTED)
        return rollout
