"""The main job end to end: `orchard up` starts the real stack (nats-server + env service), the quick start
runs verbatim against it on a real repository (pytest fails, the patch fixes it, pytest passes), and
Ctrl-C (SIGINT) stops everything cleanly."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchard.services.env.images import ImageStore, default_images_dir

ROOT = Path(__file__).resolve().parents[2]
ORCHARD = Path(sys.executable).with_name("orchard")


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
@pytest.mark.timeout(600)
def test_orchard_up_and_quick_start(tmp_path: Path) -> None:
    """The README's main job: stack up, quick start prints a failing then a passing pytest run, stack down."""
    asyncio.run(ImageStore(default_images_dir()).build("python:3.11-slim"))  # at once when cached
    env_port, nats_port, inference_port, openai_port = _free_port(), _free_port(), _free_port(), _free_port()
    experience_port = _free_port()
    log = open(tmp_path / "up.log", "w+b")
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
        status = subprocess.run([str(ORCHARD), "status", *addresses], capture_output=True, text=True)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "SERVING, sandboxes: none" in status.stdout and status.stdout.count(" up ") == 4
        assert "SmolLM2-135M-Instruct (transformers" in status.stdout
        assert "SERVING, trajectories: 0 (0 finished)" in status.stdout

        run = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")],
                             env={**os.environ, "ORCHARD_ENV_ADDRESS": f"127.0.0.1:{env_port}"},
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        first, second = run.stdout.split("test session starts")
        assert "FAILED tests/test_calc.py::test_median_even" in first
        assert "1 failed, 3 passed" in first and "\n 1\n" in first  # print(result.stdout, result.exit_code)
        assert "4 passed" in second and second.rstrip().endswith("\n 0")

        stack.send_signal(signal.SIGINT)
        assert stack.wait(timeout=60) == 0
        assert not [pid for pid in services if _alive(pid)]
        down = subprocess.run([str(ORCHARD), "status", *addresses], capture_output=True, text=True)
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
        log.close()
