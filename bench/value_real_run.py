"""Value real run: the value model's proof on rollouts through real sandboxes (docs/training.md §2.6). `orchard up` starts
NATS and the env, experience and value services (no inference: the synthetic reference policies need no model) and
`orchard serve trainer` the trainer (`orchard up` starts it only with the inference service); five reference
policies of different quality (`orchard rollout --policy reference:Q`, really graded, published to the experience
service) make the history, a middling one 8 fresh candidates per task for evaluation. Cross-validation by task: each
fold's value job (trainer gRPC, JOB_KIND_VALUE) trains on the history without its held-out tasks (decontamination
checked by the trainer against a .txt of them), its checkpoint is loaded into the value service and `orchard eval
--best-of 8 --run` reranks the held-out tasks' candidates. The folds' candidates are merged into one best-of-N
report per seed. Baselines on the same candidates: random@N, the majority vote over patch clusters (no model), and
best@N ranked by score alone (tie margin 0; the service's default margin lets near-ties go to the larger cluster).
"More runs do not lower best@8": every seed is also trained on the two weakest runs only (--no-more-runs skips
it). Writes <out>/value_real_run.json, <out>/value_real_run.png and the runs' trajectories under <out>/runs
(bench/value_backbones.py reads them); prints one JSON object (progress on stderr).

    python bench/value_real_run.py [--tasks toyrepair-extended] [--seeds 2] [--folds 4] [--max-steps 20]
        [--batch 8] [--epochs E] [--lr LR]
                                   [--max-context-tokens T] [--no-more-runs] [--out .state/bench/value_real_run]
                                   [--quick]

AUC and ECE are over the candidates the model scored (Rerank does not score excluded ones, empty patches), pooled
over the folds' models (each fold's model scores its own tasks, so this also asks the folds' scores to be on one
scale); `auc_fold_mean` averages each fold's own AUC (one model's candidates), `auc_within_task` each task's own
AUC, which is what reranking needs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from orchard.cli.runs import stored_run
from orchard.experience.v1 import experience_pb2 as epb
from orchard.tasks import load_instances
from orchard.trainer.v1 import trainer_pb2 as pb
from orchard.trainer.v1 import trainer_pb2_grpc
from orchard.value import metrics as vm
from orchard.value.v1 import value_pb2 as vpb
from orchard.value.v1 import value_pb2_grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))
HISTORY_Q = (0.1, 0.3, 0.5, 0.7, 0.9)
PREFIX_Q = (0.1, 0.3)
"""The history prefix of the "more runs" comparison: the two weakest policies' runs only."""
EVAL_Q = 0.4
CURVE = (1, 2, 4, 8)
JOB_METRICS = (
    "candidates",
    "duplicates_left_out",
    "ungraded_left_out",
    "tasks",
    "tasks_mixed",
    "train_candidates",
    "runs",
    "positive_fraction",
    "bce",
    "pairwise",
    "pairs",
)
"""The value job's final metrics kept per fold (the training set after dedupe, and the last step's loss)."""


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """`orchard up --no-inference --no-trainer` and `orchard serve trainer` (`orchard up` starts the trainer only
    with the inference service, which a value job does not need) on free ports, stopped as Ctrl-C stops them."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.ports = {name: free_port() for name in ("nats", "env", "experience", "value", "trainer")}
        self.address = {name: f"127.0.0.1:{port}" for name, port in self.ports.items()}
        self.nats_url = f"nats://{self.address['nats']}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        up_log = self.work / "up.log"
        with open(up_log, "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [
                        ORCHARD,
                        "up",
                        "--no-inference",
                        "--no-trainer",
                        "--state-dir",
                        str(self.work / "state"),
                        "--nats-port",
                        str(self.ports["nats"]),
                        "--env-port",
                        str(self.ports["env"]),
                        "--experience-port",
                        str(self.ports["experience"]),
                        "--value-port",
                        str(self.ports["value"]),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 300
        while b"stack is ready" not in up_log.read_bytes():
            if self.procs[0].poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"orchard up did not become ready:\n{up_log.read_text()[-3000:]}")
            time.sleep(0.2)
        with open(self.work / "trainer.log", "wb") as out:
            self.procs.append(
                subprocess.Popen(
                    [
                        ORCHARD,
                        "serve",
                        "trainer",
                        "--port",
                        str(self.ports["trainer"]),
                        "--log-format",
                        "text",
                        "--jobs-dir",
                        str(self.work / "state" / "trainer"),
                        "--experience-address",
                        self.address["experience"],
                        "--env-address",
                        self.address["env"],
                        "--nats-url",
                        self.nats_url,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
        with grpc.insecure_channel(self.address["trainer"]) as channel:
            grpc.channel_ready_future(channel).result(timeout=120)

    def stop(self) -> None:
        """The trainer (SIGTERM), then the stack (SIGINT, as Ctrl-C: it stops its services and NATS)."""
        for proc, sig in reversed(list(zip(self.procs, (signal.SIGINT, signal.SIGTERM), strict=False))):
            if proc.poll() is None:
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def rollout(
    stack: Stack, run_id: str, quality: float, samples: int, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One `orchard rollout --policy reference:Q` run over every task; its resolve rate and wall time."""
    shutil.rmtree(args.out / "runs" / run_id, ignore_errors=True)  # orchard rollout appends to a run's file
    started = time.perf_counter()
    done = subprocess.run(
        [
            ORCHARD,
            "rollout",
            "--policy",
            f"reference:{quality}",
            "--tasks",
            args.tasks,
            "-n",
            str(samples),
            "--seed",
            str(seed),
            "--run-id",
            run_id,
            "--concurrency",
            str(args.concurrency),
            "--out",
            str(args.out / "runs"),
            "--env-address",
            stack.address["env"],
            "--nats-url",
            stack.nats_url,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"orchard rollout {run_id} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    report = json.loads((args.out / "runs" / run_id / "report.json").read_text())
    seconds = time.perf_counter() - started
    rate = report["resolved_instances"] / report["submitted_instances"]
    log(
        f"  rollout {run_id}: reference:{quality} x {samples}/task, resolved {report['resolved_instances']}/"
        f"{report['submitted_instances']}, {seconds:.0f}s"
    )
    return {
        "run_id": run_id,
        "quality": quality,
        "samples_per_task": samples,
        "seed": seed,
        "rollouts": report["submitted_instances"],
        "resolved_fraction": round(rate, 4),
        "empty_patches": report["empty_patch_instances"],
        "errors": report["error_instances"],
        "seconds": round(seconds, 1),
    }


def job_config(runs: list[str], held: list[str], eval_file: Path, seed: int, args: argparse.Namespace) -> pb.JobConfig:
    return pb.JobConfig(
        kind=pb.JOB_KIND_VALUE,
        dataset=pb.DatasetSource(
            experience=epb.TrajectoryFilter(run_ids=runs, exclude_task_ids=held), eval_task_files=[str(eval_file)]
        ),
        hyperparameters=pb.Hyperparameters(
            seed=seed, epochs=args.epochs, max_steps=args.max_steps, learning_rate=args.lr, global_batch_size=args.batch
        ),
        value=pb.ValueConfig(eval_fraction=0.0, max_context_tokens=args.max_context_tokens),
    )


async def train_fold(stack: Stack, job_id: str, config: pb.JobConfig) -> dict[str, Any]:
    """The fold's value job, waited for, its final checkpoint loaded into the value service."""
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(stack.address["trainer"]) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        await stub.CreateJob(pb.CreateJobRequest(config=config, job_id=job_id), timeout=30)
        while True:
            waited = await stub.WaitJob(pb.WaitJobRequest(job_id=job_id, timeout=Duration(seconds=300)), timeout=330)
            if waited.done:
                break
    job = waited.job
    if job.state != pb.JOB_STATE_SUCCEEDED:
        raise SystemExit(f"value job {job_id} ended {pb.JobState.Name(job.state)}:\n{job.error[-3000:]}")
    train_s = time.perf_counter() - started
    async with grpc.aio.insecure_channel(stack.address["value"]) as channel:
        loaded = await value_pb2_grpc.ValueServiceStub(channel).LoadModel(
            vpb.LoadModelRequest(checkpoint_path=job.latest_checkpoint.path, version=job.latest_checkpoint.version),
            timeout=300,
        )
    m = job.progress.metrics
    return {
        "job_id": job_id,
        "version": loaded.model.version,
        "steps": job.progress.step,
        "train_seconds": round(train_s, 1),
        "job_seconds": round((job.end_time.ToNanoseconds() - job.start_time.ToNanoseconds()) / 1e9, 1),
        "metrics": {"loss": round(job.progress.loss, 4), **{k: round(m[k], 4) for k in JOB_METRICS if k in m}},
    }


def best_of_n_eval(stack: Stack, run_id: str, held: list[str], report: Path, tasks: str) -> dict[str, Any]:
    """`orchard eval --best-of 8 --run` on the held-out tasks; its JSON report."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            ORCHARD,
            "eval",
            "--best-of",
            "8",
            "--run",
            run_id,
            "--ids",
            *held,
            "--tasks",
            tasks,
            "--report",
            str(report),
            "--experience-address",
            stack.address["experience"],
            "--value-address",
            stack.address["value"],
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"orchard eval --best-of failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    out = json.loads(report.read_text())
    out["eval_seconds"] = round(time.perf_counter() - started, 1)
    return out


def merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One best-of-N report over the folds' candidates (each fold scored by its own model); AUC and ECE are over
    the scored candidates only."""
    rows = [c for r in reports for c in r["candidates_scored"]]
    # The patch cluster id stands in for the patch: equal ids tie-break as equal patches, "" is an empty patch.
    candidates = [vm.Candidate(c["task_id"], c["score"], c["resolved"], c["cluster"], c["excluded"]) for c in rows]
    margins = {r["tie_margin"] for r in reports}
    if len(margins) != 1:
        raise SystemExit(f"the folds were ranked with different tie margins: {sorted(margins)}")
    report: dict[str, Any] = vm.best_of_n_report(candidates, CURVE, margins.pop())
    scored = [c for c in candidates if not c.excluded]
    report["excluded"] = len(candidates) - len(scored)
    within = [
        a
        for task in sorted({c.task_id for c in scored})
        if (
            a := vm.auc(
                [c.score for c in scored if c.task_id == task], [c.resolved for c in scored if c.task_id == task]
            )
        )
        is not None
    ]
    report["auc_within_task"] = sum(within) / len(within) if within else None
    for row in report["curve"]:  # the ranking by score alone, cluster size breaking exact ties only
        row["best_score_only"] = vm.best_at_n(candidates, row["n"], tie_margin=0.0)
    report["picks"] = [p for r in reports for p in r["picks"]]
    report["fold_auc"] = [r["auc"] for r in reports]
    folds_scored = [a for a in report["fold_auc"] if a is not None]
    report["auc_fold_mean"] = sum(folds_scored) / len(folds_scored) if folds_scored else None
    return report


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of a merged report."""
    at = {row["n"]: row for row in report["curve"]}
    out = {
        "pass@1": report["pass@1"],
        "random@8": at[8]["random"],
        "best@8": at[8]["best"],
        "pass@8": at[8]["pass"],
        "vote@8": at[8]["vote"],
        "best@8_score_only": at[8]["best_score_only"],
        "tie_margin": report["tie_margin"],
        "auc": report["auc"],
        "auc_within_task": report["auc_within_task"],
        "auc_fold_mean": report["auc_fold_mean"],
        "ece": report["ece"],
    }
    out["best@8_over_random@8"] = out["best@8"] / out["random@8"] if out["random@8"] else None
    out["curve"] = report["curve"]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


async def cross_validate(
    stack: Stack, seed: int, folds: list[list[str]], runs: list[str], eval_run: str, tag: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Every fold trained on `runs` without its tasks and evaluated on them; the merged report."""
    fold_out, reports = [], []
    for k, held in enumerate(folds):
        eval_file = stack.work / f"heldout-{seed}-{k}.txt"
        eval_file.write_text("".join(f"{t}\n" for t in held))
        job_id = f"value-{tag}-s{seed}-f{k}"
        trained = await train_fold(stack, job_id, job_config(runs, held, eval_file, seed, args))
        report = best_of_n_eval(stack, eval_run, held, args.out / "folds" / f"{job_id}.json", args.tasks)
        log(
            f"  fold {k} {held}: {trained['steps']} steps, {trained['train_seconds']}s; training set "
            f"{trained['metrics'].get('candidates', 0):.0f} candidates "
            f"({trained['metrics'].get('duplicates_left_out', 0):.0f} "
            f"duplicates left out); best@8 {report['best@8']:.2f}, AUC {report['auc']}"
        )
        reports.append(report)
        fold_out.append(
            {
                "held_out": held,
                **trained,
                "eval_seconds": report["eval_seconds"],
                "best@8": report["best@8"],
                "auc": report["auc"],
            }
        )
    report = merged(reports)
    return {"folds": fold_out, "report": report, **summary(report)}


async def run_seed(stack: Stack, seed: int, more_runs: bool, args: argparse.Namespace) -> dict[str, Any]:
    log(f"seed {seed}: history {HISTORY_Q} x {args.history_samples}/task, eval reference:{EVAL_Q} x 8/task")
    # Distinct rollout seeds per run: a reference rollout's plan is seeded by (task, seed + 1000 x sample).
    history = [
        rollout(
            stack, f"hist-{seed}-q{round(100 * q):02d}", q, args.history_samples, 100_000 * seed + 10_000 * i + 1, args
        )
        for i, q in enumerate(HISTORY_Q)
    ]
    evaluation = rollout(stack, f"eval-{seed}", EVAL_Q, 8, 100_000 * seed + 90_001, args)
    for run in [*history, evaluation]:  # the experience service stores events a moment after they are published
        stored = await stored_run(stack.address["experience"], run["run_id"], wait_s=120)
        if len(stored) != run["rollouts"]:
            raise SystemExit(
                f"the experience service holds {len(stored)} of run {run['run_id']}'s {run['rollouts']} rollouts"
            )
    tasks = sorted(i.instance_id for i in load_instances(args.tasks))
    random.Random(seed).shuffle(tasks)
    folds = [tasks[k :: args.folds] for k in range(args.folds)]
    result = await cross_validate(stack, seed, folds, [r["run_id"] for r in history], evaluation["run_id"], "all", args)
    log(
        f"seed {seed}: best@8 {result['best@8']:.3f} vs random@8 {result['random@8']:.3f} (pass@8 "
        f"{result['pass@8']:.3f}), AUC {result['auc']}"
    )
    out = {"seed": seed, "history": history, "eval_run": evaluation, **result}
    if more_runs:
        prefix = [r["run_id"] for r in history if r["quality"] in PREFIX_Q]
        fewer = await cross_validate(stack, seed, folds, prefix, evaluation["run_id"], "prefix", args)
        log(
            f"seed {seed}: runs {PREFIX_Q} only: best@8 {fewer['best@8']:.3f}, AUC {fewer['auc']}; all five: "
            f"best@8 {result['best@8']:.3f}"
        )
        out["more_runs"] = {
            "prefix_qualities": list(PREFIX_Q),
            "prefix": fewer,
            "best@8_prefix": fewer["best@8"],
            "best@8_all": result["best@8"],
            "auc_prefix": fewer["auc"],
            "auc_all_runs": result["auc"],
        }
    return out


def plot(curves: list[list[dict[str, float]]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [row["n"] for row in curves[0]]

    def mean(key: str) -> list[float]:
        return [100 * sum(c[i][key] for c in curves) / len(curves) for i in range(len(ns))]

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, label, style in (
        ("pass", "pass@N (oracle)", "k--"),
        ("best", "best@N (value model)", "o-"),
        ("best_score_only", "best@N by score alone (tie margin 0)", "x:"),
        ("vote", "majority vote@N (patch clusters, no model)", "^-."),
        ("random", "random@N (baseline)", "s:"),
    ):
        ax.plot(ns, mean(key), style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("N candidates per task")
    ax.set_ylabel("tasks resolved (%)")
    ax.set_ylim(-2, 102)
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=2, help="independent repeats (fresh rollouts and folds)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first repeat's seed (a seed repeats exactly)")
    parser.add_argument(
        "--tasks",
        default="toyrepair-extended",
        help="the task set (bundled name or file); toyrepair-extended is ToyRepair's 8 tasks and 16 more",
    )
    parser.add_argument("--folds", type=int, default=4, help="cross-validation folds over the tasks")
    parser.add_argument("--history-samples", type=int, default=4, help="rollouts per task of each history policy")
    parser.add_argument("--epochs", type=int, default=0, help="value job epochs (0: the recipe's)")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=20,
        help="value job steps (0: the recipe's epochs, at "
        "least 40 steps on a small store); 20 of 8 as the main job, so 12 jobs fit the time budget",
    )
    parser.add_argument("--lr", type=float, default=0.0, help="value job learning rate (0: the recipe's)")
    parser.add_argument("--batch", type=int, default=8, help="candidates per value job step (0: the recipe's 16)")
    parser.add_argument("--max-context-tokens", type=int, default=0, help="value model context (0: the recipe's)")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight")
    parser.add_argument("--no-more-runs", action="store_true", help="skip the prefix-of-history comparison")
    parser.add_argument("--out", type=Path, default=Path(".state/bench/value_real_run"))
    parser.add_argument("--quick", action="store_true", help="one seed, two folds of four tasks")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.folds = 1, 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="orchard-bench-value-"))
    stack = Stack(work)
    started = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the stack (finally below)
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        stack.start()
        ready_s = time.perf_counter() - started
        log(f"stack ready in {ready_s:.0f}s ({work})")
        seeds = [
            asyncio.run(run_seed(stack, s, not args.no_more_runs, args))
            for s in range(args.first_seed, args.first_seed + args.seeds)
        ]
    finally:
        stack.stop()
        for name in ("up.log", "trainer.log"):
            shutil.copy(work / name, args.out / name)
        shutil.rmtree(work, ignore_errors=True)  # the jobs' checkpoints (~90 MB each)
    total_s = time.perf_counter() - started

    def mean(key: str) -> float | None:
        values = [s[key] for s in seeds if s[key] is not None]
        return round(sum(values) / len(values), 4) if values else None

    keys = (
        "pass@1",
        "random@8",
        "best@8",
        "pass@8",
        "vote@8",
        "best@8_score_only",
        "auc",
        "auc_within_task",
        "auc_fold_mean",
        "ece",
        "best@8_over_random@8",
    )
    average: dict[str, Any] = {k: mean(k) for k in keys}
    average["best@8_over_random@8"] = round(average["best@8"] / average["random@8"], 4)
    average["curve"] = [
        {
            "n": row["n"],
            **{
                k: round(sum(s["curve"][i][k] for s in seeds) / len(seeds), 4)
                for k in ("random", "best", "pass", "vote", "best_score_only")
            },
        }
        for i, row in enumerate(seeds[0]["curve"])
    ]
    settings = {
        k: getattr(args, k)
        for k in (
            "seeds",
            "first_seed",
            "folds",
            "history_samples",
            "epochs",
            "max_steps",
            "lr",
            "batch",
            "max_context_tokens",
            "concurrency",
        )
    }
    settings |= {"history_qualities": list(HISTORY_Q), "eval_quality": EVAL_Q, "eval_samples_per_task": 8}
    timings = {
        "services_start_s": round(ready_s, 1),
        "total_s": round(total_s, 1),
        "rollout_s": round(sum(r["seconds"] for s in seeds for r in [*s["history"], s["eval_run"]]), 1),
        "train_s_per_fold": [f["train_seconds"] for s in seeds for f in s["folds"]],
    }
    record = {
        "bench": "value_real_run",
        "task_set": args.tasks,
        "settings": settings,
        "mean": average,
        "seeds": seeds,
        "timings": timings,
    }
    json_path, png_path = args.out / "value_real_run.json", args.out / "value_real_run.png"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    plot(
        [s["curve"] for s in seeds],
        png_path,
        f"best-of-N on ToyRepair, reference:{EVAL_Q} candidates, value model cross-validated by task\n"
        f"({args.folds} folds, {args.seeds} seeds; history reference:{','.join(map(str, HISTORY_Q))})",
    )
    more_seeds = [s["more_runs"] for s in seeds if "more_runs" in s]
    more = (
        None
        if not more_seeds
        else {
            k: round(sum(m[k] for m in more_seeds) / len(more_seeds), 4)
            for k in ("best@8_prefix", "best@8_all", "auc_prefix", "auc_all_runs")
        }
    )
    print(
        json.dumps(
            {
                "bench": "value_real_run",
                "tie_margin": seeds[0]["tie_margin"],
                **{k: average[k] for k in keys},
                "per_seed": [{k: s[k] for k in keys} for s in seeds],
                "best@8_clears_random@8_plus_10pt": average["best@8"] >= average["random@8"] + 0.10,
                "more_runs": more,
                "more_runs_per_seed": [
                    {k: m[k] for k in ("best@8_prefix", "best@8_all", "auc_prefix", "auc_all_runs")} for m in more_seeds
                ],
                "training_set": [f["metrics"] for f in seeds[0]["folds"]],
                **timings,
                "json": str(json_path),
                "png": str(png_path),
            }
        )
    )


if __name__ == "__main__":
    main()
