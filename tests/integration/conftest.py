"""Fixtures for integration tests of the env service: a real server on 127.0.0.1:0 with the `local`
backend, raw gRPC stubs, and real sandboxes on the "host" image (bubblewrap + overlayfs, needs root)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from experience_helpers import NatsServer
from google.protobuf.duration_pb2 import Duration

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.runtime import GrpcServer
from orchard.sdk.transport import CHANNEL_OPTIONS
from orchard.services.env.images import ImageStore, default_images_dir
from orchard.services.env.manager import SandboxManager
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings

HOST_IMAGE = "host"
DONE_STATES = {pb.EXEC_STATE_SUCCEEDED, pb.EXEC_STATE_FAILED, pb.EXEC_STATE_TIMED_OUT, pb.EXEC_STATE_CANCELLED}

needs_sandboxes = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="real sandboxes need root (overlayfs mounts) and bubblewrap (apt-get install bubblewrap)",
)


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A real nats-server with JetStream in tmp_path, stopped after the test."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


def image_built(name: str) -> bool:
    """Whether the env service's local backend has image `name` built."""
    try:
        ImageStore(default_images_dir()).resolve(name)
    except FailedPrecondition:
        return False
    return True


def needs_image(name: str) -> pytest.MarkDecorator:
    """Skip, saying which command builds it, unless sandbox image `name` is built."""
    return pytest.mark.skipif(
        not image_built(name), reason=f"image {name} is not built: run `orchard image build {name}`"
    )


@dataclass
class EnvServer:
    """A running env service: its stub, and its manager and settings for host-side checks."""

    stub: env_pb2_grpc.EnvServiceStub
    manager: SandboxManager
    settings: EnvSettings
    server: GrpcServer
    channel: grpc.aio.Channel


StartEnv = Callable[..., Awaitable[EnvServer]]


def duration(seconds: float) -> Duration:
    """A protobuf Duration of `seconds`."""
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


@pytest.fixture
async def start_env(tmp_path: Path) -> AsyncIterator[StartEnv]:
    """Start real env servers (settings overridable); every one is stopped and its sandboxes destroyed after."""
    started: list[EnvServer] = []

    async def start(**overrides: Any) -> EnvServer:
        options: dict[str, Any] = {
            "port": 0,
            "state_dir": tmp_path / f"state{len(started)}",
            "log_format": "text",
            "grace_period_s": 1.0,
            **overrides,
        }
        settings = EnvSettings(**options)
        server, manager = await build(settings)
        try:
            port = await server.start()
        except BaseException:
            await manager.close()
            raise
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)  # the SDK's limits
        env = EnvServer(env_pb2_grpc.EnvServiceStub(channel), manager, settings, server, channel)
        started.append(env)
        return env

    yield start
    for env in reversed(started):
        await env.channel.close()
        await env.server.stop()  # the manager destroys every sandbox left
        leftovers = list((env.settings.state_dir / "sandboxes").iterdir())
        assert not leftovers, f"sandbox folders left after stop: {leftovers}"


@pytest.fixture
async def env(start_env: StartEnv) -> EnvServer:
    """One env server with default settings."""
    return await start_env()


@pytest.fixture
def stub(env: EnvServer) -> env_pb2_grpc.EnvServiceStub:
    """A raw EnvService stub connected to the `env` server."""
    return env.stub


async def create(stub: env_pb2_grpc.EnvServiceStub, **fields: Any) -> pb.Sandbox:
    """Create a sandbox on the host image (fields override the request) and return it."""
    response = await stub.CreateSandbox(pb.CreateSandboxRequest(**{"image": HOST_IMAGE, **fields}), timeout=30)
    return response.sandbox


async def delete_quietly(stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str) -> None:
    """Delete a sandbox unless it is already gone."""
    try:
        await stub.DeleteSandbox(pb.DeleteSandboxRequest(sandbox_id=sandbox_id), timeout=30)
    except grpc.aio.AioRpcError as err:
        if err.code() is not grpc.StatusCode.NOT_FOUND:
            raise


@pytest.fixture
async def sandbox(stub: env_pb2_grpc.EnvServiceStub) -> AsyncIterator[pb.Sandbox]:
    """A ready sandbox on the host image, deleted after the test."""
    created = await create(stub)
    yield created
    await delete_quietly(stub, created.sandbox_id)


async def start(
    stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str, cmd: str | list[str], *, timeout: float = 0.0, **fields: Any
) -> pb.Exec:
    """StartExec: a str runs as a bash line, a list as argv; timeout in seconds; other fields as in the proto."""
    command: dict[str, Any] = {"shell": cmd} if isinstance(cmd, str) else {"argv": pb.ArgvCommand(args=cmd)}
    request = pb.StartExecRequest(sandbox_id=sandbox_id, timeout=duration(timeout), **command, **fields)
    return (await stub.StartExec(request, timeout=10)).exec


async def wait(stub: env_pb2_grpc.EnvServiceStub, exec_id: str) -> pb.Exec:
    """WaitExec in a loop until the exec has ended; returns it with its output."""
    while True:
        response = await stub.WaitExec(pb.WaitExecRequest(exec_id=exec_id, timeout=duration(5)), timeout=15)
        if response.done:
            assert response.exec.state in DONE_STATES
            return response.exec


async def run(stub: env_pb2_grpc.EnvServiceStub, sandbox_id: str, cmd: str | list[str], **kw: Any) -> pb.Exec:
    """StartExec, then WaitExec until done; returns the finished exec (see `start` for the arguments)."""
    started = await start(stub, sandbox_id, cmd, **kw)
    return await wait(stub, started.exec_id)
