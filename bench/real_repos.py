"""Real-repository environments: build time per environment (and per instance state), and the time of a grade
after the build against the tests' own run on this host (a venv here, from the same wheelhouse) and inside an
already open sandbox. Uses the two repositories of tests/integration/test_real_repos.py (Python 3.11 with pinned
packages; Python 3.9 with Debian's less). Starts its own env service on a fresh state dir (images and wheels stay
cached under ~/.cache/orchard). One JSON object.

    python bench/real_repos.py [--grades 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from env_service import env_service  # noqa: E402
from test_real_repos import (  # noqa: E402
    CFGREAD,
    CFGREAD_FIX,
    CFGREAD_TEST,
    PAGER,
    PAGER_FIX,
    PAGER_TEST,
    SPECS,
    git_repo,
)

from orchard import AsyncSandboxClient  # noqa: E402
from orchard.tasks import load_instances  # noqa: E402
from orchard.tasks.environments import builder_for, task_sandbox, wheelhouse  # noqa: E402
from orchard.tasks.grading import grade  # noqa: E402


def make_tasks(root: Path) -> tuple[Path, Path]:
    rows = []
    for name, files, fix, test, extra in (
        (
            "cfgread",
            CFGREAD,
            CFGREAD_FIX,
            CFGREAD_TEST,
            {
                "FAIL_TO_PASS": ["tests/test_default.py::test_default_port"],
                "PASS_TO_PASS": ["tests/test_cfg.py::test_explicit_port"],
            },
        ),
        (
            "pagerkit",
            PAGER,
            PAGER_FIX,
            PAGER_TEST,
            {
                "version": "0.1",
                "FAIL_TO_PASS": ["tests/test_pager.py::test_pager_is_less"],
                "PASS_TO_PASS": ["tests/test_env.py::test_python_39"],
            },
        ),
    ):
        fields = git_repo(root / name, files, fix, test)
        rows.append(
            {
                "instance_id": f"{name}-1",
                "repo": f"local/{name}",
                "repo_dir": name,
                "problem_statement": "x",
                **extra,
                **fields,
            }
        )
    (root / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "specs.json").write_text(json.dumps(SPECS))
    return root / "tasks.jsonl", root / "specs.json"


def host_test_seconds(repo: Path, instance, spec, n: int) -> float:  # type: ignore[no-untyped-def]
    """The graded tests run here, in a venv made from the same wheelhouse (Python 3.11 specs only)."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        wheels = wheelhouse(
            list(spec.venv_requirements) + ["tomli==2.2.1"], spec.python, Path.home() / ".cache" / "orchard"
        )
        pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(wheels)]
        subprocess.run([*pip, *spec.venv_requirements], check=True)
        subprocess.run([*pip, "-e", str(repo)], check=True, cwd=repo)
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "HEAD~1"], check=True)
        times = []
        for _ in range(n):
            started = time.perf_counter()
            subprocess.run(
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    *instance.test_files[1:],
                ],
                cwd=repo,
                capture_output=True,
                check=False,
            )
            times.append(time.perf_counter() - started)
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-"], check=True)
        return statistics.median(times)


async def measure(address: str, tasks: Path, specs: Path, grades: int) -> dict[str, object]:
    instances = load_instances(tasks, env_specs=specs)
    out: dict[str, object] = {}
    async with AsyncSandboxClient(target=address) as client:
        builder = builder_for(client)
        for instance in instances:
            assert instance.environment is not None
            started = time.monotonic()
            await builder.environment(instance.environment)
            env_s = time.monotonic() - started
            prepared = await builder.prepare(instance)
            again = await builder.prepare(instance)
            gold = []
            for _ in range(grades):
                result = await grade(client, instance, instance.patch)
                assert result.resolved, result.log_tail
                gold.append(result.duration_s)
            sandbox, _ = await task_sandbox(client, instance, labels={}, timeout=600)
            async with sandbox:
                own = []
                files = " ".join(shlex.quote(f) for f in instance.test_files[1:])
                for _ in range(grades):
                    started = time.monotonic()
                    await sandbox.exec(f"{instance.command} {files}", cwd=instance.workdir)
                    own.append(time.monotonic() - started)
            out[instance.instance_id] = {
                "python": instance.environment.python,
                "image": instance.environment.image,
                "environment_build_s": round(env_s, 1),
                "instance_build_s": round(prepared.seconds, 1),
                "instance_found_again_s": round(again.seconds, 3),
                "grade_p50_s": round(statistics.median(gold), 2),
                "tests_in_open_sandbox_p50_s": round(statistics.median(own), 2),
                "grade_overhead_s": round(statistics.median(gold) - statistics.median(own), 2),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grades", type=int, default=5)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        tasks, specs = make_tasks(Path(tmp))
        with env_service() as (address, _):
            figures = asyncio.run(measure(address, tasks, specs, args.grades))
        cfg = load_instances(tasks, env_specs=specs)[0]
        assert cfg.environment is not None
        host = host_test_seconds(Path(tmp) / "cfgread", cfg, cfg.environment, args.grades)
    cfgread = cast(dict[str, float], figures["cfgread-1"])  # measure's figures for that instance
    cfgread["tests_on_this_host_p50_s"] = round(host, 2)
    cfgread["grade_ratio_to_host_tests"] = round(cfgread["grade_p50_s"] / host, 1)
    figures["loadavg_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
