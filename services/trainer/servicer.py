"""TrainerService servicer: validates requests and translates protos to the job manager. Errors raised here are
OrchardErrors; the runtime's interceptor maps them to status codes."""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TypeVar

import grpc

from orchard.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unimplemented
from orchard.harness.assistant import AssistantHarness
from orchard.model_files import STUDENT, check_checkpoint
from orchard.prototime import span_of
from orchard.services.trainer.jobs import JobManager
from orchard.tasks.instance import resolve_source
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainer.v1 import trainer_pb2_grpc

JOB_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
RECIPE_FIELD = {
    pb.JOB_KIND_SFT: "sft",
    pb.JOB_KIND_CREDIT_ASSIGNMENT_SFT: "credit_assignment_sft",
    pb.JOB_KIND_RL: "rl",
    pb.JOB_KIND_VALUE: "value",
}
DEFAULT_PAGE, MAX_PAGE = 100, 1000
T = TypeVar("T")


def validate(config: pb.JobConfig) -> None:
    """Refuse a job that cannot run, before it is queued, naming the field."""
    if config.kind not in RECIPE_FIELD:
        raise InvalidArgument(
            "config.kind is unset; choose JOB_KIND_SFT, JOB_KIND_CREDIT_ASSIGNMENT_SFT, JOB_KIND_RL or JOB_KIND_VALUE",
            field="config.kind",
        )
    recipe = config.WhichOneof("recipe")
    if recipe is not None and recipe != RECIPE_FIELD[config.kind]:
        raise InvalidArgument(
            f"config.{recipe} does not match kind {pb.JobKind.Name(config.kind)}; set "
            f"config.{RECIPE_FIELD[config.kind]} or leave the recipe unset for its defaults",
            field=f"config.{recipe}",
        )
    if config.kind == pb.JOB_KIND_VALUE:
        validate_value(config)
    elif config.base_model and config.base_model != STUDENT:
        path = Path(config.base_model).expanduser()
        if path.suffix == ".gguf":
            if not path.is_file():
                raise NotFound(f"base_model {path} not found", field="config.base_model")
        else:
            check_checkpoint(path)  # NotFound / InvalidArgument naming what is missing
    source = config.dataset.WhichOneof("source")
    if config.kind == pb.JOB_KIND_RL:
        if source != "path":
            raise InvalidArgument(
                "an RL job needs dataset.path: its task source (a task file, a folder, or a "
                "bundled task set such as 'toyrepair')",
                field="config.dataset.path",
            )
        if config.rl.harness != AssistantHarness.name:
            resolve_source(config.dataset.path)  # NotFound naming the bundled sets
        elif config.dataset.path != "claw" and not Path(config.dataset.path).is_file():  # "claw": the bundled set
            raise NotFound(
                f"assistant task file {config.dataset.path} not found; use 'claw' for the bundled set",
                field="config.dataset.path",
            )
    elif source is None:
        raise InvalidArgument(
            "the job has no data; set dataset.experience (a trajectory filter) or dataset.path (a JSONL file)",
            field="config.dataset",
        )
    elif source == "path" and not Path(config.dataset.path).is_file():
        raise NotFound(f"dataset file {config.dataset.path} not found", field="config.dataset.path")
    if config.dataset.limit < 0:
        raise InvalidArgument("dataset.limit must be >= 0 (0 is all)", field="config.dataset.limit")
    for source in config.dataset.eval_task_files:
        resolve_source(source)  # NotFound naming the bundled sets
    h = config.hyperparameters
    for name in (
        "learning_rate",
        "warmup_ratio",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "epochs",
        "max_steps",
        "global_batch_size",
        "micro_batch_size",
        "max_seq_len",
        "save_every_steps",
    ):
        if getattr(h, name) < 0:
            raise InvalidArgument(
                f"hyperparameters.{name} is {getattr(h, name)}; it must be >= 0 (0 takes the recipe default)",
                field=f"config.hyperparameters.{name}",
            )
    if h.warmup_ratio >= 1 or h.adam_beta1 >= 1 or h.adam_beta2 >= 1:
        raise InvalidArgument("warmup_ratio, adam_beta1 and adam_beta2 must be below 1", field="config.hyperparameters")
    compute = config.compute
    if compute.nodes > 1:
        raise Unimplemented("multi-node jobs are not available; use compute.nodes = 1", field="config.compute.nodes")
    if compute.cpu_processes < 0 or compute.gpus_per_node < 0:
        raise InvalidArgument("compute.cpu_processes and gpus_per_node must be >= 0", field="config.compute")
    if compute.gpus_per_node > 0:
        import torch

        if torch.cuda.device_count() < compute.gpus_per_node:
            raise FailedPrecondition(
                f"compute.gpus_per_node is {compute.gpus_per_node} but this machine has "
                f"{torch.cuda.device_count()} GPU(s); use cpu_processes on a CPU machine",
                field="config.compute.gpus_per_node",
            )
    if config.kind == pb.JOB_KIND_RL:
        from orchard.trainers import optim, rl_job

        rl_job.settings(config, optim.resolve(h, config.kind))  # refuses what the RL recipe cannot run, at create
        if compute.cpu_processes > 1:
            raise Unimplemented(
                "RL jobs run in one process; set compute.cpu_processes to 0 or 1", field="config.compute.cpu_processes"
            )
    if config.extra_args:
        raise InvalidArgument(
            f"extra_args {sorted(config.extra_args)} are not settings any recipe knows; use the typed recipe fields",
            field="config.extra_args",
        )


def validate_value(config: pb.JobConfig) -> None:
    """The value recipe's own checks: its backbone, head and settings."""
    from orchard.value.model import resolve_backbone

    if config.base_model:
        resolve_backbone(config.base_model)  # "" / the embedded name, or a Hugging Face folder
    cfg = config.value
    if cfg.head == pb.VALUE_HEAD_YES_TOKEN:
        raise Unimplemented(
            "the YES-token head is not available; use VALUE_HEAD_SCALAR (the default)", field="config.value.head"
        )
    if cfg.HasField("pairwise_weight") and cfg.pairwise_weight < 0:
        raise InvalidArgument(
            "value.pairwise_weight must be >= 0 (0 trains on BCE alone)", field="config.value.pairwise_weight"
        )
    if cfg.HasField("eval_fraction") and not 0 <= cfg.eval_fraction < 1:
        raise InvalidArgument(
            "value.eval_fraction must be in [0, 1) (0 holds out no task)", field="config.value.eval_fraction"
        )
    if cfg.max_context_tokens < 0:
        raise InvalidArgument(
            "value.max_context_tokens must be >= 0 (0 takes max_seq_len)", field="config.value.max_context_tokens"
        )
    if cfg.HasField("tie_margin"):
        from orchard.value.metrics import check_tie_margin

        try:
            check_tie_margin(cfg.tie_margin)
        except ValueError as err:
            raise InvalidArgument(f"value.tie_margin {err}", field="config.value.tie_margin") from None
    if any(n < 1 for n in cfg.best_at_n):
        raise InvalidArgument("value.best_at_n sizes must be >= 1", field="config.value.best_at_n")
    if config.compute.cpu_processes > 1:
        raise Unimplemented(
            "value jobs run in one process; set compute.cpu_processes to 0 or 1", field="config.compute.cpu_processes"
        )


def page(items: Sequence[T], keys: Sequence[str], size: int, token: str) -> tuple[list[T], str]:
    """A page of `items` (already ordered, each with a unique key) after the token's key."""
    if size < 0:
        raise InvalidArgument("page_size must be >= 0", field="page_size")
    size = min(size or DEFAULT_PAGE, MAX_PAGE)
    start = 0
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
            start = keys.index(after) + 1
        except ValueError:
            raise InvalidArgument(
                "page_token is not one this service issued (or its item is gone); pass the "
                "next_page_token of the previous page, or none for the first",
                field="page_token",
            ) from None
    chunk = list(items[start : start + size])
    more = start + size < len(items)
    return chunk, base64.urlsafe_b64encode(keys[start + size - 1].encode()).decode() if more else ""


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    """Proto <-> JobManager."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    async def CreateJob(self, request: pb.CreateJobRequest, context: grpc.aio.ServicerContext) -> pb.CreateJobResponse:
        if request.request_id and request.request_id in self.manager.request_ids:
            return pb.CreateJobResponse(job=self.manager.get(self.manager.request_ids[request.request_id]))
        job_id = request.job_id or f"job-{uuid.uuid4().hex[:12]}"
        if not JOB_ID.match(job_id):
            raise InvalidArgument(
                f"job_id {job_id!r} must be lowercase letters, digits and '-', at most 63, "
                "starting and ending with a letter or digit",
                field="job_id",
            )
        if self.manager.exists(job_id):
            raise AlreadyExists(
                f"job {job_id!r} already exists; choose another id or leave job_id empty", field="job_id"
            )
        validate(request.config)
        config = pb.JobConfig()
        config.CopyFrom(request.config)
        config.output_dir = str(
            Path(config.output_dir).resolve() if config.output_dir else self.manager.jobs_dir / job_id
        )
        job = pb.Job(
            name=f"jobs/{job_id}",
            job_id=job_id,
            display_name=request.display_name or job_id,
            config=config,
            labels=dict(request.labels),
        )
        return pb.CreateJobResponse(job=self.manager.create(job, request.request_id))

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.GetJobResponse:
        return pb.GetJobResponse(job=self.manager.get(request.job_id))

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        selector = dict(request.label_selector)
        jobs = [
            j
            for j in self.manager.all_jobs()
            if (not request.kind or j.config.kind == request.kind)
            and (not request.state or j.state == request.state)
            and all(j.labels.get(k) == v for k, v in selector.items())
        ]
        chunk, token = page(jobs, [j.job_id for j in jobs], request.page_size, request.page_token)
        return pb.ListJobsResponse(jobs=chunk, next_page_token=token)

    async def CancelJob(self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext) -> pb.CancelJobResponse:
        return pb.CancelJobResponse(job=await self.manager.cancel(request.job_id))

    async def WaitJob(self, request: pb.WaitJobRequest, context: grpc.aio.ServicerContext) -> pb.WaitJobResponse:
        limit = self.manager.settings.max_wait_s
        timeout = span_of(request.timeout, "timeout") if request.HasField("timeout") else limit
        remaining = context.time_remaining()
        timeout = min(timeout or limit, limit, remaining if remaining is not None else limit)
        try:
            job = await self.manager.wait(request.job_id, timeout)
        except TimeoutError:
            job = self.manager.get(request.job_id)
        return pb.WaitJobResponse(
            job=job, done=job.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)
        )

    async def StreamJobEvents(
        self, request: pb.StreamJobEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamJobEventsResponse]:
        async for event in self.manager.watch(request.job_id):
            yield event

    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListCheckpointsResponse:
        checkpoints = self.manager.checkpoints(request.job_id)
        chunk, token = page(checkpoints, [c.name for c in checkpoints], request.page_size, request.page_token)
        return pb.ListCheckpointsResponse(checkpoints=chunk, next_page_token=token)
