"""Grading as SWE-bench does, in real sandboxes of a real env service: every ToyRepair gold patch resolves its
task, the empty patch (the base state) does not, and partial, broken or test-tampering patches are graded right."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.sdk import AsyncSandboxClient
from orchard.tasks import grade, load_instances, make_report

TASKS = load_instances("toyrepair-extended")  # the quick 8 and 16 more
LEAP = next(t for t in TASKS if t.instance_id == "toyrepair-leap-year-logic")


pytestmark = [needs_sandboxes, pytest.mark.timeout(180), needs_image(TASKS[0].image)]


@pytest.fixture
async def client(env: EnvServer) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        yield client


@pytest.mark.slow
async def test_gold_patches_resolve_and_empty_patches_do_not(client: AsyncSandboxClient) -> None:
    """Validates the task set: at base every FAIL_TO_PASS test fails and every PASS_TO_PASS test passes."""
    started = time.monotonic()
    gold = await asyncio.gather(*(grade(client, t, t.patch) for t in TASKS))
    empty = await asyncio.gather(*(grade(client, t, "", sample_index=1) for t in TASKS))
    elapsed = time.monotonic() - started
    for task, g, e in zip(TASKS, gold, empty, strict=True):
        assert g.resolved and g.patch_applied and not g.error, (task.instance_id, g.error, g.log_tail)
        assert not e.resolved and not e.patch_exists and not e.error, task.instance_id
        assert e.fail_to_pass["failure"] == task.fail_to_pass, task.instance_id
        assert e.pass_to_pass["success"] == task.pass_to_pass, task.instance_id
    report = make_report([*gold, *empty], [t.instance_id for t in TASKS])
    assert report["pass@1"] == 0.5 and report["empty_patch_instances"] == len(TASKS)
    json.dumps(report)  # it is plain JSON
    print(
        f"graded {2 * len(TASKS)} patches in {elapsed:.1f}s; per grade "
        f"{sum(r.duration_s for r in gold + empty) / (2 * len(TASKS)):.2f}s"
    )


async def test_partial_fix_is_unresolved(client: AsyncSandboxClient) -> None:
    partial = LEAP.patch.replace(
        "+    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)",
        "+    return year % 4 == 0 and year % 100 != 0",
    )
    assert partial != LEAP.patch
    result = await grade(client, LEAP, partial)
    assert result.patch_applied and not result.resolved and not result.error
    assert result.fail_to_pass == {
        "success": ["tests/test_leap_hidden.py::test_leap_year"],
        "failure": ["tests/test_leap_hidden.py::test_divisible_by_400"],
    }
    reward = result.to_reward()
    assert reward.value == -1.0 and reward.outcome.fail_to_pass_passed == 1


async def test_patch_that_does_not_apply(client: AsyncSandboxClient) -> None:
    broken = LEAP.patch.replace("year % 400 == 0\n", "year % 401 == 0\n", 1)
    result = await grade(client, LEAP, broken)
    assert result.patch_exists and not result.patch_applied and not result.resolved and not result.error


async def test_hidden_tests_override_the_models_test_edits(client: AsyncSandboxClient) -> None:
    """A patch that also writes the hidden test file (to make it pass trivially) is reset to the test patch's."""
    cheat = (
        "diff --git a/tests/test_leap_hidden.py b/tests/test_leap_hidden.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_leap_hidden.py\n@@ -0,0 +1,2 @@\n+def test_leap_year():\n+    pass\n"
    )
    result = await grade(client, LEAP, cheat)
    assert result.patch_applied and not result.resolved
    assert result.fail_to_pass["failure"] == LEAP.fail_to_pass
