"""`orchard up` without the inference service: the trainer still starts (value and SFT jobs need no inference)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(180)
def test_up_without_inference_still_starts_the_trainer(tmp_path: Path) -> None:
    trainer_port = _free_port()
    log_path = tmp_path / "up.log"
    with open(log_path, "w+b") as log:
        stack = subprocess.Popen(
            [
                ORCHARD,
                "up",
                "--no-inference",
                "--no-value",
                "--env-port",
                str(_free_port()),
                "--nats-port",
                str(_free_port()),
                "--experience-port",
                str(_free_port()),
                "--trainer-port",
                str(trainer_port),
                "--state-dir",
                str(tmp_path / "state"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            trainer_row = f"trainer    127.0.0.1:{trainer_port}".encode()
            while trainer_row not in log_path.read_bytes():  # the ready banner lists the services it started
                assert stack.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "orchard up did not start the trainer in 120 s"
                time.sleep(0.1)
            assert b"stack is ready" in log_path.read_bytes()
            assert _serving(f"127.0.0.1:{trainer_port}")
        finally:
            stack.send_signal(signal.SIGINT)
            assert stack.wait(60) == 0, log_path.read_text()
