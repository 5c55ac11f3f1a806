"""Runs as stored: a rollout's grade read back from its outcome reward, and a whole run read back from the
experience service once it holds every rollout (for `orchard eval --run` and `--best-of`)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports its modules at start: heavy parts are imported when a command runs
    from orchard.tasks import GradeResult
    from orchard.types.v1 import types_pb2 as tpb

POLL_S = 0.5
"""How often `stored_run` asks the experience service again while it still stores the run's events."""


def grade_from_trajectory(trajectory: tpb.Trajectory) -> GradeResult | None:
    """The GradeResult an outcome reward stored on a trajectory records; None when it has none."""
    from orchard.tasks import GradeResult
    from orchard.types.v1 import types_pb2 as tpb

    outcomes = [r for r in trajectory.rewards if r.kind == tpb.REWARD_KIND_OUTCOME]
    if not outcomes:
        return None
    details = outcomes[-1].outcome
    groups: dict[int, dict[str, list[str]]] = {
        g: {"success": [], "failure": []} for g in (tpb.TEST_GROUP_FAIL_TO_PASS, tpb.TEST_GROUP_PASS_TO_PASS)
    }
    for test in details.tests:
        groups[test.group]["success" if test.status == tpb.TEST_STATUS_PASSED else "failure"].append(test.test_id)
    return GradeResult(
        instance_id=trajectory.task_id,
        patch_exists=bool(trajectory.final_patch.strip()),
        patch_applied=details.patch_applied,
        resolved=details.status == tpb.OUTCOME_STATUS_RESOLVED,
        fail_to_pass=groups[tpb.TEST_GROUP_FAIL_TO_PASS],
        pass_to_pass=groups[tpb.TEST_GROUP_PASS_TO_PASS],
        log_tail=details.log_tail,
        error=details.error if details.status == tpb.OUTCOME_STATUS_ERROR else "",
        duration_s=details.duration.ToNanoseconds() / 1e9,
        sample_index=trajectory.sample_index,
    )


async def stored_run(
    address: str, run_id: str, *, wait_s: float, graded: bool = True, full: bool = False
) -> list[tpb.Trajectory]:
    """Every rollout of `run_id` in the experience service (patch and rewards; with `full`, its messages, steps and
    tokens too), once it holds them all.

    The service stores events a moment after they were published, so this asks until every rollout is finished
    (and graded, when `graded`) and two looks POLL_S apart agree on the count; after `wait_s` it returns what
    there is if that is complete, else raises FailedPrecondition naming what is missing.
    """
    from orchard import clients
    from orchard.errors import FailedPrecondition, NotFound
    from orchard.experience.v1 import experience_pb2 as epb
    from orchard.types.v1 import types_pb2 as tpb

    request = epb.ListTrajectoriesRequest(
        filter=epb.TrajectoryFilter(run_ids=[run_id], include_unfinished=True),
        view=epb.TRAJECTORY_VIEW_FULL if full else epb.TRAJECTORY_VIEW_BASIC,
        page_size=50 if full else 1000,
    )  # full pages stay under gRPC's 4 MB
    deadline, agreed, told = time.monotonic() + wait_s, -1, False
    async with clients.connect("experience", address, flag="--experience-address") as experience:
        while True:
            found: list[tpb.Trajectory] = []
            request.page_token = ""
            while True:
                page = await experience.unary("ListTrajectories", request, idempotent=True, timeout=30)
                found += page.trajectories
                request.page_token = page.next_page_token
                if not request.page_token:
                    break
            unfinished = [t.trajectory_id for t in found if t.stop_reason == tpb.STOP_REASON_UNSPECIFIED]
            ungraded = [t.trajectory_id for t in found if graded and grade_from_trajectory(t) is None]
            complete = bool(found) and not unfinished and not ungraded
            if complete and (len(found) == agreed or time.monotonic() >= deadline):
                return found
            if time.monotonic() >= deadline:
                if not found:
                    raise NotFound(
                        f"run {run_id!r} has no rollouts in the experience service at {address}; check "
                        "the run id (`orchard rollout` prints it) and that the rollout published events"
                    )
                if unfinished:
                    raise FailedPrecondition(
                        f"run {run_id!r}: {len(unfinished)} of {len(found)} rollouts are still unfinished in the "
                        f"experience service after {wait_s:g}s (e.g. {unfinished[0]}); is `orchard rollout` still "
                        "running? Try again when it ends, or raise --wait"
                    )
                raise FailedPrecondition(
                    f"run {run_id!r}: {len(ungraded)} of {len(found)} rollouts carry no outcome reward (e.g. "
                    f"{ungraded[0]}; was it run with --no-grade?); rerun with --regrade"
                )
            if not complete and not told:
                print(
                    f"waiting up to {wait_s:g}s for the experience service to store run {run_id} ({len(found)} "
                    f"rollouts so far, {len(unfinished)} unfinished)",
                    file=sys.stderr,
                )
                told = True
            agreed = len(found) if complete else -1
            await asyncio.sleep(POLL_S)


def mean_outcome_reward(trajectories: list[tpb.Trajectory]) -> float | None:
    """The mean of the rollouts' latest outcome rewards; None when none has one."""
    from orchard.types.v1 import types_pb2 as tpb

    values = [[r.value for r in t.rewards if r.kind == tpb.REWARD_KIND_OUTCOME] for t in trajectories]
    latest = [v[-1] for v in values if v]
    return sum(latest) / len(latest) if latest else None
