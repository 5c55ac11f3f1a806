"""RL real run: the embedded SmolLM2-135M policy trained by an RL job of the trainer service on the bundled ToyRepair
SWE tasks, rolling out in real sandboxes, rewarded by the outcome (tests) mixed with the RPR judge (the same
embedded model through the reward service), its new weights loaded into the inference service after every step.
Starts its own env, inference, reward and trainer services (`orchard serve ...`) on free ports; writes the
per-step figures to <out>/rl_real_run.json and the reward curve to <out>/rl_real_run.png; prints one JSON object.
The baseline is step 1's reward: the untrained policy's rollouts of the same run.

    python bench/rl_real_run.py [--steps 3] [--prompts 2] [--group-size 2] [--max-turns 2] [--step-tokens 48]
                                [--alpha 0.5] [--out .state/bench/rl_real_run] [--keep-checkpoints] [--quick]

The 135M model almost never resolves a task, so R_bin is -1 nearly always; a group only has a learning signal when
the judge's scores differ within it (the group filter drops the rest, GROUP_FILTER_NONZERO_STD), and the judge often
writes no usable JSON (it then falls back to R_bin). The figures say how often, as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from orchard.inference.v1 import inference_pb2 as ipb
from orchard.inference.v1 import inference_pb2_grpc
from orchard.reward.v1 import reward_pb2 as rpb
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainer.v1 import trainer_pb2_grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))
FILTERS = {"nonzero_std": pb.GROUP_FILTER_NONZERO_STD, "none": pb.GROUP_FILTER_NONE}
FIGURES = (
    "reward_mean",
    "reward_std",
    "resolved_fraction",
    "submitted_fraction",
    "judge_score_mean",
    "judge_fallback_fraction",
    "groups_kept_fraction",
    "groups_trained",
    "nonzero_variance_groups",
    "rollouts",
    "env_steps",
    "trained_tokens",
    "clip_fraction",
    "logprob_diff_mean",
    "logprob_diff_max",
    "grad_norm",
    "rollout_seconds",
    "train_seconds",
    "push_seconds",
)
"""The progress metrics of each step kept in the JSON file."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_config(args: argparse.Namespace) -> pb.JobConfig:
    rl = pb.RlConfig(
        group_size=args.group_size,
        prompts_per_step=args.prompts,
        max_turns=args.max_turns,
        group_filter=FILTERS[args.group_filter],
        max_concurrent_rollouts=args.prompts * args.group_size,
        sampling=ipb.SamplingParams(temperature=1.0, top_p=0.95, max_tokens=args.step_tokens),
    )
    if args.alpha:
        rl.judge.CopyFrom(rpb.JudgeConfig(alpha=args.alpha, max_tokens=args.judge_tokens))
    return pb.JobConfig(
        kind=pb.JOB_KIND_RL,
        base_model="",
        dataset=pb.DatasetSource(path="toyrepair"),
        hyperparameters=pb.Hyperparameters(
            max_steps=args.steps, learning_rate=args.lr, seed=args.seed, micro_batch_size=2
        ),
        rl=rl,
    )


async def run_job(trainer: str, inference: str, config: pb.JobConfig, timeout_s: float) -> dict[str, object]:
    """Create the job, follow its events to the end; its per-step figures and the weights the policy serves."""
    async with grpc.aio.insecure_channel(trainer) as tc, grpc.aio.insecure_channel(inference) as ic:
        stub = trainer_pb2_grpc.TrainerServiceStub(tc)
        job = (await stub.CreateJob(pb.CreateJobRequest(config=config, job_id=f"rl-real-run-{int(time.time())}"))).job
        steps: list[dict[str, float]] = []
        last = time.time()
        async for event in stub.StreamJobEvents(pb.StreamJobEventsRequest(job_id=job.job_id), timeout=timeout_s):
            kind = event.WhichOneof("event")
            if kind == "progress":
                now = event.progress.update_time.ToNanoseconds() / 1e9
                m = event.progress.metrics
                steps.append(
                    {
                        "step": event.progress.step,
                        "loss": round(event.progress.loss, 6),
                        "seconds": round(now - last, 1),
                        **{k: round(m[k], 4) for k in FIGURES if k in m},
                    }
                )
                last = now
                print(
                    f"step {event.progress.step}/{event.progress.total_steps}: reward {m['reward_mean']:+.3f} "
                    f"± {m['reward_std']:.3f}, groups kept {m['groups_kept_fraction']:.2f}, "
                    f"{steps[-1]['seconds']}s",
                    file=sys.stderr,
                )
            elif kind == "job":
                job = event.job
                if job.state == pb.JOB_STATE_RUNNING and not steps:
                    last = job.start_time.ToNanoseconds() / 1e9
        served = (
            await inference_pb2_grpc.InferenceServiceStub(ic).ListModels(ipb.ListModelsRequest(), timeout=30)
        ).models[0]
    return {"job": job, "steps": steps, "served": served}


def plot(steps: list[dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(key: str) -> list[float]:
        return [float(s.get(key, math.nan)) for s in steps]

    x, mean, std = series("step"), series("reward_mean"), series("reward_std")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 6), sharex=True)
    top.plot(x, mean, marker="o", label="reward R' (mean)")
    top.fill_between(
        x,
        [m - d for m, d in zip(mean, std, strict=False)],
        [m + d for m, d in zip(mean, std, strict=False)],
        alpha=0.2,
        label="± std",
    )
    top.plot(x, series("judge_score_mean"), marker="s", label="judge score J (mean where it scored)")
    top.set_ylabel("reward")
    top.legend(loc="best", fontsize=8)
    top.set_title(title, fontsize=9)
    bottom.plot(x, series("loss"), marker="o", color="tab:red", label="loss")
    bottom.plot(x, series("groups_kept_fraction"), marker="^", color="tab:green", label="groups kept (fraction)")
    bottom.plot(x, series("judge_fallback_fraction"), marker="x", color="tab:gray", label="judge fell back (fraction)")
    bottom.set_xlabel("RL step (weights pushed to inference after each)")
    bottom.set_xticks(x)
    bottom.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="RL steps (each ends with a weight push)")
    parser.add_argument("--prompts", type=int, default=2, help="ToyRepair tasks per step")
    parser.add_argument("--group-size", type=int, default=2, help="rollouts per task (the GRPO group)")
    parser.add_argument("--max-turns", type=int, default=2, help="model calls per rollout")
    parser.add_argument("--step-tokens", type=int, default=48, help="most tokens per model reply")
    parser.add_argument("--alpha", type=float, default=0.5, help="RPR judge weight (0: outcome reward only)")
    parser.add_argument("--judge-tokens", type=int, default=256, help="most tokens the judge may write")
    parser.add_argument(
        "--group-filter",
        choices=sorted(FILTERS),
        default="nonzero_std",
        help="which groups are trained: nonzero_std drops groups without reward spread; none trains "
        "every group (zero-advantage groups then only exercise the update path)",
    )
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate (the RL recipe's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(".state/bench/rl_real_run"))
    parser.add_argument("--keep-checkpoints", action="store_true", help="keep the job (and its checkpoints) in --out")
    parser.add_argument("--quick", action="store_true", help="one step of one task, two one-turn rollouts")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts, args.group_size, args.max_turns = 1, 1, 2, 1
        args.step_tokens = args.judge_tokens = 16
    args.out.mkdir(parents=True, exist_ok=True)

    work = Path(tempfile.mkdtemp(prefix="orchard-bench-rl-"))
    jobs_dir = args.out / "jobs" if args.keep_checkpoints else work / "jobs"
    ports = {name: free_port() for name in ("env", "inference", "reward", "trainer")}
    address = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    common = ["--log-level", "INFO", "--log-format", "text"]
    commands = {
        "env": ["--state-dir", str(work / "env")],
        "inference": ["--torch-threads", "1"],
        "reward": [
            "--inference-address",
            address["inference"],
            "--env-address",
            address["env"],
            "--judge-timeout-s",
            "1200",
        ],
        "trainer": [
            "--jobs-dir",
            str(jobs_dir),
            "--inference-address",
            address["inference"],
            "--env-address",
            address["env"],
            "--reward-address",
            address["reward"],
        ],
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs: list[subprocess.Popen[bytes]] = []
    started = time.perf_counter()
    try:
        for name, extra in commands.items():
            with open(work / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [ORCHARD, "serve", name, "--port", str(ports[name]), *common, *extra],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        for name in commands:
            with grpc.insecure_channel(address[name]) as channel:
                grpc.channel_ready_future(channel).result(timeout=300)
        ready_s = time.perf_counter() - started
        result = asyncio.run(run_job(address["trainer"], address["inference"], job_config(args), args.timeout_s))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        for worker_log in jobs_dir.glob("*/worker.log"):
            shutil.copy(worker_log, args.out / "worker.log")
        shutil.rmtree(work, ignore_errors=True)
    job: pb.Job = result["job"]  # type: ignore[assignment]
    steps: list[dict[str, float]] = result["steps"]  # type: ignore[assignment]
    served: ipb.Model = result["served"]  # type: ignore[assignment]
    if job.state != pb.JOB_STATE_SUCCEEDED:
        print(
            json.dumps(
                {
                    "bench": "rl_real_run",
                    "error": pb.JobState.Name(job.state),
                    "detail": job.error[-2000:],
                    "steps": steps,
                }
            )
        )
        sys.exit(1)
    settings = {
        k: getattr(args, k)
        for k in (
            "steps",
            "prompts",
            "group_size",
            "max_turns",
            "step_tokens",
            "alpha",
            "judge_tokens",
            "group_filter",
            "lr",
            "seed",
        )
    }
    record = {
        "bench": "rl_real_run",
        "model": served.model_id,
        "task_set": "toyrepair",
        "settings": settings,
        "served_weights_version": served.weights_version,
        "steps": steps,
    }
    json_path, png_path = args.out / "rl_real_run.json", args.out / "rl_real_run.png"
    json_path.write_text(json.dumps(record, indent=2))
    plot(
        steps,
        png_path,
        f"RL on ToyRepair ({served.model_id}): {args.prompts} x {args.group_size} rollouts "
        f"per step, judge alpha {args.alpha}",
    )
    print(
        json.dumps(
            {
                "bench": "rl_real_run",
                "model": served.model_id,
                "steps": len(steps),
                "reward_mean_per_step": [s["reward_mean"] for s in steps],
                "reward_std_per_step": [s["reward_std"] for s in steps],
                "baseline_reward_mean": steps[0]["reward_mean"] if steps else None,
                "groups_kept_per_step": [s["groups_kept_fraction"] for s in steps],
                "judge_fallback_per_step": [s.get("judge_fallback_fraction") for s in steps],
                "submitted_per_step": [s.get("submitted_fraction") for s in steps],
                "loss_per_step": [s["loss"] for s in steps],
                "seconds_per_step": [s["seconds"] for s in steps],
                "logprob_diff_max_per_step": [s.get("logprob_diff_max") for s in steps],
                "served_weights_version": served.weights_version,
                "services_start_s": round(ready_s, 1),
                "total_s": round(time.perf_counter() - started, 1),
                "json": str(json_path),
                "png": str(png_path),
            }
        )
    )


if __name__ == "__main__":
    main()
