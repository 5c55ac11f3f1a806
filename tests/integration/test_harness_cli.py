"""The paths behind `orchard rollout` and `orchard eval --run`, end to end on real services: rollouts on a real
env service publish their events through a real EventPublisher to a real nats-server, the real experience
service stores them, and the report read back from it equals the one the rollouts produced. The policy is the
scripted model (a deterministic fake: the real model cannot solve tasks, and a report needs resolved ones)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes
from experience_helpers import NatsServer, experience_service, free_port

from orchard import events
from orchard.cli import tasksets
from orchard.cli.eval import report_of
from orchard.cli.runs import grade_from_trajectory, stored_run
from orchard.errors import NotFound
from orchard.harness import (
    AgentLoop,
    Limits,
    SamplingConfig,
    ScriptedModel,
    SWEHarness,
    run_rollouts,
)
from orchard.sdk import AsyncSandboxClient
from orchard.tasks import TaskInstance, load_instances, make_report
from orchard.tasks.report import format_table

TASKS = load_instances("toyrepair")
ORCHARD = Path(sys.executable).with_name("orchard")


@pytest.fixture
async def experience(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[str]:
    """The experience service consuming `nats_server` into SQLite; yields its address."""
    async with experience_service(nats_server.url, tmp_path / "e.db") as address:
        yield address


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def half_fixer(tasks: list[TaskInstance]):  # type: ignore[no-untyped-def]
    """Per task, the first rollout to start applies the gold patch and submits, the second submits unchanged:
    every task ends 1/2 resolved, so pass@1 = 0.5 and pass@2 = 1.0."""
    started: dict[str, int] = {}

    def policy(prompt: str, step: int) -> str:
        task = next(t for t in tasks if t.problem_statement in prompt)
        if step == 0:
            started[task.instance_id] = started.get(task.instance_id, 0) + 1
            if started[task.instance_id] > 1:
                return "plan-giveup " + tool_call("submit")
            return "plan-fix " + tool_call(
                "bash", command=f"cat > /tmp/fix.patch <<'EOF'\n{task.patch}EOF\ngit apply /tmp/fix.patch"
            )
        return tool_call("submit")

    return policy


@needs_sandboxes
@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_image(TASKS[0].image)
async def test_published_rollouts_read_back_as_the_same_report(
    env: EnvServer, nats_server: NatsServer, experience: str, tmp_path: Path
) -> None:
    """What `orchard rollout` publishes, `orchard eval --run` reads back: every rollout, the same report."""
    k = 2
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        async with events.EventPublisher.connect(nats_server.url) as publisher:
            loop = AgentLoop(
                ScriptedModel(half_fixer(TASKS)),
                Limits(max_steps=4),
                SamplingConfig(max_step_tokens=8192),
                sink=publisher,
                run_id="cli-it",
            )
            results = await run_rollouts(
                TASKS,
                k,
                loop=loop,
                client=client,
                concurrency=4,
                make_harness=lambda t: SWEHarness(t, client, task_set="toyrepair"),
            )
        # 4 events per fixing rollout (started, 2 steps, finished) and 3 per giving-up one, plus each reward.
        assert publisher.stats.published == len(TASKS) * (5 + 4) and publisher.stats.pending == 0
    expected = make_report(
        [r.grade for r in results if r.grade], [t.instance_id for t in TASKS], run_id="cli-it", model="scripted"
    )
    assert (expected["pass@1"], expected["pass@2"], expected["resolved_instances"]) == (0.5, 1.0, len(TASKS))

    stored = await stored_run(experience, "cli-it", wait_s=30)
    assert len(stored) == len(TASKS) * k
    assert {(t.task_id, t.sample_index) for t in stored} == {(t.instance_id, s) for t in TASKS for s in range(k)}
    back, _ = report_of(stored, [g for g in map(grade_from_trajectory, stored) if g], tasksets.load("toyrepair"))

    def timeless(r: dict[str, object]) -> dict[str, object]:
        return {**r, "tasks": [{**t, "mean_grading_s": None} for t in r["tasks"]]}  # type: ignore[attr-defined]

    assert timeless(back) == timeless(expected)

    # The command itself prints the same SWE-bench-style table and writes the same report.
    # (a child process, so the service in this test's event loop can answer it)
    cli = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "eval",
        "--run",
        "cli-it",
        "--experience-address",
        experience,
        "--report",
        str(tmp_path / "report.json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    assert format_table(expected) in out.decode()
    assert f"pass@1 0.500  pass@2 1.000  resolved {len(TASKS)}/{2 * len(TASKS)}" in out.decode()
    assert f"read {2 * len(TASKS)} rollouts of run cli-it back from the experience service" in out.decode()
    assert timeless(json.loads((tmp_path / "report.json").read_text())) == timeless(expected)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_web_rollouts_are_stored_and_reported_by_success(
    env: EnvServer, nats_server: NatsServer, experience: str, tmp_path: Path
) -> None:
    """`orchard rollout --tasks web --policy scripted` runs the bundled web tasks in browser sandboxes, publishes
    them, and `orchard eval --run --tasks web` reads the same success table back from the experience service."""
    ids = ["form-signup", "search-cheapest", "shop-teapots", "nav-release"]
    rollout = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "rollout",
        "--tasks",
        "web",
        "--ids",
        *ids,
        "--policy",
        "scripted",
        "-n",
        "2",
        "--max-steps",
        "30",
        "--env-address",
        f"127.0.0.1:{env.server.port}",
        "--nats-url",
        nats_server.url,
        "--run-id",
        "web-it",
        "--out",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(rollout.communicate(), 240)
    assert rollout.returncode == 0, err.decode()
    table = out.decode()
    assert "SUCCEEDED" in table and "pass@1 1.000  pass@2 1.000  success 8/8  errors 0" in table, table
    assert (
        "success by category: form 2/2 (100%), navigation 2/2 (100%), search 2/2 (100%), shopping 2/2 (100%)" in table
    )
    assert "8/8 rollouts  succeeded 8/8" in err.decode()  # the progress line
    stored = [json.loads(line) for line in (tmp_path / "web-it" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["taskId"] for t in stored) == sorted(ids * 2)

    cli = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "eval",
        "--run",
        "web-it",
        "--tasks",
        "web",
        "--experience-address",
        experience,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    back = out.decode()
    assert table.split("\nsuccess by category")[0] in back  # the same per-task table and summary
    assert "read 8 rollouts of run web-it back from the experience service" in back

    regrade = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "eval",
        "--run",
        "web-it",
        "--tasks",
        "web",
        "--regrade",
        "--experience-address",
        experience,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(regrade.communicate(), 60)
    assert regrade.returncode != 0 and "--gold and --regrade do not apply to them" in err.decode()


CLAW_IDS = ["reply-question-000", "schedule-meeting-002", "update-csv-007", "outside-recipient-013"]


@needs_sandboxes
@needs_image("claw")
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_claw_rollouts_are_scored_stored_and_trained_on(
    env: EnvServer, nats_server: NatsServer, experience: str, tmp_path: Path
) -> None:
    """The Claw recipe on real parts: `orchard rollout --tasks claw --policy scripted` runs bundled assistant tasks
    in sandboxes with real mail and calendar servers, scores them as Claw-Eval does and publishes them; `orchard
    eval --run --tasks claw` reads the same figures back; one SFT round on the stored trajectories runs through
    the trainer (a tiny model, so it takes seconds)."""
    from trainer_service_helpers import tiny_model

    from orchard.services.trainer import server as trainer_server
    from orchard.services.trainer.settings import TrainerSettings

    rollout = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "rollout",
        "--tasks",
        "claw",
        "--ids",
        *CLAW_IDS,
        "--policy",
        "scripted",
        "-n",
        "3",
        "--concurrency",
        "4",
        "--max-steps",
        "20",
        "--env-address",
        f"127.0.0.1:{env.server.port}",
        "--nats-url",
        nats_server.url,
        "--run-id",
        "claw-it",
        "--out",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(rollout.communicate(), 420)
    assert rollout.returncode == 0, err.decode()
    table = out.decode()
    assert "success 12/12  errors 0" in table, table
    assert "score 1.000  pass rate 1.000  pass@3 1.000  pass^3 1.000  tasks 4/4  runs 12" in table, table
    stored = [json.loads(line) for line in (tmp_path / "claw-it" / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["rewards"][-1]["value"] == 1.0 and t["harness"] == "orchard-assistant" for t in stored)

    cli = await asyncio.create_subprocess_exec(
        str(ORCHARD),
        "eval",
        "--run",
        "claw-it",
        "--tasks",
        "claw",
        "--experience-address",
        experience,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    back, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    assert "pass@3 1.000  pass^3 1.000  tasks 4/4  runs 12" in back.decode(), back.decode()

    tiny = tiny_model(tmp_path / "tiny")
    trainer, _ = await trainer_server.build(
        TrainerSettings(
            port=0, jobs_dir=tmp_path / "jobs", log_format="text", grace_period_s=1, experience_address=experience
        )
    )
    address = f"127.0.0.1:{await trainer.start()}"
    try:
        train = await asyncio.create_subprocess_exec(
            str(ORCHARD),
            "train",
            "--run",
            "claw-it",
            "--epochs",
            "1",
            "--batch",
            "4",
            "--max-seq-len",
            "4096",
            "--job-id",
            "claw-sft",
            "--trainer-address",
            address,
            "--base-model",
            str(tiny),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(train.communicate(), 240)
        assert train.returncode == 0, out.decode() + err.decode()
        assert "job claw-sft SUCCEEDED in " in out.decode() and "3 steps on 12 samples" in out.decode(), out.decode()
    finally:
        await trainer.stop()


async def test_eval_of_an_unknown_run_says_so(experience: str) -> None:
    with pytest.raises(NotFound, match="run 'nope' has no rollouts in the experience service"):
        await stored_run(experience, "nope", wait_s=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["rollout", "--nats-url", f"nats://127.0.0.1:{free_port()}"], "no NATS server answered at nats://127.0.0.1:"),
        (
            ["eval", "--run", "r1", "--experience-address", f"127.0.0.1:{free_port()}"],
            "cannot reach the experience service at 127.0.0.1:",
        ),
    ],
)
def test_commands_say_to_start_the_stack(argv: list[str], message: str) -> None:
    """Without the stack, both commands fail at once with what to do (nothing listens on the free ports)."""
    run = subprocess.run(
        [str(ORCHARD), *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ORCHARD_ENV_ADDRESS": f"127.0.0.1:{free_port()}"},
    )
    assert run.returncode == 1 and message in run.stderr and "orchard up" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
