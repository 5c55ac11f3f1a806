"""Helpers that build the RolloutEvents a harness emits, with the deterministic event ids the proto specifies
(so a retried publish is stored once)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from orchard.experience.v1.experience_pb2 import (
    ModelCallRecorded,
    RewardAdded,
    RolloutEvent,
    RolloutFinished,
    RolloutStarted,
    RolloutStep,
)
from orchard.types.v1.types_pb2 import Reward, Step, Trajectory


def _now() -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(UTC))
    return stamp


def started(trajectory: Trajectory) -> RolloutEvent:
    """`<trajectory_id>.started`: the trajectory as it starts (ids, task, policy, prompt; no steps)."""
    return RolloutEvent(
        event_id=f"{trajectory.trajectory_id}.started",
        run_id=trajectory.run_id,
        trajectory_id=trajectory.trajectory_id,
        event_time=_now(),
        rollout_started=RolloutStarted(trajectory=trajectory),
    )


def step(run_id: str, trajectory_id: str, step: Step) -> RolloutEvent:
    """`<trajectory_id>.step.<index>`: one step of a running rollout."""
    return RolloutEvent(
        event_id=f"{trajectory_id}.step.{step.index}",
        run_id=run_id,
        trajectory_id=trajectory_id,
        event_time=_now(),
        rollout_step=RolloutStep(step=step),
    )


def finished(trajectory: Trajectory) -> RolloutEvent:
    """`<trajectory_id>.finished`: the complete trajectory, rewards included; it is authoritative in the store."""
    return RolloutEvent(
        event_id=f"{trajectory.trajectory_id}.finished",
        run_id=trajectory.run_id,
        trajectory_id=trajectory.trajectory_id,
        event_time=_now(),
        rollout_finished=RolloutFinished(trajectory=trajectory),
    )


def reward(run_id: str, trajectory_id: str, reward: Reward, n: int) -> RolloutEvent:
    """`<trajectory_id>.reward.<n>`: the trajectory's n-th reward given after (or apart from) the rollout."""
    return RolloutEvent(
        event_id=f"{trajectory_id}.reward.{n}",
        run_id=run_id,
        trajectory_id=trajectory_id,
        event_time=_now(),
        reward_added=RewardAdded(reward=reward),
    )


def model_call(run_id: str, trajectory_id: str, call: ModelCallRecorded) -> RolloutEvent:
    """`<trajectory_id>.call.<call_id>`: one model call a recording proxy relayed."""
    return RolloutEvent(
        event_id=f"{trajectory_id}.call.{call.call_id}",
        run_id=run_id,
        trajectory_id=trajectory_id,
        event_time=_now(),
        model_call_recorded=call,
    )
