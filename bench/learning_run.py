"""Learning run: `orchard learn` (base -> distilled -> RL -> best-of-N) at a larger budget, over several seeds, on a
fresh local stack serving the student (`orchard up --model student` on free ports, its state in a temporary folder).
Each seed starts the stack anew, so every run starts from the same untrained student. Writes every seed's
learning.json and a summary to <out>/learning_run.json, the curve (pass@1 by stage, mean and each seed, training
and held-out tasks; the RL reward per step) to <out>/learning_run.png; prints one JSON object. The baseline is the
base stage: the untrained student on the same tasks and samples.

    python bench/learning_run.py [--tasks toyrepair-extended] [--held-out 4] [--seeds 0 1 2] [--out DIR]
                                 [--include EARLIER.json] [-- <more orchard learn flags>]

A seed takes about an hour on 2 cores, so seeds can be run apart: `--include` folds the runs of an earlier
learning_run.json (same tasks, held-out count and flags; its seeds not rerun) into this one's summary and curve.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orchard.cli.learn import ORCHARD

PORTS = ("env", "nats", "inference", "inference-http", "experience", "trainer", "value")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_seed(seed: int, args: argparse.Namespace, extra: list[str], out: Path) -> dict[str, Any]:
    """A fresh stack, one `orchard learn` on it, the stack stopped; the run's learning.json."""
    ports = {name: _free_port() for name in PORTS}
    with tempfile.TemporaryDirectory(prefix="orchard-learning-") as state:
        log = Path(state) / "up.log"
        with log.open("wb") as sink:
            stack = subprocess.Popen(
                [*ORCHARD, "up", "--model", "student", "--state-dir", state]
                + [a for name, port in ports.items() for a in (f"--{name}-port", str(port))],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 600
            while b"stack is ready" not in log.read_bytes():
                if stack.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"orchard up did not start: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            run_id = f"bench-learning-s{seed}"
            addresses = [
                *("--env-address", f"127.0.0.1:{ports['env']}", "--nats-url", f"nats://127.0.0.1:{ports['nats']}"),
                *("--inference-address", f"127.0.0.1:{ports['inference']}"),
                *("--experience-address", f"127.0.0.1:{ports['experience']}"),
                *("--trainer-address", f"127.0.0.1:{ports['trainer']}"),
                *("--value-address", f"127.0.0.1:{ports['value']}"),
            ]
            subprocess.run(
                [*ORCHARD, "learn", "--tasks", args.tasks, "--held-out", str(args.held_out), "--seed", str(seed)]
                + ["--run-id", run_id, "--out", str(out), *addresses, *extra],
                stdout=sys.stderr,  # this script's stdout is its one JSON object
                check=True,
            )
            return dict(json.loads((out / run_id / "learning.json").read_text()))
        finally:
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(timeout=60)
            except subprocess.TimeoutExpired:
                stack.kill()


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread over seeds of every stage's pass@1, and of the RL reward's first and last step."""
    stages: dict[str, Any] = {}
    for name in [s["stage"] for s in runs[0]["stages"]]:
        for part in ("train", "held_out"):
            values = [next(s[part] for s in r["stages"] if s["stage"] == name) for r in runs]
            stages.setdefault(name, {})[part] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "per_seed": values,
            }
    rewards = [r["rl"]["reward_per_step"] for r in runs]
    return {
        "stages": stages,
        "rl_reward_first_mean": statistics.fmean(r[0] for r in rewards),
        "rl_reward_last_mean": statistics.fmean(r[-1] for r in rewards),
        "rl_logprob_diff_max": max(r["rl"]["logprob_diff_max"] for r in runs),
    }


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["stage"] for s in runs[0]["stages"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for part, style, label in (("train", "o-", "training tasks"), ("held_out", "s--", "held-out tasks")):
        per_seed = [[100 * (s[part] or 0) for s in r["stages"]] for r in runs]
        for values in per_seed:
            left.plot(names, values, style, alpha=0.25, color="C0" if part == "train" else "C1")
        left.plot(names, [statistics.fmean(v) for v in zip(*per_seed, strict=True)], style, label=f"{label} (mean)")
    left.set_ylabel("pass@1 (%)")
    left.set_ylim(-2, 102)
    left.legend(fontsize=8)
    left.set_title(f"{runs[0]['tasks']}: pass@1 by stage, {len(runs)} seeds", fontsize=9)
    for r in runs:
        rewards = r["rl"]["reward_per_step"]
        right.plot(range(1, len(rewards) + 1), rewards, "o-", alpha=0.6)
    right.set_xlabel("RL step")
    right.set_ylabel("mean outcome reward")
    right.set_ylim(-1.05, 1.05)
    right.set_title("the RL job's reward per step, each seed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def included_runs(path: Path, args: argparse.Namespace, extra: list[str]) -> tuple[dict[int, dict[str, Any]], float]:
    """The runs of an earlier report by seed, and the seconds they took; refused unless it ran the same pipeline."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--include {path}: not a readable learning_run.json ({e})") from None
    if report.get("bench") != "learning_run":
        raise SystemExit(f"--include {path}: not a learning_run.json (bench={report.get('bench')!r})")
    mine = {"tasks": args.tasks, "held_out": args.held_out, "learn_flags": extra}
    theirs = {key: report.get(key) for key in mine}
    if theirs != mine:
        raise SystemExit(f"--include {path}: it ran {theirs}, this run is {mine}; their seeds are not comparable")
    runs = {int(seed): run for seed, run in zip(report["seeds"], report["runs"], strict=True)}
    return runs, float(report.get("seconds", 0.0)) + float(report.get("seconds_included", 0.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="toyrepair-extended")
    p.add_argument("--held-out", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default=".state/bench/learning_run")
    p.add_argument("--include", type=Path, help="an earlier learning_run.json whose runs join this summary")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    earlier, earlier_seconds = included_runs(args.include, args, extra) if args.include else ({}, 0.0)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    fresh = {seed: one_seed(seed, args, extra, out) for seed in args.seeds if seed not in earlier}
    by_seed = {**earlier, **fresh}
    seeds = sorted(by_seed)
    runs = [by_seed[seed] for seed in seeds]
    report = {
        "bench": "learning_run",
        "tasks": args.tasks,
        "held_out": args.held_out,
        "seeds": seeds,
        "seeds_included": sorted(earlier),
        "learn_flags": extra,
        "cores": os.cpu_count(),
        "seconds": time.monotonic() - started,
        "seconds_included": earlier_seconds,
        **summary(runs),
        "runs": runs,
    }
    (out / "learning_run.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(runs, out / "learning_run.png")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}))


if __name__ == "__main__":
    main()
