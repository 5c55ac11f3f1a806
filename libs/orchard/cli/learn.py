"""`orchard learn`: the learning pipeline on a task set, through the running stack, told in numbers.

The last `--held-out` tasks are never trained on. On the rest: the policy the inference service serves is
evaluated (pass@1 of `--samples` rollouts per task, on the training and the held-out tasks), an expert teacher
writes one trajectory per training task (`orchard rollout --policy expert`), an SFT job distils them into the
policy (`orchard train --kind sft --push`), an RL job (GRPO on the outcome reward, rolling out through the env and
inference services) trains it further (`orchard train --kind rl --push`), and each trained policy is evaluated the
same way. Last, a value model is trained on the stored history of those runs (the held-out tasks' rollouts left
out, and the final evaluation's too: those are the candidates it reranks) and picks one of the final evaluation's
samples per task (`orchard eval --best-of`). Each step is the `orchard` command of its own, run as a child process
with the settings shown; the table, a JSON file and a PNG plot end the run.

Start the stack on a model that can learn here: `orchard up --model student` (docs/main-job.md)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchard.cli.arguments import count, fraction, rate
from orchard.errors import FailedPrecondition, InvalidArgument

ORCHARD = [sys.executable, "-c", "import sys; from orchard.cli import main; main(sys.argv[1:])"]
"""This `orchard`, run as a child process (the same interpreter, whatever the PATH)."""


RUN_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?$")
"""--run-id: the job ids made from it (<run id>-value, at most 63 characters) must be valid trainer job ids."""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "learn",
        help="distil an expert into the served policy, then RL, then rerank with a value model: pass@1 at every "
        "stage on training and held-out tasks",
    )
    p.add_argument("--tasks", default="toyrepair", help="the task set (a bundled name or a task file)")
    p.add_argument("--held-out", type=count(1), default=2, help="the last N tasks are never trained on (default: 2)")
    g = p.add_argument_group("evaluation", "every stage's pass@1, and the RL job's rollouts")
    g.add_argument("-n", "--samples", type=count(2), default=4, help="rollouts per task and stage (default: 4)")
    g.add_argument("--max-steps", type=count(1), default=3, help="model replies per rollout (default: 3)")
    g.add_argument("--max-step-tokens", type=count(1), default=128, help="tokens per reply (default: 128)")
    g.add_argument("--temperature", type=rate, default=1.0, help="sampling temperature (default: 1.0)")
    g.add_argument("--seed", type=count(0), default=0, help="seeds every stage's sampling and jobs (default: 0)")
    g = p.add_argument_group("training")
    g.add_argument("--sft-epochs", type=count(1), default=160, help="epochs over the teacher's trajectories")
    g.add_argument("--sft-lr", type=rate, default=3e-3, help="the SFT job's learning rate (default: 3e-3)")
    g.add_argument("--rl-steps", type=count(1), default=6, help="the RL job's steps (default: 6)")
    g.add_argument("--rl-lr", type=rate, default=5e-4, help="the RL job's learning rate (default: 5e-4)")
    g.add_argument("--group-size", type=count(2), default=4, help="RL rollouts per task and step (default: 4)")
    g.add_argument(
        "--rl-updates", type=count(1), default=4, help="the RL job's optimiser steps per rollout step (default: 4)"
    )
    g.add_argument(
        "--rl-warmup",
        type=fraction,
        default=0.34,
        help="the fraction of the RL job's steps over which its learning rate rises to --rl-lr (default: 0.34, the "
        "first 2 of 6: a full first step knocked the distilled student's resolved fraction from 0.62 to 0.21; "
        "docs/training.md#learning-on-a-cpu)",
    )
    g.add_argument(
        "--rl-negative-scale",
        type=fraction,
        default=0.0,
        help="the RL job's scale of negative advantages (default: 0, the better rollouts only: a student that "
        "memorised its trajectories unlearns them under negative ones; docs/training.md#learning-on-a-cpu)",
    )
    g.add_argument("--value-steps", type=count(1), default=20, help="the value job's steps (default: 20)")
    g.add_argument("--best-of", type=count(2), default=4, help="candidates reranked per task (default: 4)")
    p.add_argument("--run-id", default="", help="the prefix of every run and job id (default: learn-<time>)")
    p.add_argument("--out", default="runs", help="runs go to <out>/<run id>-*; the report to <out>/<run id>/")
    g = p.add_argument_group("the stack (orchard up's addresses by default)")
    g.add_argument("--env-address", default="127.0.0.1:50051")
    g.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    g.add_argument("--inference-address", default="127.0.0.1:50052")
    g.add_argument("--experience-address", default="127.0.0.1:50055")
    g.add_argument("--trainer-address", default="127.0.0.1:50056")
    g.add_argument("--value-address", default="127.0.0.1:50057")
    p.set_defaults(func=cmd_learn)


def orchard(argv: list[str]) -> str:
    """Run one `orchard` command (its progress on our stderr), echo its stdout and return it; FailedPrecondition
    naming the command when it fails."""
    print(f"\n$ orchard {' '.join(argv)}", file=sys.stderr, flush=True)
    done = subprocess.run([*ORCHARD, *argv], stdout=subprocess.PIPE, text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stdout.flush()
    if done.returncode:
        raise FailedPrecondition(f"`orchard {argv[0]}` failed (exit code {done.returncode}); its output is above")
    return done.stdout


def pass_at_1(report: dict[str, Any], ids: list[str]) -> float | None:
    """Mean per-task pass@1 over `ids` in an `orchard rollout` report (None without those tasks)."""
    rows = [t for t in report["tasks"] if t["instance_id"] in ids]
    return sum(t["resolved"] / t["samples"] for t in rows) / len(rows) if rows else None


def picked(best_of: dict[str, Any], ids: list[str]) -> float | None:
    """The fraction of `ids` whose reranked pick resolved the task, from an `orchard eval --best-of` report."""
    picks = [p for p in best_of["picks"] if p["task_id"] in ids]
    return sum(p["resolved"] for p in picks) / len(picks) if picks else None


def cmd_learn(args: argparse.Namespace) -> int:
    from orchard.tasks import load_instances

    ids = [t.instance_id for t in load_instances(args.tasks)]  # InvalidArgument for a bad set, here
    if len(ids) <= args.held_out:
        raise InvalidArgument(f"--held-out {args.held_out} leaves none of the {len(ids)} tasks to train on")
    train, held = ids[: -args.held_out], ids[-args.held_out :]
    run = args.run_id or f"learn-{int(time.time())}"
    if not RUN_ID.match(run):
        raise InvalidArgument(
            f"--run-id {run!r} must be lowercase letters, digits and '-', at most 50, starting and ending with a "
            "letter or digit: it names the trainer's jobs (<run id>-sft, -rl, -value)"
        )
    out = Path(args.out)
    folder = out / run
    folder.mkdir(parents=True, exist_ok=True)
    stack = ["--env-address", args.env_address, "--nats-url", args.nats_url]
    budgets = ["--max-steps", str(args.max_steps), "--max-step-tokens", str(args.max_step_tokens)]
    sampling = [*budgets, "--temperature", str(args.temperature), "--seed", str(args.seed)]
    trainer = ["--trainer-address", args.trainer_address, "--inference-address", args.inference_address]
    started = time.monotonic()
    stages: list[dict[str, Any]] = []

    def evaluate(stage: str, what: str) -> dict[str, Any]:
        run_id = f"{run}-eval-{stage}"
        orchard(
            ["rollout", "--tasks", args.tasks, "-n", str(args.samples), *sampling, "--concurrency", "16"]
            + [*stack, "--inference-address", args.inference_address, "--run-id", run_id, "--out", str(out)]
        )
        report = json.loads((out / run_id / "report.json").read_text())
        row = {"stage": stage, "what": what, "run_id": run_id, "model": report["model"]}
        row |= {"train": pass_at_1(report, train), "held_out": pass_at_1(report, held)}
        stages.append(row)
        return row

    evaluate("base", "the served policy")
    # The teacher: one shortest trajectory per training task, graded in real sandboxes and stored.
    teacher = f"{run}-teacher"
    orchard(
        ["rollout", "--tasks", args.tasks, "--ids", *train, "--policy", "expert", *stack, "--run-id", teacher]
        + ["--out", str(out)]
    )
    sft = f"{run}-sft"
    orchard(
        ["train", "--kind", "sft", "--run", teacher, "--base-model", "served", "--lr", str(args.sft_lr)]
        + ["--epochs", str(args.sft_epochs), "--batch", str(len(train)), "--micro-batch", str(len(train))]
        + ["--job-id", sft, "--push", *trainer]
        + ["--report", str(folder / "sft.json")]
    )
    evaluate("distilled", f"SFT on the expert's trajectories, {args.sft_epochs} epochs")
    rl = f"{run}-rl"
    orchard(
        ["train", "--kind", "rl", "--tasks", args.tasks, "--ids", *train, "--base-model", "served"]
        + ["--lr", str(args.rl_lr), "--warmup", str(args.rl_warmup), "--max-steps", str(args.rl_steps)]
        + ["--group-size", str(args.group_size)]
        + ["--updates-per-step", str(args.rl_updates), "--negative-advantage-scale", str(args.rl_negative_scale)]
        + ["--prompts", str(len(train)), "--max-turns", str(args.max_steps)]
        + ["--max-step-tokens", str(args.max_step_tokens), "--temperature", str(args.temperature)]
        + ["--seed", str(args.seed), "--job-id", rl, "--push", *trainer, "--report", str(folder / "rl.json")]
    )
    better = ", the better rollouts only" if args.rl_negative_scale == 0 else ""
    final = evaluate("rl", f"GRPO on the outcome reward, {args.rl_steps} steps{better}")
    # The value model: every stored run but the one it reranks, the held-out tasks left out (decontamination).
    history = [f"{run}-eval-base", teacher, f"{run}-eval-distilled", rl]
    held_file = folder / "held-out.txt"
    held_file.write_text("".join(f"{i}\n" for i in held))
    orchard(
        ["train", "--kind", "value", *[a for r in history for a in ("--run", r)], "--exclude-ids", *held]
        + ["--eval-tasks", str(held_file.resolve()), "--max-steps", str(args.value_steps), "--batch", "8"]
        + ["--seed", str(args.seed), "--job-id", f"{run}-value", "--push", "--trainer-address", args.trainer_address]
        + ["--value-address", args.value_address, "--report", str(folder / "value.json")]
    )
    best_file = folder / "best_of_n.json"
    orchard(
        ["eval", "--best-of", str(args.best_of), "--run", final["run_id"], "--tasks", args.tasks]
        + ["--experience-address", args.experience_address, "--value-address", args.value_address]
        + ["--report", str(best_file)]
    )
    best = json.loads(best_file.read_text())
    stages.append(
        {
            "stage": f"best-of-{args.best_of}",
            "what": f"the value model's pick of the {args.best_of} RL-stage samples",
            "run_id": final["run_id"],
            "model": best["value_model"],
            "train": picked(best, train),
            "held_out": picked(best, held),
        }
    )
    rl_report = json.loads((folder / "rl.json").read_text())
    report = {
        "run_id": run,
        "tasks": args.tasks,
        "train_ids": train,
        "held_out_ids": held,
        "samples": args.samples,
        "stages": stages,
        "teacher_run": teacher,
        "rl": rl_summary(rl_report),
        "seconds": time.monotonic() - started,
    }
    (folder / "learning.json").write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    drawn = plot(report, folder / "learning.png")
    print(f"report written to {folder / 'learning.json'}" + (f" and {folder / 'learning.png'}" if drawn else ""))
    return 0


def rl_summary(rl_report: dict[str, Any]) -> dict[str, Any]:
    """What the RL job's steps show: the reward per step, and whether they carried signal and were on-policy."""
    steps = rl_report["per_step"]

    def each(key: str) -> list[float]:
        return [s.get(key, 0.0) for s in steps]

    return {
        "job_id": rl_report["job_id"],
        "reward_per_step": each("reward_mean"),
        "resolved_per_step": each("resolved_fraction"),
        "groups_kept_per_step": each("groups_kept_fraction"),
        "advantage_abs_mean_per_step": each("advantage_abs_mean"),
        "kl_per_step": each("kl"),
        "logprob_diff_max": max(each("logprob_diff_max"), default=0.0),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(report: dict[str, Any]) -> str:
    """The stages as a table: pass@1 on the training and the held-out tasks, then what the RL steps showed."""
    train, held = len(report["train_ids"]), len(report["held_out_ids"])
    lines = [
        f"learning on {report['tasks']}: {train} training tasks, {held} held out, pass@1 of {report['samples']} "
        f"samples per task ({report['seconds'] / 60:.1f} min)",
        f"{'STAGE':<14}{'TRAIN':>8}{'HELD-OUT':>10}  WHAT",
    ]
    lines += [f"{s['stage']:<14}{_pct(s['train']):>8}{_pct(s['held_out']):>10}  {s['what']}" for s in report["stages"]]
    rl = report["rl"]
    rewards = rl["reward_per_step"]
    lines.append(
        f"RL job {rl['job_id']}: reward per step {' '.join(f'{r:+.2f}' for r in rewards)}; groups kept "
        f"{sum(rl['groups_kept_per_step']) / max(len(rewards), 1):.2f}, |advantage| "
        f"{sum(rl['advantage_abs_mean_per_step']) / max(len(rewards), 1):.2f} on average; trainer vs inference "
        f"log-prob of the sampled tokens differ by at most {rl['logprob_diff_max']:.1e}"
    )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> bool:
    """pass@1 by stage (training and held-out tasks) and the RL reward per step, as a PNG; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stages = report["stages"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    xs = range(len(stages))
    for offset, key, label in ((-0.2, "train", "training tasks"), (0.2, "held_out", "held-out tasks")):
        values = [100 * (s[key] or 0) for s in stages]
        left.bar([x + offset for x in xs], values, width=0.4, label=label)
        for x, value in zip(xs, values, strict=True):  # a zero is a bar too short to see: say it
            left.text(x + offset, value + 1, f"{value:.0f}", ha="center", fontsize=7)
    left.set_xticks(list(xs), [s["stage"] for s in stages], fontsize=8)
    left.set_ylabel("pass@1 (%)")
    left.set_ylim(0, 115)
    left.legend(fontsize=8, loc="upper left")
    left.set_title(f"{report['tasks']}: pass@1 by stage", fontsize=9)
    rewards = report["rl"]["reward_per_step"]
    right.plot(range(1, len(rewards) + 1), rewards, "o-")
    right.set_xlabel("RL step")
    right.set_ylabel("mean outcome reward")
    right.set_ylim(-1.05, 1.05)
    right.set_title("the RL job's reward per step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
