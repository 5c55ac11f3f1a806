"""Shared by the experience and event tests: a real nats-server with JetStream, and sample rollout events."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from orchard import events
from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

NATS_SERVER = Path(sys.executable).with_name("nats-server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    """A nats-server with JetStream whose file store survives restart() (same port, same directory)."""

    store_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [str(NATS_SERVER), "-js", "-sd", str(self.store_dir), "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert self.proc.poll() is None, "nats-server exited at start"
                assert time.monotonic() < deadline, "nats-server did not listen within 10 s"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()


def stamp(seconds: float) -> Timestamp:
    t = Timestamp()
    t.FromNanoseconds(int(seconds * 1e9))
    return t


def outcome(status: tpb.OutcomeStatus, value: float) -> tpb.Reward:
    return tpb.Reward(
        kind=tpb.REWARD_KIND_OUTCOME, value=value, name="tests", outcome=tpb.OutcomeDetails(status=status)
    )


def rollout(
    run_id: str,
    trajectory_id: str,
    task_id: str,
    *,
    steps: int = 2,
    status: tpb.OutcomeStatus = tpb.OUTCOME_STATUS_RESOLVED,
    weights_version: str = "v1",
    end: float = 1_700_000_100.0,
    finish: bool = True,
) -> list[pb.RolloutEvent]:
    """The events of one rollout: started, `steps` steps (token data included) and, when `finish`, finished."""
    base = tpb.Trajectory(
        trajectory_id=trajectory_id,
        run_id=run_id,
        task_id=task_id,
        task_set="toy",
        harness="mini",
        policy=tpb.Policy(model="smol", weights_version=weights_version),
        metadata={"source": "test"},
        messages=[
            tpb.Message(role=tpb.ROLE_SYSTEM, content="be brief"),
            tpb.Message(role=tpb.ROLE_USER, content=task_id),
        ],
        prompt_tokens=tpb.TokenSpan(token_ids=[1, 2, 3], mask=[0, 0, 0]),
        start_time=stamp(end - 50),
        tools=[tpb.ToolDefinition(name="bash", description="run", parameters='{"type": "object"}')],
    )
    out = [events.started(base)]
    step_list = []
    for i in range(steps):
        step = tpb.Step(
            index=i,
            model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content=f"step {i}"),
            observations=[tpb.Observation(message=tpb.Message(role=tpb.ROLE_USER, content=f"obs {i}"))],
            tokens=tpb.TokenSpan(token_ids=[10 + i, 20 + i], logprobs=[-0.5, 0.0], mask=[1, 0]),
        )
        step_list.append(step)
        out.append(events.step(run_id, trajectory_id, step))
    if finish:
        final = tpb.Trajectory()
        final.CopyFrom(base)
        final.steps.extend(step_list)
        for step in step_list:
            final.messages.extend([step.model_output, step.observations[0].message])
        final.stop_reason = tpb.STOP_REASON_SUBMITTED
        final.final_patch = f"--- a/x\n+++ b/x\n+{task_id}\n"
        final.end_time.CopyFrom(stamp(end))
        final.rewards.append(outcome(status, 1.0 if status == tpb.OUTCOME_STATUS_RESOLVED else -1.0))
        out.append(events.finished(final))
    return out


async def publish_and_store(
    nats_url: str, published: list[pb.RolloutEvent], store: object, timeout_s: float = 20
) -> None:
    """Publish `published` to the bus and wait until the experience store holds every event."""
    import asyncio

    async with events.EventPublisher.connect(nats_url) as publisher:
        for event in published:
            await publisher.publish(event)
    async with asyncio.timeout(timeout_s):
        while await store.count_events() < len(published):  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def experience_service(nats_url: str, db: Path) -> AsyncIterator[str]:
    """The experience service in this process, consuming `nats_url` into SQLite at `db`; yields its address."""
    from orchard.services.experience.server import build
    from orchard.services.experience.settings import ExperienceSettings

    settings = ExperienceSettings(
        port=0, nats_url=nats_url, store_url=f"sqlite:///{db}", log_format="text", grace_period_s=1
    )
    server, _ = await build(settings)
    port = await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop()
