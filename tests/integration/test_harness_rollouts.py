"""SWE rollouts end to end on a real env service with real sandboxes, driven by the scripted model (a
deterministic fake policy; the real model cannot solve tasks): scripted fixes resolve every ToyRepair task
through grading, the editor tool works, command timeouts and budgets stop where they should."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.harness import (
    AgentLoop,
    Limits,
    ListSink,
    SamplingConfig,
    ScriptedModel,
    SWEHarness,
    replay,
    run_rollouts,
)
from orchard.sdk import AsyncSandboxClient
from orchard.tasks import TaskInstance, load_instances, make_report
from orchard.types.v1 import types_pb2 as tpb

TASKS = load_instances("toyrepair")
WIDE = SamplingConfig(max_step_tokens=8192)
"""The scripted model's tokens are bytes: a reply that carries a whole patch needs room."""

pytestmark = [needs_sandboxes, pytest.mark.timeout(180), needs_image(TASKS[0].image)]


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fixer(tasks: list[TaskInstance]):  # type: ignore[no-untyped-def]
    """A policy that looks around, applies the task's gold patch with bash, runs the tests and submits."""

    def policy(prompt: str, step: int) -> str:
        task = next(t for t in tasks if t.problem_statement in prompt)
        if step == 0:
            return "Let me look first.\n```bash\nls -R . | head -20\n```"
        if step == 1:
            return tool_call("bash", command=f"cat > /tmp/fix.patch <<'EOF'\n{task.patch}EOF\ngit apply /tmp/fix.patch")
        if step == 2:
            return tool_call("bash", command="python -m pytest -q")
        return tool_call("submit")

    return policy


@pytest.fixture
async def client(env: EnvServer) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        yield client


@pytest.mark.slow
async def test_scripted_fixes_resolve_every_task(client: AsyncSandboxClient) -> None:
    sink = ListSink()
    model = ScriptedModel(fixer(TASKS))
    loop = AgentLoop(model, Limits(max_steps=6), WIDE, sink=sink, run_id="it")
    started = time.monotonic()
    results = await run_rollouts(
        TASKS,
        2,
        loop=loop,
        client=client,
        concurrency=4,
        make_harness=lambda t: SWEHarness(t, client, task_set="toyrepair"),
    )
    elapsed = time.monotonic() - started
    assert len(results) == 2 * len(TASKS) and model.max_in_flight <= 4
    for result in results:
        traj = result.trajectory
        assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED, traj.stop_detail
        assert result.grade is not None, traj.task_id
        assert result.grade.resolved, (traj.task_id, result.grade.log_tail)
        assert traj.final_patch.startswith("diff --git") and "tests/" not in traj.final_patch
        assert [s.action_status for s in traj.steps] == [tpb.ACTION_STATUS_OK] * 3 + [tpb.ACTION_STATUS_SUBMITTED]
        assert (
            traj.steps[2].observations[0].exit_code == 0 and "passed" in traj.steps[2].observations[0].message.content
        )
        assert traj.rewards[0].value == 1.0 and traj.metadata["verify_status"] == "resolved"
        # The text-form action (a bash block) is answered as user text, the tool calls as tool messages.
        assert traj.messages[3].role == tpb.ROLE_USER and traj.messages[5].role == tpb.ROLE_TOOL
    report = make_report([r.grade for r in results if r.grade], [t.instance_id for t in TASKS])
    assert report["pass@1"] == 1.0
    kinds = [e.WhichOneof("event") for e in sink.events]
    assert kinds.count("rollout_finished") == kinds.count("reward_added") == 2 * len(TASKS)
    print(f"{len(results)} rollouts (4 steps, graded) in {elapsed:.1f}s: {len(results) / elapsed:.2f} rollouts/s")


async def test_editor_tool_flow(client: AsyncSandboxClient) -> None:
    task = next(t for t in TASKS if t.instance_id == "toyrepair-power-swapped-args")
    replies = [
        tool_call("editor", command="view", path="numkit/power.py"),
        tool_call("editor", command="str_replace", path="numkit/power.py", old_str="nothing like this", new_str="x"),
        tool_call(
            "editor",
            command="str_replace",
            path="numkit/power.py",
            old_str="_power(exponent, base)",
            new_str="_power(base, exponent)",
        ),
        tool_call("editor", command="create", path="NOTES.md", file_text="fixed\n"),
        tool_call("submit"),
    ]
    traj = await AgentLoop(ScriptedModel(replay(replies)), sampling=WIDE).run(SWEHarness(task, client))
    assert traj.stop_reason == tpb.STOP_REASON_SUBMITTED, traj.stop_detail
    outputs = [s.observations[0].message.content for s in traj.steps[:4]]
    assert "return scale * _power(exponent, base)" in outputs[0] and "     9\t" in outputs[0]
    assert "occurs 0 times" in outputs[1] and traj.steps[1].observations[0].exit_code == 1
    assert "edited numkit/power.py" in outputs[2] and "created NOTES.md" in outputs[3]
    assert "+    return scale * _power(base, exponent)" in traj.final_patch and "+++ b/NOTES.md" in traj.final_patch


async def test_command_timeout_and_step_budget(client: AsyncSandboxClient) -> None:
    harness = SWEHarness(TASKS[0], client, command_timeout_s=1)
    traj = await AgentLoop(ScriptedModel(replay([tool_call("bash", command="sleep 30")])), Limits(max_steps=2)).run(
        harness
    )
    assert traj.stop_reason == tpb.STOP_REASON_STEP_LIMIT and len(traj.steps) == 2
    assert traj.steps[0].action_status == tpb.ACTION_STATUS_TIMED_OUT
    assert "timed out after 1s" in traj.steps[0].observations[0].message.content
    assert traj.duration.ToNanoseconds() / 1e9 < 40  # two 1 s timeouts, not two sleep 30s
    assert not [s async for s in client.list_sandboxes()]  # the harness deleted its sandbox


async def test_wall_clock_budget_stops_a_long_command(client: AsyncSandboxClient) -> None:
    harness = SWEHarness(TASKS[0], client, command_timeout_s=60)
    started = time.monotonic()
    traj = await AgentLoop(ScriptedModel(replay([tool_call("bash", command="sleep 60")])), Limits(wall_clock_s=3)).run(
        harness
    )
    assert traj.stop_reason == tpb.STOP_REASON_TIME_LIMIT and time.monotonic() - started < 40  # not sleep 60
    assert not [s async for s in client.list_sandboxes()]


async def test_setup_failure_is_an_env_error(client: AsyncSandboxClient) -> None:
    broken = TASKS[0].model_copy(update={"base_commit": "0" * 40})
    traj = await AgentLoop(ScriptedModel(replay([tool_call("submit")]))).run(SWEHarness(broken, client))
    assert traj.stop_reason == tpb.STOP_REASON_ENV_ERROR and "update base_commit" in traj.stop_detail
    assert not traj.steps
