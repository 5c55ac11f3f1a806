"""`orchard train`: one training job of the trainer service, with a live progress line: SFT, credit-assignment SFT
or the value model on runs' rollouts as the experience service stores them, or RL on a task set (the job rolls
out through the env and inference services itself); `--push` then loads the job's final checkpoint into the
inference service (a policy: the next `orchard rollout` samples from the trained weights) or into the value
service (a value model: `orchard eval --best-of` reranks with it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from orchard.cli.arguments import count, fraction, rate
from orchard.progress import ProgressLine

if TYPE_CHECKING:  # the CLI imports this module at start: gRPC stubs are imported when the command runs
    from orchard.inference.v1 import inference_pb2
    from orchard.sdk.transport import Transport
    from orchard.trainer.v1 import trainer_pb2 as pb
    from orchard.value.v1 import value_pb2

KINDS = {
    "sft": "JOB_KIND_SFT",
    "ca-sft": "JOB_KIND_CREDIT_ASSIGNMENT_SFT",
    "rl": "JOB_KIND_RL",
    "value": "JOB_KIND_VALUE",
}
"""--kind -> the job kind it creates."""
KIND_NAMES = {kind: flag for flag, kind in KINDS.items()}
SCHEDULES = ("constant", "cosine", "linear")
"""--schedule values; each is LR_SCHEDULE_<VALUE>."""
STREAM_S = 300.0
"""Deadline of one StreamJobEvents call; a longer job is followed by asking again (the stream restarts with the
job as it is)."""
CALL_S = 30.0
"""Deadline of the short calls (create, get, cancel, list models)."""
PUSH_S = 300.0
"""Deadline of UpdateWeights: the swap waits for the requests in flight to finish."""
SERVED = "served"
"""--base-model value: the weights the inference service serves now (a pushed checkpoint, or its model)."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="train the model (or a value model) on runs' stored rollouts (a trainer-service "
        "job), optionally pushing the new weights to the inference (or value) service",
    )
    p.add_argument(
        "--run",
        action="append",
        default=[],
        help="train on this run's rollouts, as the experience service stores them; repeat it to train on several "
        "runs (every kind but rl)",
    )
    p.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default="sft",
        help="sft: every rollout's assistant turns; ca-sft: resolved rollouts plus the steps of "
        "unresolved ones that raised the estimated chance of success; rl: GRPO on --tasks, rolling out "
        "groups through the env and inference services, rewarded by the tests; value: a value model scoring "
        "candidates for best-of-N reranking, from graded rollouts of several runs (default: sft)",
    )
    rl = p.add_argument_group("rl", "the RL job's tasks and rollouts (--kind rl)")
    rl.add_argument("--tasks", default="", help="the task set to train on: a bundled set (toyrepair) or a task file")
    rl.add_argument("--ids", nargs="+", default=[], metavar="ID", help="only these tasks of --tasks")
    rl.add_argument("--group-size", type=count(2), default=4, help="rollouts per task and step (default: 4)")
    rl.add_argument("--prompts", type=count(1), default=None, help="tasks per step (default: every task, at most 8)")
    rl.add_argument("--max-turns", type=count(1), default=4, help="model replies per rollout (default: 4)")
    rl.add_argument("--max-step-tokens", type=count(1), default=256, help="tokens per reply (default: 256)")
    rl.add_argument("--temperature", type=rate, default=1.0, help="sampling temperature (default: 1.0)")
    rl.add_argument(
        "--aggregation",
        choices=("token", "sequence"),
        default="token",
        help="the policy loss: the mean over every sampled token of the step, or over each rollout's tokens and "
        "then over rollouts (default: token)",
    )
    rl.add_argument(
        "--updates-per-step",
        type=count(1),
        default=1,
        help="optimiser steps over each rollout step's rollouts (PPO's epochs; the clip range bounds them; default: 1)",
    )
    rl.add_argument(
        "--negative-advantage-scale",
        type=fraction,
        default=None,
        help="scales the advantages of rollouts worse than their group's mean (GRPO: 1, the default; 0 trains on "
        "the better rollouts only, which keeps a policy that memorised its trajectories from unlearning them)",
    )
    rl.add_argument("--seed", type=count(0), default=None, help="the job's seed (default: one drawn at start)")
    p.add_argument(
        "--eval-tasks",
        action="append",
        default=[],
        metavar="FILE",
        help="an evaluation set (a task "
        "file, a bundled set, or a .txt of task ids): the job fails if the runs hold any of its tasks "
        "(decontamination); repeatable",
    )
    p.add_argument("--resolved-only", action="store_true", help="only the run's resolved rollouts")
    p.add_argument(
        "--epochs",
        type=count(1),
        default=None,
        help="passes over the rollouts (default: the "
        "recipe's: 1; value: 4, or more for a small store, to reach 40 steps)",
    )
    p.add_argument(
        "--max-steps", type=count(0), default=0, help="stop after this many optimiser steps (default: 0, all epochs)"
    )
    p.add_argument(
        "--lr", type=rate, default=None, help="peak learning rate (default: the recipe's: 1e-5; value: 3e-5)"
    )
    p.add_argument(
        "--micro-batch",
        type=count(1),
        default=None,
        help="samples per forward/backward pass (default: 1, which keeps a large model's memory low; a small "
        "model trains faster with the whole batch at once)",
    )
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=None,
        help="the learning rate's schedule (default: the recipe's: cosine; value: linear)",
    )
    p.add_argument(
        "--warmup",
        type=fraction,
        default=0.0,
        help="the fraction of the steps over which the learning rate rises linearly to its peak first (default: 0)",
    )
    p.add_argument(
        "--batch",
        type=count(1),
        default=None,
        help="rollouts per optimiser step (default: the recipe's: 8; value: 16)",
    )
    p.add_argument(
        "--max-seq-len",
        type=count(1),
        default=None,
        help="longest training sequence in tokens; longer "
        "rollouts lose their oldest tokens (value: keep head and tail) (default: 2048; value: 512)",
    )
    p.add_argument(
        "--base-model",
        default="",
        help="the model to start from: a Hugging Face folder, a .gguf file, another job's checkpoint, `student`, "
        "or `served`: the weights the inference service serves now (default: the embedded model, as the inference "
        "service serves it; value: the embedded all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--push",
        action="store_true",
        help="load the final checkpoint into the inference service's "
        "default model (UpdateWeights; --kind value: into the value service, LoadModel) and print the "
        "version it serves",
    )
    p.add_argument("--job-id", default="", help="the job's id (default: one the trainer service picks)")
    p.add_argument(
        "--exclude-ids",
        nargs="+",
        default=[],
        metavar="ID",
        help="leave these tasks' stored rollouts out (e.g. held-out tasks the runs also covered)",
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="FILE",
        help="write the job's result here as JSON: its id, checkpoint, final metrics and every step's figures",
    )
    p.add_argument("--trainer-address", default="127.0.0.1:50056", help="the trainer service (orchard up starts it)")
    p.add_argument("--inference-address", default="127.0.0.1:50052", help="the inference service (with --push)")
    p.add_argument("--value-address", default="127.0.0.1:50057", help="the value service (--kind value --push)")
    p.set_defaults(func=cmd_train)


class Progress:
    """The job's progress on stderr: one updating line on a terminal, a plain line every few seconds in a log."""

    def __init__(self) -> None:
        self._line = ProgressLine()
        self.started = time.monotonic()
        self.steps: dict[int, dict[str, float]] = {}
        """Every step's reported loss and metrics, by step."""

    @property
    def rewards(self) -> list[float]:
        """An RL job's mean reward per step, as reported."""
        return [figures["reward_mean"] for _, figures in sorted(self.steps.items()) if "reward_mean" in figures]

    def step(self, p: pb.JobProgress) -> None:
        width = 30
        filled = width * p.step // p.total_steps if p.total_steps else 0
        m = p.metrics
        if p.step:
            self.steps[p.step] = {"loss": p.loss, **m}
        if "reward_mean" in m:  # RL: what the step's rollouts earned, and how much of it could be learned from
            figures = (
                f"reward {m['reward_mean']:+.3f}  resolved {m.get('resolved_fraction', 0):.2f}  groups kept "
                f"{m.get('groups_kept_fraction', 0):.2f}  |adv| {m.get('advantage_abs_mean', 0):.2f}  "
                f"kl {m.get('kl', 0):.4f}"
            )
        else:
            speed = m.get("tokens_per_second")
            figures = f"loss {p.loss:.4f}  {'-' if speed is None else f'{speed:,.0f}'} tokens/s  epoch {p.epoch:.2f}"
        text = (
            f"[{'#' * filled}{'.' * (width - filled)}] step {p.step}/{p.total_steps or '?'}  {figures}  "
            f"{time.monotonic() - self.started:.0f}s"
        )
        force = p.total_steps > 0 and p.step == p.total_steps or "reward_mean" in m
        self._line.update(text, force=force)

    def line(self, text: str) -> None:
        self._line.line(text)

    def finish(self) -> None:
        self._line.finish()


async def follow(trainer: Transport, job_id: str, progress: Progress) -> pb.Job:
    """The job once it has ended, showing its state changes, steps and checkpoints as they come."""
    from orchard.errors import DeadlineExceeded
    from orchard.trainer.v1 import trainer_pb2 as pb

    done = (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED)
    state = pb.JOB_STATE_UNSPECIFIED
    while True:
        job = None
        try:
            async for event in trainer.server_stream(
                "StreamJobEvents", pb.StreamJobEventsRequest(job_id=job_id), timeout=STREAM_S
            ):
                which = event.WhichOneof("event")
                if which == "job":
                    job = event.job
                    if job.state != state:
                        state = job.state
                        progress.line(f"job {job_id} {pb.JobState.Name(state).removeprefix('JOB_STATE_')}")
                elif which == "progress":
                    progress.step(event.progress)
                elif which == "checkpoint":
                    progress.line(f"checkpoint {event.checkpoint.version} at {event.checkpoint.path}")
        except DeadlineExceeded:
            pass
        if job is not None and job.state in done:
            return job
        # The stream ended before the job (its deadline, or the service cut off a slow reader): follow it again.


async def cancel(trainer: Transport, job_id: str, progress: Progress) -> None:
    """Cancel the job (Ctrl-C), saying where it stopped."""
    from orchard.errors import OrchardError
    from orchard.trainer.v1 import trainer_pb2 as pb

    progress.line(f"cancelling job {job_id} ...")
    try:
        job = (
            await trainer.unary("CancelJob", pb.CancelJobRequest(job_id=job_id), idempotent=True, timeout=CALL_S)
        ).job
    except OrchardError as err:
        progress.line(f"orchard train: could not cancel job {job_id}: {err.code.name}: {err.message}")
        return
    kept = (
        f"; its checkpoints are kept (latest {job.latest_checkpoint.version})" if job.latest_checkpoint.version else ""
    )
    progress.line(
        f"job {job_id} {pb.JobState.Name(job.state).removeprefix('JOB_STATE_')} at step {job.progress.step}{kept}"
    )


async def served_model(address: str) -> inference_pb2.Model:
    """The inference service's default model; Unavailable naming the fix when the service is down."""
    from orchard import clients
    from orchard.errors import FailedPrecondition
    from orchard.inference.v1 import inference_pb2

    async with clients.connect("inference", address, flag="--inference-address (or drop --push)") as inference:
        models = (
            await inference.unary("ListModels", inference_pb2.ListModelsRequest(), idempotent=True, timeout=CALL_S)
        ).models
    default = [m for m in models if m.is_default] or list(models)
    if not default:
        raise FailedPrecondition(f"the inference service at {address} serves no model to push the weights to")
    return default[0]


def held_out_summary(metrics: Mapping[str, float]) -> str:
    """The value job's held-out figures in a line (or why there are none)."""
    if "auc" not in metrics and "best_at_1" not in metrics:
        return (
            "held-out: none (fewer than 2 tasks with both outcomes, or eval_fraction 0); judge the model with "
            "`orchard eval --best-of N`"
        )
    curve = sorted({int(k.rsplit("_", 1)[1]) for k in metrics if k.startswith("best_at_")})
    parts = [f"best@{n} {metrics[f'best_at_{n}']:.2f} (random {metrics[f'random_at_{n}']:.2f})" for n in curve]
    auc = f"AUC {metrics['auc']:.3f}, " if "auc" in metrics else ""
    return (
        f"held-out ({metrics.get('tasks_held_out', 0):.0f} tasks, {metrics.get('held_out_candidates', 0):.0f} "
        f"candidates): {auc}{', '.join(parts)}"
    )


async def value_model(address: str) -> value_pb2.ValueModel | None:
    """The model the value service serves (None when it serves none yet); Unavailable naming the fix when the
    service is down."""
    from orchard import clients
    from orchard.errors import FailedPrecondition
    from orchard.value.v1 import value_pb2

    async with clients.connect("value", address, flag="--value-address (or drop --push)") as value:
        try:
            return (await value.unary("GetModel", value_pb2.GetModelRequest(), idempotent=True, timeout=CALL_S)).model
        except FailedPrecondition:  # up, with no model loaded yet
            return None


async def load_value_model(address: str, checkpoint: pb.Checkpoint) -> value_pb2.LoadModelResponse:
    """Switch the value service to the checkpoint."""
    from orchard import clients
    from orchard.value.v1 import value_pb2

    async with clients.connect("value", address, flag="--value-address") as value:
        return await value.unary(
            "LoadModel",
            value_pb2.LoadModelRequest(checkpoint_path=checkpoint.path, version=checkpoint.version),
            idempotent=True,
            timeout=PUSH_S,
        )


async def push(address: str, checkpoint: pb.Checkpoint) -> inference_pb2.UpdateWeightsResponse:
    """Load the checkpoint into the inference service's default model."""
    from orchard import clients
    from orchard.inference.v1 import inference_pb2

    async with clients.connect("inference", address, flag="--inference-address") as inference:
        return await inference.unary(
            "UpdateWeights",
            inference_pb2.UpdateWeightsRequest(checkpoint_path=checkpoint.path, weights_version=checkpoint.version),
            idempotent=True,
            timeout=PUSH_S,
        )


def rl_config(
    args: argparse.Namespace, base_model: str, eval_files: list[str], hyperparameters: pb.Hyperparameters
) -> pb.JobConfig:
    """The RL job --kind rl asks for: GRPO with group-normalised outcome rewards; groups whose rewards are all equal
    carry no signal and are dropped (GROUP_FILTER_NONZERO_STD)."""
    from orchard.inference.v1 import inference_pb2 as ipb
    from orchard.tasks import load_instances
    from orchard.trainer.v1 import trainer_pb2 as pb

    tasks = load_instances(args.tasks, args.ids or None)  # InvalidArgument for a bad file or an unknown id, here
    path = str(Path(args.tasks).resolve()) if Path(args.tasks).exists() else args.tasks
    prompts = args.prompts or min(len(tasks), 8)
    if args.seed is not None:
        hyperparameters.seed = args.seed
    return pb.JobConfig(
        kind=pb.JOB_KIND_RL,
        base_model=base_model,
        dataset=pb.DatasetSource(path=path, task_ids=args.ids, eval_task_files=eval_files),
        hyperparameters=hyperparameters,
        rl=pb.RlConfig(
            group_size=args.group_size,
            prompts_per_step=prompts,
            group_filter=pb.GROUP_FILTER_NONZERO_STD,
            loss_aggregation=pb.LossAggregation.Value(f"LOSS_AGGREGATION_{args.aggregation.upper()}_MEAN"),
            max_turns=args.max_turns,
            updates_per_step=args.updates_per_step,
            negative_advantage_scale=args.negative_advantage_scale,
            max_concurrent_rollouts=min(16, prompts * args.group_size),
            sampling=ipb.SamplingParams(temperature=args.temperature, top_p=1.0, max_tokens=args.max_step_tokens),
        ),
    )


async def train(args: argparse.Namespace) -> int:
    from orchard import clients
    from orchard.errors import FailedPrecondition, InvalidArgument
    from orchard.experience.v1 import experience_pb2 as epb
    from orchard.trainer.v1 import trainer_pb2 as pb
    from orchard.types.v1 import types_pb2 as tpb

    value, rl = args.kind == "value", args.kind == "rl"
    if value and args.resolved_only:
        raise InvalidArgument(
            "--resolved-only leaves a value model nothing to rank: it learns from resolved and unresolved rollouts"
        )
    if rl and (args.run or not args.tasks):
        raise InvalidArgument("--kind rl trains on --tasks (it rolls out itself), not on stored --run rollouts")
    if rl and args.exclude_ids:
        raise InvalidArgument("--exclude-ids leaves stored rollouts out; --kind rl trains on --tasks (use --ids)")
    if not rl and (not args.run or args.tasks or args.ids):
        raise InvalidArgument(f"--kind {args.kind} trains on stored rollouts: give --run (--tasks is for --kind rl)")
    if value and args.base_model == SERVED:
        raise InvalidArgument("--base-model served names the inference service's policy; a value model has its own")
    # 1. What the job needs, checked before it starts: the service to push to, the weights to start from.
    if args.push or args.base_model == SERVED:
        served = await (value_model(args.value_address) if value else served_model(args.inference_address))
    base_model = served.checkpoint_path if args.base_model == SERVED else args.base_model  # type: ignore[union-attr]
    eval_files = [str(Path(f).resolve()) if Path(f).is_file() else f for f in args.eval_tasks]  # the service's cwd
    hyperparameters = pb.Hyperparameters(
        learning_rate=args.lr or 0,
        epochs=args.epochs or 0,
        max_steps=args.max_steps,
        global_batch_size=args.batch or 0,
        micro_batch_size=args.micro_batch or 0,
        max_seq_len=args.max_seq_len or 0,
        lr_schedule=f"LR_SCHEDULE_{(args.schedule or 'unspecified').upper()}",
        warmup_ratio=args.warmup,
    )
    if rl:
        config = rl_config(args, base_model, eval_files, hyperparameters)
        source = f"tasks {args.tasks}" + (f" ({len(args.ids)} of them)" if args.ids else "")
    else:
        rollouts = epb.TrajectoryFilter(run_ids=args.run, exclude_task_ids=args.exclude_ids)
        if args.resolved_only:
            rollouts.outcome_status = tpb.OUTCOME_STATUS_RESOLVED
        config = pb.JobConfig(
            kind=pb.JobKind.Value(KINDS[args.kind]),
            base_model=base_model,
            dataset=pb.DatasetSource(experience=rollouts, eval_task_files=eval_files),
            hyperparameters=hyperparameters,
        )
        source = f"{'resolved ' if args.resolved_only else ''}rollouts of run{'s' if len(args.run) > 1 else ''} " + (
            ", ".join(args.run)
        )
    progress = Progress()
    async with clients.connect("trainer", args.trainer_address, flag="--trainer-address") as trainer:
        # 2. The job, followed until it ends; Ctrl-C cancels it.
        job = (
            await trainer.unary(
                "CreateJob",
                pb.CreateJobRequest(config=config, job_id=args.job_id, display_name=f"{args.kind} on {source}"[:200]),
                idempotent=bool(args.job_id),
                timeout=CALL_S,
            )
        ).job
        base = base_model or ("the embedded all-MiniLM-L6-v2" if value else "the embedded model")
        progress.line(f"job {job.job_id}: {args.kind} of {base} on the {source} ({args.trainer_address})")
        try:
            job = await follow(trainer, job.job_id, progress)
            progress.finish()
        except asyncio.CancelledError:  # Ctrl-C: the job must not train on unattended
            await cancel(trainer, job.job_id, progress)
            raise
    # 3. The result, and the new weights served.
    state = pb.JobState.Name(job.state).removeprefix("JOB_STATE_")
    if job.state != pb.JOB_STATE_SUCCEEDED:
        why = f": {job.error}" if job.error else ""
        print(f"orchard train: job {job.job_id} {state} at step {job.progress.step}{why}", file=sys.stderr)
        return 1
    metrics = job.progress.metrics
    took = (job.end_time.ToNanoseconds() - job.start_time.ToNanoseconds()) / 1e9
    samples = f" on {metrics['samples']:.0f} samples" if "samples" in metrics else ""
    steps = job.progress.step
    print(
        f"job {job.job_id} {state} in {took:.0f}s: {steps} step{'' if steps == 1 else 's'}{samples}, final loss "
        f"{job.progress.loss:.4f}"
    )
    checkpoint = job.latest_checkpoint
    if not checkpoint.version:
        raise FailedPrecondition(
            f"job {job.job_id} succeeded but reported no checkpoint; see its log under the trainer's jobs folder"
        )
    print(f"checkpoint {checkpoint.version} at {checkpoint.path}")
    if value:
        print(held_out_summary(metrics))
    if args.report:
        write_report(Path(args.report), job, progress)
    if rl and progress.rewards:
        print(
            f"reward per step: {' '.join(f'{r:+.2f}' for r in progress.rewards)} (first {progress.rewards[0]:+.2f}, "
            f"last {progress.rewards[-1]:+.2f})"
        )
    if args.push and value:
        loaded = await load_value_model(args.value_address, checkpoint)
        print(
            f"pushed {checkpoint.version} to the value service at {args.value_address} (it served "
            f"{loaded.previous_version or 'no model'} before)"
        )
    elif args.push:
        pushed = await push(args.inference_address, checkpoint)
        print(
            f"pushed {checkpoint.version} to {pushed.model.model_id} at {args.inference_address} (weights were "
            f"{pushed.previous_weights_version}, loaded in {pushed.load_duration.ToNanoseconds() / 1e9:.1f}s)"
        )
        print(f"served weights version: {pushed.model.weights_version}")
    return 0


def write_report(path: Path, job: pb.Job, progress: Progress) -> None:
    """--report: the finished job as JSON (what a script that runs several jobs reads back)."""
    from orchard.trainer.v1 import trainer_pb2 as pb

    checkpoint = job.latest_checkpoint
    report = {
        "job_id": job.job_id,
        "kind": KIND_NAMES[pb.JobKind.Name(job.config.kind)],
        "steps": job.progress.step,
        "seconds": (job.end_time.ToNanoseconds() - job.start_time.ToNanoseconds()) / 1e9,
        "checkpoint": {"version": checkpoint.version, "path": checkpoint.path},
        "metrics": dict(job.progress.metrics),
        "per_step": [{"step": step, **figures} for step, figures in sorted(progress.steps.items())],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def cmd_train(args: argparse.Namespace) -> int:
    return asyncio.run(train(args))
