"""The main job end to end (scripts/main.sh, step by step): `orchard up` starts the real stack (nats-server and
the env, experience and inference services), the quick start runs verbatim against it on a real repository
(pytest fails, the patch fixes it, pytest passes), `orchard rollout` runs the embedded model on the bundled
ToyRepair tasks (k = 2) and prints the SWE-bench-style report, `orchard eval --run` reads every rollout back
from the experience service into the same report, and Ctrl-C (SIGINT) stops everything cleanly."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orchard.services.env.images import ImageStore, default_images_dir
from orchard.tasks import load_instances

ROOT = Path(__file__).resolve().parents[2]
ORCHARD = Path(sys.executable).with_name("orchard")
TASKS = [t.instance_id for t in load_instances("toyrepair")]
K = 2
ROLLOUT = ["--tasks", "toyrepair", "-n", str(K), "--max-steps", "2", "--max-step-tokens", "64", "--concurrency", "16"]
"""scripts/main.sh's `orchard rollout` budgets."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _report_lines(output: str) -> list[str]:
    """The SWE-bench-style table a command printed: the header, one row per task, the summary line."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TASK "))
    return lines[start:start + len(TASKS) + 2]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_main_job(tmp_path: Path) -> None:
    """The README's main job: stack up, quick start prints a failing then a passing pytest run, k rollouts of every
    bundled task give a report, the experience service gives the same report from all of them, stack down."""
    asyncio.run(ImageStore(default_images_dir()).build("python:3.11-slim"))  # at once when cached
    env_port, nats_port, inference_port, openai_port = _free_port(), _free_port(), _free_port(), _free_port()
    experience_port = _free_port()
    with open(tmp_path / "up.log", "w+b") as log:
        stack = subprocess.Popen(
            [str(ORCHARD), "up", "--env-port", str(env_port), "--nats-port", str(nats_port),
             "--inference-port", str(inference_port), "--inference-http-port", str(openai_port),
             "--experience-port", str(experience_port),
             "--state-dir", str(tmp_path / "state")], stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120  # the inference service loads the embedded model (a few seconds)
            while b"stack is ready" not in (tmp_path / "up.log").read_bytes():
                assert stack.poll() is None, (tmp_path / "up.log").read_text()
                assert time.monotonic() < deadline, "orchard up did not become ready in 120 s"
                time.sleep(0.1)
            services = _children(stack.pid)
            assert len(services) == 4  # nats-server, the env, experience and inference services
            addresses = ["--env-address", f"127.0.0.1:{env_port}", "--nats-address", f"127.0.0.1:{nats_port}",
                         "--inference-address", f"127.0.0.1:{inference_port}",
                         "--experience-address", f"127.0.0.1:{experience_port}"]
            status = subprocess.run([str(ORCHARD), "status", *addresses], check=False, capture_output=True, text=True)
            assert status.returncode == 0, status.stdout + status.stderr
            assert "SERVING, sandboxes: none" in status.stdout and status.stdout.count(" up ") == 4
            assert "SmolLM2-135M-Instruct (transformers" in status.stdout
            assert "SERVING, trajectories: 0 (0 finished)" in status.stdout

            run = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                                 env={**os.environ, "ORCHARD_ENV_ADDRESS": f"127.0.0.1:{env_port}"}, check=False,
                                 capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stderr
            first, second = run.stdout.split("test session starts")
            assert "FAILED tests/test_calc.py::test_median_even" in first
            assert "1 failed, 3 passed" in first and "\n 1\n" in first  # print(result.stdout, result.exit_code)
            assert "4 passed" in second and second.rstrip().endswith("\n 0")

            rollout = subprocess.run(
                [str(ORCHARD), "rollout", *ROLLOUT, "--env-address", f"127.0.0.1:{env_port}",
                 "--nats-url", f"nats://127.0.0.1:{nats_port}", "--inference-address", f"127.0.0.1:{inference_port}",
                 "--run-id", "main-e2e", "--out", str(tmp_path / "runs")],
                check=False, capture_output=True, text=True, timeout=900)
            assert rollout.returncode == 0, rollout.stdout + rollout.stderr
            table = _report_lines(rollout.stdout)
            assert table[0].split() == ["TASK", "RESOLVED", "PASS@1", f"PASS@{K}"]
            assert [row.split()[0] for row in table[1:-1]] == TASKS
            assert all(row.split()[1].endswith(f"/{K}") for row in table[1:-1])
            assert table[-1].startswith("pass@1 ") and f" pass@{K} " in table[-1]
            resolved = sum(int(row.split()[1].split("/")[0]) for row in table[1:-1])
            assert f"resolved {resolved}/{len(TASKS) * K}" in table[-1]
            assert f"{len(TASKS)}/{len(TASKS) * K} rollouts" in rollout.stderr  # the progress bar's last state
            assert f"stored {len(TASKS) * K} rollouts" in rollout.stdout and "published " in rollout.stdout
            report = json.loads((tmp_path / "runs" / "main-e2e" / "report.json").read_text())
            assert (report["total_instances"], report["submitted_instances"], report["schema_version"]) == (
                len(TASKS), len(TASKS) * K, 2)
            stored = (tmp_path / "runs" / "main-e2e" / "trajectories.jsonl").read_text().splitlines()
            assert len(stored) == len(TASKS) * K

            # Every rollout is stored and queryable: the experience service gives back all of them, same report.
            evaluated = subprocess.run([str(ORCHARD), "eval", "--run", "main-e2e", "--tasks", "toyrepair",
                                        "--experience-address", f"127.0.0.1:{experience_port}"],
                                       check=False, capture_output=True, text=True, timeout=120)
            assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
            assert _report_lines(evaluated.stdout) == table
            assert f"read {len(TASKS) * K} rollouts of run main-e2e back from the experience" in evaluated.stdout
            status = subprocess.run([str(ORCHARD), "status", *addresses], check=False, capture_output=True, text=True)
            assert f"trajectories: {len(TASKS) * K} ({len(TASKS) * K} finished)" in status.stdout

            stack.send_signal(signal.SIGINT)
            assert stack.wait(timeout=60) == 0
            assert not [pid for pid in services if _alive(pid)]
            down = subprocess.run([str(ORCHARD), "status", *addresses], check=False, capture_output=True, text=True)
            assert down.returncode == 1 and down.stdout.count("DOWN") == 4
        finally:
            if stack.poll() is None:  # a failed assertion: stop the stack the way a user would, so nothing leaks
                stack.send_signal(signal.SIGINT)
                try:
                    stack.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    children = _children(stack.pid)  # before the kill: then they would belong to init
                    stack.kill()
                    stack.wait()
                    for pid in children:
                        os.kill(pid, signal.SIGKILL)
