"""A value-model job through the real trainer service, trained from a real experience-store export (nats-server
→ experience service → ExportTrajectories): candidates whose test runs pass resolve, the others do not, and the
held-out figures and the checkpoint's value config say the model learned to tell them apart. The backbone is
the embedded all-MiniLM-L6-v2."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from experience_helpers import NatsServer, publish_and_store, stamp
from google.protobuf.duration_pb2 import Duration
from trainer_service_helpers import trainer_service

from orchard import events
from orchard.experience.v1 import experience_pb2 as epb
from orchard.services.experience.server import build as build_experience
from orchard.services.experience.settings import ExperienceSettings
from orchard.services.value.server import build as build_value
from orchard.services.value.settings import ValueSettings
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb
from orchard.value.metrics import TIE_MARGIN
from orchard.value.model import ValueModel
from orchard.value.v1 import value_pb2 as vpb
from orchard.value.v1 import value_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PASSED = "============================= 2 passed in 0.05s =============================="
FAILED = (
    "FAILED tests/test_core.py::test_fix - AssertionError: assert 2 == 3\n"
    "========================= 1 failed, 1 passed in 0.07s ========================="
)


def candidate(run_id: str, n: int, task: int, resolved: bool) -> list[epb.RolloutEvent]:
    """One finished, graded rollout of task `task`: it edits core.py, runs the tests and submits."""
    tid = f"{run_id}-{task}-{n}"
    base = tpb.Trajectory(
        trajectory_id=tid,
        run_id=run_id,
        task_id=f"task-{task}",
        task_set="toy",
        harness="swe",
        policy=tpb.Policy(model="ref", weights_version=run_id),
        start_time=stamp(1_700_000_000),
        messages=[
            tpb.Message(role=tpb.ROLE_USER, content=f"Fix bug {task}: limit() returns {task} instead of {task + 1}.")
        ],
    )
    # Resolved candidates of one run make the same edit (a duplicate patch); the others each a wrong one.
    edit = f"+LIMIT = {task + 1}  # {run_id}" if resolved else f"+LIMIT = {task + 2 + n}"
    commands = ["cat core.py", f"sed -i 's/LIMIT = {task}/{edit[1:]}/' core.py", "python -m pytest -q"]
    outputs = [f"LIMIT = {task}\n", "", PASSED if resolved else FAILED]
    steps = []
    for i, (command, output) in enumerate(zip(commands, outputs, strict=True)):
        steps.append(
            tpb.Step(
                index=i,
                model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content=f"Step {i}."),
                actions=[tpb.ToolCall(name="bash", arguments=json.dumps({"command": command}))],
                observations=[
                    tpb.Observation(
                        message=tpb.Message(role=tpb.ROLE_TOOL, content=output), exit_code=0 if resolved or i < 2 else 1
                    )
                ],
            )
        )
    final = tpb.Trajectory()
    final.CopyFrom(base)
    final.steps.extend(steps)
    final.stop_reason = tpb.STOP_REASON_SUBMITTED
    final.final_patch = f"--- a/core.py\n+++ b/core.py\n@@ -1 +1 @@\n-LIMIT = {task}\n{edit}\n"
    final.end_time.CopyFrom(stamp(1_700_000_100))
    status = tpb.OUTCOME_STATUS_RESOLVED if resolved else tpb.OUTCOME_STATUS_UNRESOLVED
    final.rewards.append(
        tpb.Reward(
            kind=tpb.REWARD_KIND_OUTCOME,
            value=1.0 if resolved else -1.0,
            name="tests",
            outcome=tpb.OutcomeDetails(status=status),
        )
    )
    return [events.started(base), *(events.step(run_id, tid, s) for s in steps), events.finished(final)]


def history(tasks: range, runs: int = 2, per_run: int = 3) -> list[epb.RolloutEvent]:
    """`runs` runs over `tasks`, `per_run` candidates each: alternately resolved and not."""
    out = []
    for r in range(runs):
        for task in tasks:
            for n in range(per_run):
                out += candidate(f"run-{r}", n, task, resolved=(n + r) % 2 == 0)
    return out


@pytest.fixture
async def experience(tmp_path: Path, nats_server: NatsServer) -> AsyncIterator[str]:
    settings = ExperienceSettings(
        port=0,
        nats_url=nats_server.url,
        store_url=f"sqlite:///{tmp_path / 'e.db'}",
        log_format="text",
        grace_period_s=1,
    )
    server, store = await build_experience(settings)
    port = await server.start()
    await publish_and_store(nats_server.url, history(range(6)), store, timeout_s=60)
    yield f"127.0.0.1:{port}"
    await server.stop()


def value_config(**value: Any) -> pb.JobConfig:
    return pb.JobConfig(
        kind=pb.JOB_KIND_VALUE,
        dataset=pb.DatasetSource(experience=epb.TrajectoryFilter(run_ids=["run-0", "run-1"])),
        hyperparameters=pb.Hyperparameters(seed=3, epochs=4, global_batch_size=8),
        value=pb.ValueConfig(eval_fraction=0.34, best_at_n=[1, 2, 4], **value),
    )


async def wait_done(stub, job_id: str, timeout_s: int = 600) -> pb.Job:  # type: ignore[no-untyped-def]
    response = await stub.WaitJob(
        pb.WaitJobRequest(job_id=job_id, timeout=Duration(seconds=timeout_s)), timeout=timeout_s + 10
    )
    assert response.done, response.job
    return response.job


async def test_value_job_learns_from_the_experience_store(tmp_path: Path, experience: str) -> None:
    async with trainer_service(tmp_path / "jobs", experience_address=experience) as stub:
        await stub.CreateJob(pb.CreateJobRequest(config=value_config(), job_id="value-1"))
        job = await wait_done(stub, "value-1")
        assert job.state == pb.JOB_STATE_SUCCEEDED, job.error
        m = job.progress.metrics
        # 36 graded candidates, 30 distinct (task, patch) over 6 tasks with both outcomes; 2 tasks held out.
        assert m["candidates"] == 30 and m["duplicates_left_out"] == 6
        assert m["tasks_mixed"] == 6 and m["tasks_held_out"] == 2
        assert m["runs"] == 2 and m["pairs"] > 0
        assert m["auc"] > 0.9, m
        assert m["best_at_4"] == 1.0 and m["random_at_4"] < 0.6, m
        checkpoint = job.latest_checkpoint
        assert checkpoint.version == f"value-1-step-{job.progress.step}"
        served = ValueModel.load(checkpoint.path)
        assert served.config.version == checkpoint.version and served.config.job == "jobs/value-1"
        assert served.config.base_model == "all-MiniLM-L6-v2" and served.config.max_context_tokens == 512
        # The lexical part was fitted before the encoder's steps and is saved with them.
        assert served.lexical is not None and bool(served.lexical.bag.weight.abs().sum() > 0)
        assert m["lexical_fit_loss"] < 1.0, m
        assert served.config.metrics["auc"] == m["auc"]
        report = json.loads((Path(checkpoint.path) / "best_of_n.json").read_text())
        assert [row["n"] for row in report["curve"]] == [1, 2, 4] and len(report["held_out_tasks"]) == 2
        assert report["tie_margin"] == TIE_MARGIN  # value.tie_margin unset

    # The value service loads the job's checkpoint and, for a held-out task, ranks its resolved candidate first.
    held = int(report["held_out_tasks"][0].removeprefix("task-"))
    settings = ValueSettings(port=0, log_format="text", grace_period_s=1.0)
    server, _ = await build_value(settings)
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            value_stub = value_pb2_grpc.ValueServiceStub(channel)
            loaded = await value_stub.LoadModel(vpb.LoadModelRequest(checkpoint_path=checkpoint.path))
            assert loaded.model.version == checkpoint.version and loaded.model.job == "jobs/value-1"
            assert loaded.model.metrics["auc"] == m["auc"]
            group = [candidate("fresh", n, held, resolved=n == 2)[-1].rollout_finished.trajectory for n in range(4)]
            ranked = await value_stub.Rerank(
                vpb.RerankRequest(
                    task_id=f"task-{held}",
                    candidates=[vpb.Candidate(candidate_id=t.trajectory_id, trajectory=t) for t in group],
                )
            )
            assert ranked.best_candidate_id == group[2].trajectory_id, ranked
    finally:
        await server.stop()


async def test_value_job_refuses_evaluation_tasks_and_single_outcome_data(tmp_path: Path, experience: str) -> None:
    eval_file = tmp_path / "eval.jsonl"
    eval_file.write_text(
        json.dumps(
            {
                "instance_id": "task-4",
                "repo": "x/y",
                "base_commit": "0" * 40,
                "problem_statement": "p",
                "patch": "",
                "test_patch": "",
                "FAIL_TO_PASS": ["t::a"],
                "PASS_TO_PASS": [],
            }
        )
        + "\n"
    )
    async with trainer_service(tmp_path / "jobs", experience_address=experience) as stub:
        contaminated = value_config()
        contaminated.dataset.eval_task_files.append(str(eval_file))
        await stub.CreateJob(pb.CreateJobRequest(config=contaminated, job_id="leak"))
        only_resolved = value_config()
        only_resolved.dataset.experience.outcome_status = tpb.OUTCOME_STATUS_RESOLVED
        await stub.CreateJob(pb.CreateJobRequest(config=only_resolved, job_id="one-sided"))
        leak = await wait_done(stub, "leak")
        assert leak.state == pb.JOB_STATE_FAILED and "task-4" in leak.error and "contaminate" in leak.error
        one_sided = await wait_done(stub, "one-sided")
        assert one_sided.state == pb.JOB_STATE_FAILED and "both a resolved and an unresolved" in one_sided.error
