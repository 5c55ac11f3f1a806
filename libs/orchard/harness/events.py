"""Where rollout events go: the `EventSink` protocol (the event bus's publisher fits it), a no-op default, an
in-memory sink, and builders of the `RolloutEvent` protos with their deterministic ids."""

from __future__ import annotations

from typing import Protocol

from orchard.experience.v1 import experience_pb2 as epb
from orchard.types.v1 import types_pb2 as tpb


class EventSink(Protocol):
    """Receives rollout events as they happen. `publish` may raise; the loop logs and carries on, because the
    finished trajectory is authoritative and is also returned to the caller."""

    async def publish(self, event: epb.RolloutEvent) -> None: ...


class NullSink:
    """Drops every event (the default)."""

    async def publish(self, event: epb.RolloutEvent) -> None:
        return None


class ListSink:
    """Keeps every event in memory, in order (for tests and small local runs)."""

    def __init__(self) -> None:
        self.events: list[epb.RolloutEvent] = []

    async def publish(self, event: epb.RolloutEvent) -> None:
        self.events.append(event)


def _event(trajectory: tpb.Trajectory, suffix: str) -> epb.RolloutEvent:
    event = epb.RolloutEvent(event_id=f"{trajectory.trajectory_id}.{suffix}", run_id=trajectory.run_id,
                             trajectory_id=trajectory.trajectory_id)
    event.event_time.GetCurrentTime()
    return event


def started(trajectory: tpb.Trajectory) -> epb.RolloutEvent:
    """"<id>.started": the trajectory as it starts (no steps)."""
    event = _event(trajectory, "started")
    event.rollout_started.trajectory.CopyFrom(trajectory)
    del event.rollout_started.trajectory.steps[:]
    return event


def step(trajectory: tpb.Trajectory, done: tpb.Step) -> epb.RolloutEvent:
    """"<id>.step.<index>": one step."""
    event = _event(trajectory, f"step.{done.index}")
    event.rollout_step.step.CopyFrom(done)
    return event


def finished(trajectory: tpb.Trajectory) -> epb.RolloutEvent:
    """"<id>.finished": the complete trajectory."""
    event = _event(trajectory, "finished")
    event.rollout_finished.trajectory.CopyFrom(trajectory)
    return event


def reward_added(trajectory: tpb.Trajectory, reward: tpb.Reward, n: int) -> epb.RolloutEvent:
    """"<id>.reward.<n>": the trajectory's n-th reward."""
    event = _event(trajectory, f"reward.{n}")
    event.reward_added.reward.CopyFrom(reward)
    return event
