"""Fixtures for integration tests of the env service: a real server on 127.0.0.1:0 with the `local`
backend, raw gRPC stubs, and real sandboxes on the "host" image (bubblewrap + overlayfs, needs root). The helpers
they use, and tests import, are in env_helpers.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from env_helpers import EnvServer, StartEnv, create, delete_quietly
from experience_helpers import NatsServer

from orchard.env.v1 import env_pb2 as pb
from orchard.env.v1 import env_pb2_grpc
from orchard.sdk.transport import CHANNEL_OPTIONS
from orchard.services.env.server import build
from orchard.services.env.settings import EnvSettings


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    """A real nats-server with JetStream in tmp_path, stopped after the test."""
    server = NatsServer(tmp_path / "nats")
    server.start()
    yield server
    server.stop()


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


@pytest.fixture
async def sandbox(stub: env_pb2_grpc.EnvServiceStub) -> AsyncIterator[pb.Sandbox]:
    """A ready sandbox on the host image, deleted after the test."""
    created = await create(stub)
    yield created
    await delete_quietly(stub, created.sandbox_id)
