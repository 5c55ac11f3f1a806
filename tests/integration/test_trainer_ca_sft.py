"""A credit-assignment SFT job through the real trainer service: resolved trajectories train every turn, unresolved
ones only their rise-segment turns, from the annotator's key-step values.

The annotator here is a scripted InferenceService (a real gRPC server on a free port, answering Chat with fixed
key-step JSON): no model small enough for this machine writes the annotation JSON reliably, and the test pins
the job's handling of the annotation, not a model's judgement. The policy being trained is a real tiny model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from trainer_service_helpers import tiny_model, trainer_service

from orchard.inference.v1 import inference_pb2 as ipb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

pytestmark = pytest.mark.slow


class ScriptedAnnotator(inference_pb2_grpc.InferenceServiceServicer):
    """Answers every Chat with `reply`, and records the prompts it got."""

    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.prompts: list[ipb.ChatRequest] = []

    async def Chat(self, request: ipb.ChatRequest, context: grpc.aio.ServicerContext) -> ipb.ChatResponse:
        self.prompts.append(request)
        return ipb.ChatResponse(choices=[ipb.Choice(text=self.reply)], model=request.model)


@pytest.fixture
async def annotator() -> AsyncIterator[tuple[ScriptedAnnotator, str]]:
    # Values over states s_0..s_4: a rise over s_1 -> s_3, then a fall to the failed end.
    servicer = ScriptedAnnotator(
        json.dumps(
            {
                "key_steps": [
                    {"step": 0, "value": 0.1},
                    {"step": 1, "value": 0.1},
                    {"step": 3, "value": 0.7},
                    {"step": 4, "value": 0.0},
                ]
            }
        )
    )
    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(None)


def trajectory(i: int, resolved: bool) -> tpb.Trajectory:
    """A 4-step trajectory: each step an assistant command and its tool observation."""
    t = tpb.Trajectory(trajectory_id=f"t{i}", task_id=f"task-{i}", policy=tpb.Policy(model="teacher-x"))
    t.messages.append(tpb.Message(role=tpb.ROLE_SYSTEM, content="You fix bugs."))
    t.messages.append(tpb.Message(role=tpb.ROLE_USER, content=f"Fix bug {i} in calc.py."))
    for s, command in enumerate(["ls", "cat calc.py", "run_tests", "submit"]):
        t.messages.append(tpb.Message(role=tpb.ROLE_ASSISTANT, content=f"step {s}: {command}"))
        t.messages.append(tpb.Message(role=tpb.ROLE_TOOL, content=f"output of {command}"))
        t.steps.append(tpb.Step(index=s, model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content=command)))
    status = tpb.OUTCOME_STATUS_RESOLVED if resolved else tpb.OUTCOME_STATUS_UNRESOLVED
    t.rewards.append(
        tpb.Reward(
            kind=tpb.REWARD_KIND_OUTCOME, value=1.0 if resolved else -1.0, outcome=tpb.OutcomeDetails(status=status)
        )
    )
    return t


async def test_ca_sft_job_trains_resolved_and_rise_segments(tmp_path: Path, annotator: tuple) -> None:  # type: ignore[type-arg]
    servicer, address = annotator
    model = tiny_model(tmp_path / "tiny")
    data = tmp_path / "trajectories.jsonl"
    data.write_text(
        "".join(json_format.MessageToJson(trajectory(i, resolved=i < 2), indent=None) + "\n" for i in range(4))
    )
    async with trainer_service(tmp_path / "jobs", inference_address=address) as stub:
        config = pb.JobConfig(
            kind=pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT,
            base_model=str(model),
            dataset=pb.DatasetSource(path=str(data)),
            hyperparameters=pb.Hyperparameters(learning_rate=1e-3, seed=0, global_batch_size=4),
            credit_assignment_sft=pb.CreditAssignmentSftConfig(annotator_model="teacher-big"),
        )
        await stub.CreateJob(pb.CreateJobRequest(config=config, job_id="ca"))
        done = (await stub.WaitJob(pb.WaitJobRequest(job_id="ca"), timeout=180)).job
    assert done.state == pb.JOB_STATE_SUCCEEDED, done.error
    metrics = done.progress.metrics
    # Two resolved samples plus the two unresolved ones, each with one rise segment (s_1 -> s_3).
    assert metrics["samples"] == 4 and metrics["rise_segments"] == 2 and metrics["annotation_failures"] == 0
    # Only the unresolved trajectories were annotated, by the configured annotator, seeing the outcome.
    assert len(servicer.prompts) == 2 and {p.model for p in servicer.prompts} == {"teacher-big"}
    assert all("NOT resolved" in p.messages[-1].content for p in servicer.prompts)


async def test_unparseable_annotations_leave_only_resolved_samples(tmp_path: Path, annotator: tuple) -> None:  # type: ignore[type-arg]
    servicer, address = annotator
    servicer.reply = "I think it went fine."  # no JSON
    model = tiny_model(tmp_path / "tiny")
    data = tmp_path / "trajectories.jsonl"
    data.write_text(
        "".join(json_format.MessageToJson(trajectory(i, resolved=i == 0), indent=None) + "\n" for i in range(3))
    )
    async with trainer_service(tmp_path / "jobs", inference_address=address) as stub:
        config = pb.JobConfig(
            kind=pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT,
            base_model=str(model),
            dataset=pb.DatasetSource(path=str(data)),
            hyperparameters=pb.Hyperparameters(seed=0),
        )
        await stub.CreateJob(pb.CreateJobRequest(config=config, job_id="ca-bad"))
        done = (await stub.WaitJob(pb.WaitJobRequest(job_id="ca-bad"), timeout=180)).job
    assert done.state == pb.JOB_STATE_SUCCEEDED, done.error
    assert done.progress.metrics["samples"] == 1 and done.progress.metrics["annotation_failures"] == 2
    assert {p.model for p in servicer.prompts} == {"teacher-x"}  # each trajectory's own policy by default
