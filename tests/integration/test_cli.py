"""The `orchard` command against a real env service started with `orchard serve env`."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

ORCHARD = str(Path(sys.executable).with_name("orchard"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def orchard(*args: str, address: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if address:
        env["ORCHARD_ENV_ADDRESS"] = address
    return subprocess.run([ORCHARD, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`orchard serve env` on a free port with its own state dir; yields (address, process, state dir)."""
    port = _free_port()
    state = tmp_path_factory.mktemp("cli-state")
    proc = subprocess.Popen([ORCHARD, "serve", "env", "--port", str(port), "--state-dir", str(state),
                             "--log-format", "text"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    with grpc.insecure_channel(address) as channel:
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, "orchard serve env did not become healthy"
            time.sleep(0.1)
    yield address, proc, state
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(120)
def test_sandbox_commands(service: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """create prints an id, ls shows it with labels, exec streams output and exits with the code, rm removes it."""
    address = service[0]
    created = orchard("sandbox", "create", "host", "--label", "team=cli", address=address)
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    assert sandbox_id.startswith("sb-")

    listed = orchard("sandbox", "ls", "--label", "team=cli", address=address)
    assert sandbox_id in listed.stdout and "team=cli" in listed.stdout and "ready" in listed.stdout

    ran = orchard("sandbox", "exec", sandbox_id, "--", "echo out; echo err >&2; exit 7", address=address)
    assert (ran.returncode, ran.stdout, ran.stderr) == (7, "out\n", "err\n")
    argv = orchard("sandbox", "exec", sandbox_id, "--", "printf", "%s|", "a b", "it's", address=address)
    assert argv.stdout == "a b|it's|"

    removed = orchard("sandbox", "rm", sandbox_id, address=address)
    assert removed.returncode == 0
    assert sandbox_id not in orchard("sandbox", "ls", address=address).stdout
    gone = orchard("sandbox", "exec", sandbox_id, "--", "true", address=address)
    assert gone.returncode == 1 and f"sandbox '{sandbox_id}' not found" in gone.stderr


def test_clear_errors() -> None:
    """Unknown services, bad settings and an unreachable address are one clear line each, not a traceback."""
    unknown = orchard("serve", "nope")
    assert unknown.returncode != 0 and "unknown service 'nope'; available: env" in unknown.stderr
    bad = orchard("serve", "env", "--max-concurrent-execs", "0")
    assert bad.returncode != 0 and "max_concurrent_execs" in bad.stderr and "Traceback" not in bad.stderr
    start = time.monotonic()
    down = orchard("sandbox", "ls", address=f"127.0.0.1:{_free_port()}")
    assert down.returncode == 1 and "127.0.0.1" in down.stderr and "orchard up" in down.stderr
    assert time.monotonic() - start < 15


def test_image_ls_lists_host_and_recipes() -> None:
    """`orchard image ls` shows the host image and every recipe with its status."""
    listed = orchard("image", "ls")
    assert listed.returncode == 0
    assert "host" in listed.stdout and "python:3.11-slim" in listed.stdout


@pytest.mark.timeout(60)
def test_sigterm_drains_and_removes_sandboxes(service: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """SIGTERM stops the service with exit 0 and leaves no sandbox files or processes behind."""
    address, proc, state = service
    created = orchard("sandbox", "create", "host", address=address)
    sandbox_id = created.stdout.strip()
    orchard("sandbox", "exec", sandbox_id, "--", "sleep 600 >/dev/null 2>&1 &", address=address)
    assert (state / "sandboxes" / sandbox_id).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert list((state / "sandboxes").iterdir()) == []
    leftovers = subprocess.run(["pgrep", "-f", f"ORCHARD_SANDBOX_ID {sandbox_id}"], capture_output=True)
    assert leftovers.returncode == 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_inference_grpc_and_openai() -> None:
    """`orchard serve inference --http-port` serves the embedded model over gRPC and to the real openai client."""
    import openai

    from orchard.inference.v1 import inference_pb2, inference_pb2_grpc
    from orchard.types.v1 import types_pb2

    port, http_port = _free_port(), _free_port()
    proc = subprocess.Popen([ORCHARD, "serve", "inference", "--port", str(port), "--http-port", str(http_port),
                             "--log-format", "text"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 150
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, "orchard serve inference did not become healthy"
                time.sleep(0.2)
            question = types_pb2.Message(role=types_pb2.ROLE_USER, content="What is the capital of France?")
            chat = inference_pb2_grpc.InferenceServiceStub(channel).Chat(inference_pb2.ChatRequest(
                messages=[question], sampling=inference_pb2.SamplingParams(max_tokens=12, temperature=0)), timeout=60)
        assert "Paris" in chat.choices[0].message.content
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=12, temperature=0,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert reply.choices[0].message.content == chat.choices[0].message.content
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
