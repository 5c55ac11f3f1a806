"""The trainer service through its real gRPC API: SFT jobs run in real worker processes on a tiny real model,
stream progress and checkpoints, are cancelled, survive a killed worker and a restarted service, and refuse bad
requests with clear statuses."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from trainer_service_helpers import chat_dataset, sft_config, tiny_model, trainer_service

from orchard.trainer.v1 import trainer_pb2 as pb

pytestmark = pytest.mark.slow
DONE = {pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return chat_dataset(tmp_path / "data.jsonl")


async def wait_done(stub, job_id: str, timeout_s: float = 120) -> pb.Job:  # type: ignore[no-untyped-def]
    response = await stub.WaitJob(
        pb.WaitJobRequest(job_id=job_id, timeout=Duration(seconds=int(timeout_s))), timeout=timeout_s + 10
    )
    assert response.done, response.job
    return response.job


async def first_checkpoint(stub, job_id: str) -> pb.Checkpoint:  # type: ignore[no-untyped-def]
    async for event in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id=job_id)):
        if event.WhichOneof("event") == "checkpoint":
            return event.checkpoint
    raise AssertionError("the job ended without a checkpoint")


def data_loss(model_dir: str, data: Path) -> float:
    """The mean assistant-token loss of a checkpoint on the dataset, computed outside the trainer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from orchard.trainers.data import TemplateRenderer, openai_sample
    from orchard.trainers.sft import pack, sft_loss, token_logprobs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    samples = [openai_sample(TemplateRenderer(tokenizer), json.loads(line)) for line in data.read_text().splitlines()]
    packed = pack(samples, max(len(s.token_ids) for s in samples))
    with torch.no_grad():
        logits = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=packed.attention_mask()
        ).logits
    return float(sft_loss(token_logprobs(logits, packed.input_ids), packed.loss_mask))


async def test_sft_job_streams_progress_and_checkpoints_and_learns(tiny: Path, data: Path, tmp_path: Path) -> None:
    async with trainer_service(tmp_path / "jobs") as stub:
        config = sft_config(tiny, data, epochs=4, global_batch_size=4, save_every_steps=3)
        job = (await stub.CreateJob(pb.CreateJobRequest(config=config, job_id="sft-1", labels={"team": "a"}))).job
        assert job.state == pb.JOB_STATE_QUEUED and job.name == "jobs/sft-1"
        assert job.config.output_dir == str((tmp_path / "jobs" / "sft-1").resolve())
        events = [e async for e in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id="sft-1"))]
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "job" and kinds[-1] == "job"
        assert events[-1].job.state == pb.JOB_STATE_SUCCEEDED, events[-1].job.error
        steps = [e.progress.step for e in events if e.WhichOneof("event") == "progress"]
        assert steps == list(range(steps[0], 9)) and steps[-1] == 8  # 8 samples / 4 per step * 4 epochs
        progress = [e.progress for e in events if e.WhichOneof("event") == "progress"]
        assert progress[-1].total_steps == 8 and progress[-1].epoch == pytest.approx(4.0)
        assert progress[-1].metrics["tokens_per_second"] > 0 and progress[-1].metrics["trained_tokens"] > 0
        checkpoints = [e.checkpoint for e in events if e.WhichOneof("event") == "checkpoint"]
        assert [c.step for c in checkpoints] == [3, 6, 8] and [c.is_final for c in checkpoints] == [0, 0, 1]

        done = await wait_done(stub, "sft-1")
        assert done.latest_checkpoint.version == "sft-1-step-8" and done.progress.step == 8
        listed = (await stub.ListCheckpoints(pb.ListCheckpointsRequest(job_id="sft-1"))).checkpoints
        assert [c.version for c in listed] == ["sft-1-step-3", "sft-1-step-6", "sft-1-step-8"]
        manifest = json.loads((Path(listed[-1].path) / "manifest.json").read_text())
        assert manifest["is_final"] and manifest["kind"] == "JOB_KIND_SFT" and "model.safetensors" in manifest["files"]
    # The final weights fit the data better than the base model, measured outside the trainer.
    before, after = data_loss(str(tiny), data), data_loss(listed[-1].path, data)
    assert after < before - 0.3, (before, after)


async def test_cancel_a_running_and_a_queued_job(tiny: Path, data: Path, tmp_path: Path) -> None:
    async with trainer_service(tmp_path / "jobs", max_running_jobs=1) as stub:
        long = sft_config(tiny, data, epochs=500, global_batch_size=4, save_every_steps=2)
        await stub.CreateJob(pb.CreateJobRequest(config=long, job_id="long"))
        await stub.CreateJob(pb.CreateJobRequest(config=long, job_id="waiting"))
        await first_checkpoint(stub, "long")
        queued = (await stub.GetJob(pb.GetJobRequest(job_id="waiting"))).job
        assert queued.state == pb.JOB_STATE_QUEUED  # one job runs at a time

        cancelled = (await stub.CancelJob(pb.CancelJobRequest(job_id="waiting"))).job
        assert cancelled.state == pb.JOB_STATE_CANCELLED and not cancelled.HasField("start_time")
        stopped = (await stub.CancelJob(pb.CancelJobRequest(job_id="long"))).job
        assert stopped.state == pb.JOB_STATE_CANCELLED
        assert 2 <= stopped.progress.step < 1000 and stopped.latest_checkpoint.step >= 2  # checkpoints are kept
        again = (await stub.CancelJob(pb.CancelJobRequest(job_id="long"))).job  # cancelling an ended job: no-op
        assert again.state == pb.JOB_STATE_CANCELLED and again.end_time == stopped.end_time
        listed = (await stub.ListJobs(pb.ListJobsRequest(state=pb.JOB_STATE_CANCELLED))).jobs
        assert sorted(j.job_id for j in listed) == ["long", "waiting"]


async def test_a_killed_worker_is_restarted_from_its_latest_checkpoint(tiny: Path, data: Path, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    async with trainer_service(jobs) as stub:
        config = sft_config(tiny, data, epochs=6, global_batch_size=4, save_every_steps=4)
        await stub.CreateJob(pb.CreateJobRequest(config=config, job_id="crashy"))
        ckpt = await first_checkpoint(stub, "crashy")
        assert ckpt.step == 4
        os.killpg(int((jobs / "crashy" / "worker.pid").read_text()), signal.SIGKILL)  # as the OOM killer would
        done = await wait_done(stub, "crashy")
        assert done.state == pb.JOB_STATE_SUCCEEDED, done.error
        assert done.progress.step == 12 and done.latest_checkpoint.step == 12
    log = (jobs / "crashy" / "worker.log").read_text()
    resumed = re.search(r"resuming crashy from step (\d+)", log)
    assert resumed is not None, log[-2000:]
    # The second run started from a checkpoint (step 4, or 8 if the kill came late), never from scratch.
    assert int(resumed.group(1)) in (4, 8)
    events = [json.loads(line) for line in (jobs / "crashy" / "events.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["kind"] == "progress"]
    assert steps[-1] == 12 and set(range(1, 13)) <= set(steps) and len(steps) <= 12 + 4


async def test_a_restarted_service_resumes_its_running_job(tiny: Path, data: Path, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    async with trainer_service(jobs) as stub:
        config = sft_config(tiny, data, epochs=6, global_batch_size=4, save_every_steps=4)
        await stub.CreateJob(pb.CreateJobRequest(config=config, job_id="survivor", request_id="req-1"))
        await first_checkpoint(stub, "survivor")
    # The service stopped (its worker killed); a new one on the same folder takes the job back.
    state = json.loads((jobs / "survivor" / "job.json").read_text())["state"]
    assert state == "JOB_STATE_RUNNING"
    async with trainer_service(jobs) as stub:
        done = await wait_done(stub, "survivor")
        assert done.state == pb.JOB_STATE_SUCCEEDED, done.error
        assert done.progress.step == 12
        # The idempotency key survives the restart too.
        again = (await stub.CreateJob(pb.CreateJobRequest(config=config, request_id="req-1"))).job
        assert again.job_id == "survivor"


async def test_bad_requests_get_clear_statuses(tiny: Path, data: Path, tmp_path: Path) -> None:
    async with trainer_service(tmp_path / "jobs") as stub:

        async def code(config: pb.JobConfig, **kw: Any) -> tuple[grpc.StatusCode, str]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.CreateJob(pb.CreateJobRequest(config=config, **kw))
            return err.value.code(), err.value.details()

        good = sft_config(tiny, data)
        no_kind = pb.JobConfig(dataset=good.dataset)
        assert (await code(no_kind))[0] == grpc.StatusCode.INVALID_ARGUMENT
        value = pb.JobConfig(
            kind=pb.JOB_KIND_VALUE, dataset=good.dataset, value=pb.ValueConfig(head=pb.VALUE_HEAD_YES_TOKEN)
        )
        assert (await code(value))[0] == grpc.StatusCode.UNIMPLEMENTED
        value.value.head = pb.VALUE_HEAD_SCALAR
        value.value.eval_fraction = 1.0
        c, msg = await code(value)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "eval_fraction" in msg
        value.value.eval_fraction = 0.2
        value.value.tie_margin = 1.5
        c, msg = await code(value)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "value.tie_margin must be within [0, 1]" in msg, msg
        value.value.ClearField("tie_margin")
        value.base_model = str(tmp_path / "no-backbone")
        c, msg = await code(value)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "no-backbone" in msg and "config.json" in msg
        mismatch = pb.JobConfig(kind=pb.JOB_KIND_SFT, dataset=good.dataset, rl=pb.RlConfig())
        c, msg = await code(mismatch)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "config.rl" in msg
        missing = pb.JobConfig(kind=pb.JOB_KIND_SFT, dataset=pb.DatasetSource(path=str(tmp_path / "nope.jsonl")))
        assert (await code(missing))[0] == grpc.StatusCode.NOT_FOUND
        no_model = pb.JobConfig(kind=pb.JOB_KIND_SFT, base_model=str(tmp_path / "no-model"), dataset=good.dataset)
        assert (await code(no_model))[0] == grpc.StatusCode.NOT_FOUND
        no_data = pb.JobConfig(kind=pb.JOB_KIND_SFT)
        assert (await code(no_data))[0] == grpc.StatusCode.INVALID_ARGUMENT
        rl_without_tasks = pb.JobConfig(kind=pb.JOB_KIND_RL, dataset=good.dataset.__class__())
        assert (await code(rl_without_tasks))[0] == grpc.StatusCode.INVALID_ARGUMENT
        negative = sft_config(tiny, data, max_steps=-1)
        c, msg = await code(negative)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "max_steps" in msg
        extra = sft_config(tiny, data)
        extra.extra_args["magic"] = "1"
        assert (await code(extra))[0] == grpc.StatusCode.INVALID_ARGUMENT
        assert (await code(good, job_id="Bad_Id"))[0] == grpc.StatusCode.INVALID_ARGUMENT
        rl = pb.JobConfig(kind=pb.JOB_KIND_RL, dataset=pb.DatasetSource(path="toyrepair"))
        rl.rl.algorithm = pb.RL_ALGORITHM_GSPO
        assert (await code(rl))[0] == grpc.StatusCode.UNIMPLEMENTED
        rl.rl.algorithm = pb.RL_ALGORITHM_GRPO
        rl.rl.max_staleness = 3
        c, msg = await code(rl)
        assert c == grpc.StatusCode.INVALID_ARGUMENT and "max_staleness" in msg
        rl.rl.max_staleness = 0
        rl.compute.cpu_processes = 2
        assert (await code(rl))[0] == grpc.StatusCode.UNIMPLEMENTED
        rl.compute.cpu_processes = 0
        rl.dataset.path = "no-such-task-set"
        assert (await code(rl))[0] == grpc.StatusCode.NOT_FOUND
        eval_unknown = sft_config(tiny, data)
        eval_unknown.dataset.eval_task_files.append("no-such-set")
        assert (await code(eval_unknown))[0] == grpc.StatusCode.NOT_FOUND

        await stub.CreateJob(pb.CreateJobRequest(config=good, job_id="dup"))
        assert (await code(good, job_id="dup"))[0] == grpc.StatusCode.ALREADY_EXISTS
        for call, request in [
            (stub.GetJob, pb.GetJobRequest(job_id="ghost")),
            (stub.CancelJob, pb.CancelJobRequest(job_id="ghost")),
            (stub.WaitJob, pb.WaitJobRequest(job_id="ghost")),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(request)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND and "ghost" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListJobs(pb.ListJobsRequest(page_token="garbage"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A job whose data leaks an evaluation task fails before training, saying which.
        eval_file = tmp_path / "eval.jsonl"
        eval_file.write_text(
            json.dumps({"instance_id": "toy-3", "repo": "o/r", "problem_statement": "p", "FAIL_TO_PASS": ["t::a"]})
            + "\n"
        )
        leaky = sft_config(tiny, data)
        leaky.dataset.eval_task_files.append(str(eval_file))
        await stub.CreateJob(pb.CreateJobRequest(config=leaky, job_id="leaky"))
        failed = await wait_done(stub, "leaky")
        assert failed.state == pb.JOB_STATE_FAILED and "toy-3" in failed.error and "evaluation" in failed.error
        assert (await wait_done(stub, "dup")).state == pb.JOB_STATE_SUCCEEDED  # the service went on


async def test_list_jobs_filters_and_pages(tiny: Path, data: Path, tmp_path: Path) -> None:
    async with trainer_service(tmp_path / "jobs") as stub:
        config = sft_config(tiny, data, max_steps=1)
        for i in range(5):
            await stub.CreateJob(pb.CreateJobRequest(config=config, job_id=f"j{i}", labels={"even": str(i % 2 == 0)}))
        seen, token = [], ""
        while True:
            page = await stub.ListJobs(pb.ListJobsRequest(page_size=2, page_token=token))
            seen += [j.job_id for j in page.jobs]
            token = page.next_page_token
            if not token:
                break
        assert seen == ["j4", "j3", "j2", "j1", "j0"]  # newest first, each once
        even = (await stub.ListJobs(pb.ListJobsRequest(label_selector={"even": "True"}))).jobs
        assert [j.job_id for j in even] == ["j4", "j2", "j0"]
        assert not (await stub.ListJobs(pb.ListJobsRequest(kind=pb.JOB_KIND_RL))).jobs
        # Paging is the point, not the runs: cancel them rather than wait for five worker starts one after another
        # (over the test's 120 s on a busy machine); one that finished first stays succeeded.
        for i in range(5):
            await stub.CancelJob(pb.CancelJobRequest(job_id=f"j{i}"))
        for i in range(5):
            assert (await wait_done(stub, f"j{i}")).state in (pb.JOB_STATE_CANCELLED, pb.JOB_STATE_SUCCEEDED)


async def test_wait_job_returns_when_its_timeout_passes(tiny: Path, data: Path, tmp_path: Path) -> None:
    async with trainer_service(tmp_path / "jobs") as stub:
        await stub.CreateJob(pb.CreateJobRequest(config=sft_config(tiny, data, epochs=500), job_id="slow"))
        started = asyncio.get_running_loop().time()
        response = await stub.WaitJob(pb.WaitJobRequest(job_id="slow", timeout=Duration(seconds=1)))
        assert not response.done and response.job.state in (pb.JOB_STATE_QUEUED, pb.JOB_STATE_RUNNING)
        assert asyncio.get_running_loop().time() - started < 30  # its 1 s timeout, long before the job's end
        await stub.CancelJob(pb.CancelJobRequest(job_id="slow"))


async def test_two_cpu_processes_train_the_same_as_one(tiny: Path, data: Path, tmp_path: Path) -> None:
    """torchrun + FSDP2 on gloo through a real job: the same losses and final weights as one process."""
    jobs = tmp_path / "jobs"
    async with trainer_service(jobs, max_running_jobs=2) as stub:
        for job_id, processes in [("one", 1), ("two", 2)]:
            config = sft_config(tiny, data, epochs=2, max_steps=3, global_batch_size=4, micro_batch_size=2)
            config.compute.cpu_processes = processes
            await stub.CreateJob(pb.CreateJobRequest(config=config, job_id=job_id))
        one, two = await wait_done(stub, "one", 240), await wait_done(stub, "two", 240)
        assert one.state == two.state == pb.JOB_STATE_SUCCEEDED, (one.error, two.error)

    def losses(job_id: str) -> list[float]:
        events = [json.loads(line) for line in (jobs / job_id / "events.jsonl").read_text().splitlines()]
        return [e["loss"] for e in events if e["kind"] == "progress"]

    assert len(losses("two")) == 3
    assert losses("two") == pytest.approx(losses("one"), rel=1e-5)
    import torch
    from safetensors.torch import load_file

    a = load_file(str(Path(one.latest_checkpoint.path) / "model.safetensors"))
    b = load_file(str(Path(two.latest_checkpoint.path) / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])
