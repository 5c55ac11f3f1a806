"""Helpers for integration tests of the env service, imported by the tests and by conftest.py's fixtures (a test
imports them from here, never from conftest, so one module holds them): skip marks for sandboxes and images, the
running-server record, and StartExec/WaitExec shorthands over raw gRPC stubs."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.errors import FailedPrecondition
from orchard.runtime import GrpcServer
from orchard.services.env.images import ImageStore, default_images_dir
from orchard.services.env.manager import SandboxManager
from orchard.services.env.settings import EnvSettings

HOST_IMAGE = "host"
ORCHARD = str(Path(sys.executable).with_name("orchard"))
DONE_STATES = {pb.EXEC_STATE_SUCCEEDED, pb.EXEC_STATE_FAILED, pb.EXEC_STATE_TIMED_OUT, pb.EXEC_STATE_CANCELLED}

needs_sandboxes = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="these run the env service as root, with real sandboxes (bubblewrap: apt-get install bubblewrap); "
    "test_env_rootless.py runs it as an ordinary user",
)


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


@contextlib.contextmanager
def served_env(state: Path, *, prefix: Sequence[str] = (), args: Sequence[str] = ()) -> Iterator[str]:
    """`orchard serve env` in a process of its own on `state` (its kept snapshots are the build cache) and a free
    port, behind `prefix` (a command that execs the rest, e.g. one that drops to another user) and with more `args`;
    yields its address, and stops it after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [*prefix, ORCHARD, "serve", "env", "--port", str(port), "--state-dir", str(state), "--log-level", "WARNING"]
        + list(args),
        stdout=subprocess.DEVNULL,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def orchard(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The `orchard` command with these arguments, its output captured as text (it may fail: the caller checks)."""
    return subprocess.run([ORCHARD, *args], capture_output=True, text=True, timeout=timeout, check=False)
