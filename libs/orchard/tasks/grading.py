"""Grading a patch as SWE-bench does, in a fresh sandbox: set the repository up at its base commit, apply the
patch, reset and patch the test files with the hidden tests, run the FAIL_TO_PASS and PASS_TO_PASS test files
with `pytest -rA`, parse the log, and call it resolved only when every one of those tests passes."""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchard.errors import OrchardError
from orchard.prototime import duration
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.tasks.environments import builder_for, task_sandbox
from orchard.tasks.instance import TaskInstance
from orchard.tasks.logparse import parse_log_pytest_v2, passed
from orchard.tasks.repo import SANDBOX_ENV
from orchard.types.v1 import types_pb2 as tpb

TEST_TIMEOUT_S = 600.0
GRADE_TIMEOUT_S = 900.0
LOG_TAIL_CHARS = 4000
PATCH_DIR = "/tmp/orchard-grading"
# SWE-bench's order: a clean apply, then one that keeps the hunks that apply, then fuzzy `patch`.
APPLY_COMMANDS = ("git apply --verbose {p}", "git apply --verbose --reject {p}", "patch --batch --fuzz=5 -p1 -i {p}")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)
_STATUS = {
    "PASSED": tpb.TEST_STATUS_PASSED,
    "XFAIL": tpb.TEST_STATUS_PASSED,
    "FAILED": tpb.TEST_STATUS_FAILED,
    "XPASS": tpb.TEST_STATUS_FAILED,
    "ERROR": tpb.TEST_STATUS_ERROR,
    "SKIPPED": tpb.TEST_STATUS_SKIPPED,
}


@dataclass(frozen=True)
class GradeResult:
    """The outcome of grading one patch for one instance (SWE-bench's per-instance report, plus timings)."""

    instance_id: str
    patch_exists: bool
    patch_applied: bool
    resolved: bool
    fail_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    statuses: dict[str, str] = field(default_factory=dict)
    """Every test id the log names, with its status word."""
    log_tail: str = ""
    error: str = ""
    """Why grading itself failed (sandbox, setup, a test run past its timeout); empty when it completed."""
    duration_s: float = 0.0
    sample_index: int = 0
    value: float | None = None
    """The reward value when the grade is a score (an assistant task's Claw-Eval score, in [0, 1]); None: +1 when
    resolved, else -1."""

    def report_entry(self) -> dict[str, object]:
        """This result in SWE-bench's per-instance report shape."""
        return {
            "patch_is_None": False,
            "patch_exists": self.patch_exists,
            "patch_successfully_applied": self.patch_applied,
            "resolved": self.resolved,
            "tests_status": {
                "FAIL_TO_PASS": self.fail_to_pass,
                "PASS_TO_PASS": self.pass_to_pass,
                "FAIL_TO_FAIL": {"success": [], "failure": []},
                "PASS_TO_FAIL": {"success": [], "failure": []},
            },
            **({"error": self.error} if self.error else {}),
            # What went wrong, for every prediction that did not resolve (SWE-bench keeps it in a log file).
            **({"log_tail": self.log_tail[-LOG_TAIL_CHARS:]} if not self.resolved and self.log_tail else {}),
        }

    def to_reward(self, source: str = "orchard.tasks.grading", name: str = "swe_tests") -> tpb.Reward:
        """An OUTCOME reward: +1 resolved, -1 otherwise; ERROR status (to mask out) when grading failed."""
        if self.error:
            status = tpb.OUTCOME_STATUS_ERROR
        else:
            status = tpb.OUTCOME_STATUS_RESOLVED if self.resolved else tpb.OUTCOME_STATUS_UNRESOLVED
        tests = [
            tpb.TestResult(
                test_id=t, group=group, status=_STATUS.get(self.statuses.get(t, ""), tpb.TEST_STATUS_MISSING)
            )
            for group, lists in (
                (tpb.TEST_GROUP_FAIL_TO_PASS, self.fail_to_pass),
                (tpb.TEST_GROUP_PASS_TO_PASS, self.pass_to_pass),
            )
            for t in lists["success"] + lists["failure"]
        ]
        elapsed = duration(self.duration_s)
        details = tpb.OutcomeDetails(
            status=status,
            patch_applied=self.patch_applied,
            fail_to_pass_passed=len(self.fail_to_pass["success"]),
            fail_to_pass_total=len(self.fail_to_pass["success"]) + len(self.fail_to_pass["failure"]),
            pass_to_pass_passed=len(self.pass_to_pass["success"]),
            pass_to_pass_total=len(self.pass_to_pass["success"]) + len(self.pass_to_pass["failure"]),
            tests=tests,
            log_tail=self.log_tail,
            error=self.error,
            duration=elapsed,
        )
        value = self.value if self.value is not None else 1.0 if self.resolved else -1.0
        reward = tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, value=value, name=name, source=source, outcome=details)
        reward.create_time.GetCurrentTime()
        return reward


def evaluate_log(
    instance: TaskInstance, log: str
) -> tuple[bool, dict[str, list[str]], dict[str, list[str]], dict[str, str]]:
    """Grade a test log: (resolved, FAIL_TO_PASS split, PASS_TO_PASS split, all statuses)."""
    statuses = parse_log_pytest_v2(log)

    def split(ids: list[str]) -> dict[str, list[str]]:
        return {
            "success": [t for t in ids if passed(t, statuses)],
            "failure": [t for t in ids if not passed(t, statuses)],
        }

    f2p, p2p = split(instance.fail_to_pass), split(instance.pass_to_pass)
    return not f2p["failure"] and not p2p["failure"], f2p, p2p, statuses


def patched_files(patch: str) -> list[str]:
    """The files a git diff touches."""
    return list(dict.fromkeys(_DIFF_FILE.findall(patch)))


def file_diffs(patch: str) -> list[tuple[str, str]]:
    """A git diff cut into (file, the diff's text for that file after its `diff --git` line), in order."""
    pieces = _DIFF_FILE.split(patch)
    return list(zip(pieces[1::2], pieces[2::2], strict=True))


async def grade(
    client: AsyncSandboxClient,
    instance: TaskInstance,
    patch: str,
    *,
    sample_index: int = 0,
    test_timeout_s: float = TEST_TIMEOUT_S,
    timeout_s: float = GRADE_TIMEOUT_S,
) -> GradeResult:
    """Grade `patch` for `instance` in a fresh sandbox (deleted after). An empty patch is graded too (the
    base state), which is how a task set is checked: its FAIL_TO_PASS tests must fail there."""
    start = time.monotonic()

    def result(**fields: Any) -> GradeResult:
        return GradeResult(
            instance_id=instance.instance_id,
            patch_exists=bool(patch.strip()),
            sample_index=sample_index,
            duration_s=time.monotonic() - start,
            **fields,
        )

    try:
        if instance.environment is not None:  # built once (minutes the first time), outside the grade's own time
            await builder_for(client).prepare(instance)
        start = time.monotonic()
        async with asyncio.timeout(timeout_s):
            sandbox, head = await task_sandbox(
                client, instance, labels={"orchard.role": "grading"}, timeout=timeout_s + 60
            )
            async with sandbox:
                return await _grade_in(sandbox, instance, head, patch, test_timeout_s, result)
    except TimeoutError as err:
        if isinstance(err, OrchardError):
            return result(patch_applied=False, resolved=False, error=str(err))
        return result(patch_applied=False, resolved=False, error=f"grading took longer than {timeout_s:g}s")
    except OrchardError as err:
        return result(patch_applied=False, resolved=False, error=str(err))


async def _grade_in(
    sandbox: AsyncSandbox,
    instance: TaskInstance,
    head: str,
    patch: str,
    test_timeout_s: float,
    result: Callable[..., GradeResult],
) -> GradeResult:
    cwd = instance.workdir
    # 1. The model's patch, SWE-bench's way: the first apply command that succeeds wins.
    if patch.strip():
        model_patch = f"{PATCH_DIR}/model.patch"
        await sandbox.upload_content(patch if patch.endswith("\n") else patch + "\n", model_patch)
        script = " || ".join(f"({c.format(p=model_patch)})" for c in APPLY_COMMANDS)
        applied = await sandbox.exec(script, cwd=cwd, env=SANDBOX_ENV, timeout=60)
        if not applied.succeeded:
            return result(
                patch_applied=False, resolved=False, log_tail=(applied.stdout + applied.stderr)[-LOG_TAIL_CHARS:]
            )
    # 2. Reset the files the test patch touches to the base commit (new ones removed), then apply it.
    if instance.test_patch.strip():
        await sandbox.upload_content(instance.test_patch, f"{PATCH_DIR}/test.patch")
        resets = "; ".join(
            f"(git checkout -q {head} -- {shlex.quote(f)} 2>/dev/null || rm -f {shlex.quote(f)})"
            for f in patched_files(instance.test_patch)
        )
        tests_in = await sandbox.exec(
            f"{resets}; git apply --verbose {PATCH_DIR}/test.patch", cwd=cwd, env=SANDBOX_ENV, timeout=60
        )
        if not tests_in.succeeded:
            return result(
                patch_applied=True,
                resolved=False,
                error=f"the test patch did not apply: {(tests_in.stdout + tests_in.stderr)[-2000:]}",
            )
    # 3. Run the graded test files and parse the log.
    command = f"{instance.command} {' '.join(shlex.quote(f) for f in instance.test_files)}"
    run = await sandbox.exec(command, cwd=cwd, env=SANDBOX_ENV, timeout=test_timeout_s)
    log = run.stdout + run.stderr
    if run.timed_out:
        return result(
            patch_applied=True,
            resolved=False,
            log_tail=log[-LOG_TAIL_CHARS:],
            error=f"the tests ran past {test_timeout_s:g}s",
        )
    resolved, f2p, p2p, statuses = evaluate_log(instance, log)
    return result(
        patch_applied=True,
        resolved=resolved,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        statuses=statuses,
        log_tail=log[-LOG_TAIL_CHARS:],
    )
