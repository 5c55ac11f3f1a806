"""Outcome rewards: a submitted patch graded by tests in a sandbox (a task set's instance through orchard.tasks,
or an eval script in the task's image), mapped to values by configurable resolved / unresolved / truncated
rewards. Rollouts that did not submit are graded without running anything."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from orchard import outcomes
from orchard.errors import InvalidArgument, OrchardError
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.tasks import SANDBOX_ENV, GradeResult, TaskInstance, grade, load_instances, parse_log_pytest_v2
from orchard.tasks.grading import APPLY_COMMANDS, LOG_TAIL_CHARS, PATCH_DIR
from orchard.tasks.logparse import passed
from orchard.types.v1 import types_pb2 as tpb

LOG_PARSERS = {"pytest_v2": parse_log_pytest_v2}
"""Parsers of eval-script logs by name; an empty name grades by the script's exit code."""
SOURCE = "orchard.reward.outcome"


@dataclass(frozen=True)
class OutcomeValues:
    """Reward values per outcome (OPD, for one, sets unresolved to 0)."""

    resolved: float = 1.0
    unresolved: float = -1.0
    truncated: float = -1.0


@dataclass(frozen=True)
class EvalSpec:
    """Grading by an eval script in an image that already holds the repository (SWE-bench harness style)."""

    image: str
    workdir: str
    eval_script: str
    log_parser: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    timeout_s: float | None


@dataclass(frozen=True)
class OutcomeInput:
    task_id: str
    patch: str
    stop_reason: int
    values: OutcomeValues
    task_set: str = ""
    spec: EvalSpec | None = None
    sandbox_id: str = ""


def _reward(status: tpb.OutcomeStatus, value: float, details: tpb.OutcomeDetails | None = None) -> tpb.Reward:
    details = details if details is not None else tpb.OutcomeDetails()
    details.status = status
    reward = tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, value=value, name="swe_tests", source=SOURCE, outcome=details)
    reward.create_time.GetCurrentTime()
    return reward


def from_grade(result: GradeResult, values: OutcomeValues) -> tpb.Reward:
    """The reward of a graded patch: resolved / unresolved values; an ERROR (grading failed) carries 0."""
    reward = result.to_reward(source=SOURCE)
    reward.value = {
        tpb.OUTCOME_STATUS_RESOLVED: values.resolved,
        tpb.OUTCOME_STATUS_UNRESOLVED: values.unresolved,
        tpb.OUTCOME_STATUS_ERROR: 0.0,
    }[reward.outcome.status]
    return reward


class OutcomeGrader:
    """Grades patches in sandboxes of the env service behind `client`, at most `max_concurrent` at once."""

    def __init__(
        self, client: AsyncSandboxClient, max_concurrent: int, timeout_s: float, test_timeout_s: float
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.test_timeout_s = test_timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)

    async def task(self, task_set: str, task_id: str) -> TaskInstance:
        """The instance `task_id` of `task_set` (bundled name or file); InvalidArgument/NotFound when absent."""
        found = await asyncio.to_thread(load_instances, task_set, [task_id])
        return found[0]

    async def reward(self, item: OutcomeInput, deadline_s: float | None = None) -> tpb.Reward:
        """The OUTCOME reward of one rollout; grading failures are data (status ERROR), not exceptions."""
        if outcomes.truncated(item.stop_reason):
            return _reward(tpb.OUTCOME_STATUS_TRUNCATED, item.values.truncated)
        if outcomes.aborted(item.stop_reason) and item.stop_reason != tpb.STOP_REASON_UNSPECIFIED:
            return _reward(
                tpb.OUTCOME_STATUS_ERROR,
                0.0,
                tpb.OutcomeDetails(
                    error=f"the rollout was aborted ({tpb.StopReason.Name(item.stop_reason)}); mask it out"
                ),
            )
        timeout = self.timeout_s if deadline_s is None else min(self.timeout_s, deadline_s)
        async with self._slots:
            if item.task_set:
                instance = await self.task(item.task_set, item.task_id)  # a missing task is NOT_FOUND, not data
                result = await grade(
                    self.client, instance, item.patch, test_timeout_s=self.test_timeout_s, timeout_s=timeout
                )
            else:
                assert item.spec is not None
                result = await self._grade_spec(item, item.spec, timeout)
        return from_grade(result, item.values)

    async def _grade_spec(self, item: OutcomeInput, spec: EvalSpec, timeout: float) -> GradeResult:
        start = time.monotonic()
        test_timeout = spec.timeout_s or self.test_timeout_s

        def result(**fields: Any) -> GradeResult:
            return GradeResult(
                instance_id=item.task_id,
                patch_exists=bool(item.patch.strip()),
                duration_s=time.monotonic() - start,
                **fields,
            )

        try:
            async with asyncio.timeout(timeout), self._sandbox(item, spec, timeout) as sandbox:
                cwd = spec.workdir or None
                if item.patch.strip():
                    path = f"{PATCH_DIR}/model.patch"
                    await sandbox.upload_content(item.patch if item.patch.endswith("\n") else item.patch + "\n", path)
                    script = " || ".join(f"({c.format(p=path)})" for c in APPLY_COMMANDS)
                    applied = await sandbox.exec(script, cwd=cwd, env=SANDBOX_ENV, timeout=60)
                    if not applied.succeeded:
                        return result(
                            patch_applied=False,
                            resolved=False,
                            log_tail=(applied.stdout + applied.stderr)[-LOG_TAIL_CHARS:],
                        )
                await sandbox.upload_content(spec.eval_script, f"{PATCH_DIR}/eval.sh")
                run = await sandbox.exec(f"bash {PATCH_DIR}/eval.sh", cwd=cwd, env=SANDBOX_ENV, timeout=test_timeout)
        except TimeoutError as err:
            message = str(err) if isinstance(err, OrchardError) else f"grading took longer than {timeout:g}s"
            return result(patch_applied=False, resolved=False, error=message)
        except OrchardError as err:
            return result(patch_applied=False, resolved=False, error=str(err))
        log = run.stdout + run.stderr
        if run.timed_out:
            return result(
                patch_applied=True,
                resolved=False,
                log_tail=log[-LOG_TAIL_CHARS:],
                error=f"the eval script ran past {test_timeout:g}s",
            )
        if not spec.log_parser:
            return result(patch_applied=True, resolved=run.exit_code == 0, log_tail=log[-LOG_TAIL_CHARS:])
        statuses = LOG_PARSERS[spec.log_parser](log)

        def split(ids: list[str]) -> dict[str, list[str]]:
            return {
                "success": [t for t in ids if passed(t, statuses)],
                "failure": [t for t in ids if not passed(t, statuses)],
            }

        f2p, p2p = split(spec.fail_to_pass), split(spec.pass_to_pass)
        return result(
            patch_applied=True,
            resolved=not f2p["failure"] and not p2p["failure"],
            fail_to_pass=f2p,
            pass_to_pass=p2p,
            statuses=statuses,
            log_tail=log[-LOG_TAIL_CHARS:],
        )

    @contextlib.asynccontextmanager
    async def _sandbox(self, item: OutcomeInput, spec: EvalSpec, timeout: float) -> AsyncIterator[AsyncSandbox]:
        """The caller's sandbox (kept), or a fresh one from the spec's image (deleted after)."""
        if item.sandbox_id:
            yield await self.client.get_sandbox(item.sandbox_id)
            return
        sandbox = await self.client.create_sandbox(
            spec.image, env=SANDBOX_ENV, timeout=timeout + 60, labels={"orchard.role": "grading"}
        )
        async with sandbox:
            yield sandbox


def check_log_parser(name: str) -> None:
    if name and name not in LOG_PARSERS:
        raise InvalidArgument(
            f"unknown log_parser {name!r}; use one of {', '.join(LOG_PARSERS)} or leave it empty "
            "to grade by the eval script's exit code",
            field="spec.log_parser",
        )
