"""Recording-proxy records reach the experience store: the proxy with a nats_url publishes each call on the bus,
and the experience service files it under the rollout's trajectory (real nats-server, proxy and service)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import grpc
import pytest
from experience_helpers import NatsServer, free_port

from orchard.experience.v1 import experience_pb2 as pb
from orchard.experience.v1 import experience_pb2_grpc
from orchard.services.experience.server import build
from orchard.services.experience.settings import ExperienceSettings
from orchard.services.proxy.records import NatsRecords
from orchard.services.proxy.server import RecordingProxy
from orchard.services.proxy.settings import ProxySettings
from orchard.types.v1 import types_pb2 as tpb

Stub = experience_pb2_grpc.ExperienceServiceStub


@pytest.fixture
async def bus(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Stub]]:
    nats_server = NatsServer(tmp_path / "nats")
    nats_server.start()
    settings = ExperienceSettings(
        port=0,
        nats_url=nats_server.url,
        store_url=f"sqlite:///{tmp_path / 'e.db'}",
        log_format="text",
        grace_period_s=1,
    )
    server, _ = await build(settings)
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield nats_server, Stub(channel)
    await server.stop()
    nats_server.stop()


async def _trajectory(stub: Stub, trajectory_id: str) -> tpb.Trajectory:
    async with asyncio.timeout(10):
        while True:
            try:
                return (
                    await stub.GetTrajectory(pb.GetTrajectoryRequest(trajectory_id=trajectory_id), timeout=5)
                ).trajectory
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.NOT_FOUND
                await asyncio.sleep(0.05)


async def test_proxy_publishes_its_records_to_the_bus(bus: tuple[NatsServer, Stub], tmp_path: Path) -> None:
    """A call through the proxy (its upstream is down, so the record is the 502 the client saw) is stored."""
    nats_server, stub = bus
    settings = ProxySettings(
        port=0,
        upstream_url=f"http://127.0.0.1:{free_port()}/v1",
        nats_url=nats_server.url,
        run_id="proxy-run",
        records_dir=tmp_path / "records",
        log_format="text",
    )
    proxy = RecordingProxy(settings)
    await proxy.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{proxy.port}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                headers={"X-Orchard-Rollout-Id": "roll-1"},
            ) as reply,
        ):
            assert reply.status == 502
    finally:
        await proxy.stop()
    assert not (tmp_path / "records").exists()  # records went to the bus, not to files
    t = await _trajectory(stub, "roll-1")
    assert (t.run_id, t.metadata["source"]) == ("proxy-run", "proxy")
    assert [(m.role, m.content) for m in t.messages] == [(tpb.ROLE_USER, "hi")]
    listed = await stub.ListTrajectories(
        pb.ListTrajectoriesRequest(filter=pb.TrajectoryFilter(run_ids=["proxy-run"], include_unfinished=True)),
        timeout=5,
    )
    assert [x.trajectory_id for x in listed.trajectories] == ["roll-1"]


async def test_the_latest_call_gives_the_conversation(bus: tuple[NatsServer, Stub]) -> None:
    """Records shaped as the proxy writes them after a 200: the trajectory is the last call's messages plus its
    answer (tool calls kept), one assistant turn per call."""
    nats_server, stub = bus
    sink = await NatsRecords.connect(nats_server.url, "proxy-run")
    conversation: list[dict[str, object]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "fix it"},
    ]
    answers: list[dict[str, object]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
            ],
        },
        {"role": "assistant", "content": "done"},
    ]
    try:
        for answer in answers:
            await sink.write(
                {
                    "rollout_id": "roll-2",
                    "time": datetime.now(UTC).isoformat(),
                    "path": "/v1/chat/completions",
                    "request": {"messages": list(conversation)},
                    "upstream": "http://up/v1",
                    "status": 200,
                    "latency_ms": 12.5,
                    "stream": False,
                    "response": {"choices": [{"index": 0, "message": answer}]},
                    "error": None,
                }
            )
            conversation += [answer, {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]
    finally:
        await sink.close()
    t = await _trajectory(stub, "roll-2")
    async with asyncio.timeout(10):
        while len(t.messages) < 5:  # the second call may land a moment after the first
            await asyncio.sleep(0.05)
            t = await _trajectory(stub, "roll-2")
    assert [m.content for m in t.messages] == ["sys", "fix it", "", "a.py", "done"]
    assert t.messages[2].tool_calls[0].name == "bash" and json.loads(t.messages[2].tool_calls[0].arguments)
    assert t.messages[3].role == tpb.ROLE_TOOL and t.step_count == 2
