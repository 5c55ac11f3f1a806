"""The task factory on a pinned package's source distribution: tasks kept per hour on this machine, the kept
fraction per strategy, how many of the tasks `orchard tasks validate` passes, and what one trial costs against the
same test files run bare on this host (a venv here, the same pytest). Runs the CLI as a user would, on its own env
service (fresh state dir; images and wheels stay cached under ~/.cache/orchard). One JSON object.

    python bench/task_factory.py [--sdist toolz==1.0.0] [--budget 10] [--max-candidates 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from env_service import ORCHARD, env_service  # noqa: E402


def host_seconds(repo: Path, files: list[str], runs: int = 3) -> float:
    """The median time of the test files run bare here (this venv's pytest, the repository on sys.path): what a
    kept task's trial runs, without the sandbox."""
    times = []
    for _ in range(runs):
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
            cwd=repo,
            # The sandbox's venv holds pytest alone: this venv's other plugins (asyncio, xdist ...) stay unloaded.
            env={**os.environ, "PYTHONPATH": str(repo), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
            capture_output=True,
            check=False,
        )
        times.append(time.monotonic() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sdist", default="toolz==1.0.0")
    parser.add_argument("--budget", type=float, default=10.0, help="minutes of synthesis")
    parser.add_argument("--max-candidates", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp, env_service() as (address, _):
        out = Path(tmp) / "tasks.jsonl"
        started = time.monotonic()
        made = subprocess.run(
            [
                ORCHARD, "tasks", "synthesize", "--sdist", args.sdist, "--out", str(out), "--budget", str(args.budget),
                "--max-candidates", str(args.max_candidates), "--concurrency", str(args.concurrency),
                "--env-address", address,
            ],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        synth_s = time.monotonic() - started
        if made.returncode != 0:
            raise SystemExit(made.stdout + made.stderr)
        summary = json.loads(out.with_name("tasks.summary.json").read_text())
        records = [json.loads(line) for line in out.read_text().splitlines()]
        started = time.monotonic()
        report = Path(tmp) / "validate.json"
        validated = subprocess.run(
            [ORCHARD, "tasks", "validate", "--tasks", str(out), "--env-address", address, "--report", str(report)],
            capture_output=True,
            text=True,
            check=False,
        )
        validate_s = time.monotonic() - started
        rows = json.loads(report.read_text())["instances"] if report.exists() else []
        repo = Path(tmp) / "tasks.repos" / summary["source"].split()[-1].replace("==", "-")
        sample = [sorted({t.split("::")[0] for t in r["FAIL_TO_PASS"] + r["PASS_TO_PASS"]}) for r in records[:5]]
        host = statistics.median(host_seconds(repo, files) for files in sample) if sample else None
    trial = summary["kept_trial_seconds_median"]
    figures = {
        "bench": "task_factory",
        "source": summary["source"],
        "candidates": summary["candidates"],
        "tried": summary["tried"],
        "kept": summary["kept"],
        "synthesis_s": round(synth_s, 1),
        "tasks_per_hour": round(summary["kept"] / synth_s * 3600, 1),
        "per_strategy": summary["per_strategy"],
        "discarded": summary["discarded"],
        "difficulty": summary["difficulty"],
        "validate_exit": validated.returncode,
        "validated": sum(bool(r["ok"]) for r in rows),
        "validate_total": len(records),
        "validate_s": round(validate_s, 1),
        "trial_s_median": summary["trial_seconds_median"],
        "kept_trial_s_median": trial,
        "host_tests_s_median": round(host, 3) if host is not None else None,
        "trial_over_host_tests": round(trial / host, 2) if trial and host else None,
        "loadavg_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "cores": os.cpu_count(),
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
