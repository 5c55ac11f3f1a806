"""Turns a batch of RolloutEvents into the rows the store writes, in one pass and without I/O.

Every row is written idempotently (primary keys, ON CONFLICT DO NOTHING, or a full replace by a finished
event), so a redelivered event, or a whole redelivered batch, changes nothing. Events may arrive in any
order: a finished event is authoritative whenever it comes; started and step events never overwrite it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb


def micros(stamp: object) -> int:
    """A protobuf Timestamp as integer microseconds since the epoch."""
    return int(stamp.seconds) * 1_000_000 + int(stamp.nanos) // 1000  # type: ignore[attr-defined]


def patch_hash(patch: str) -> str:
    """The hex SHA-256 of a patch with trailing whitespace and blank trailing lines removed; '' for no patch."""
    normalised = "\n".join(line.rstrip() for line in patch.strip("\n").splitlines()).strip()
    return hashlib.sha256(normalised.encode()).hexdigest() if normalised else ""


def reward_key(reward: tpb.Reward) -> str:
    """Equal rewards get equal keys, so a reward sent twice (or in two events) is stored once."""
    return hashlib.sha256(reward.SerializeToString(deterministic=True)).hexdigest()[:32]


def trajectory_tokens(t: tpb.Trajectory) -> int:
    """The producer's token_count, else the prompt plus every step's tokens."""
    return t.token_count or len(t.prompt_tokens.token_ids) + sum(len(s.tokens.token_ids) for s in t.steps)


@dataclass
class Plan:
    """Rows for one batch, grouped by statement (see SqlStore.write_events for the order they run in)."""

    ledger: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    # trajectory id -> [run id, earliest event time, latest event time]
    stubs: dict[str, list[object]] = field(default_factory=dict)
    started: list[tuple[object, ...]] = field(default_factory=list)
    started_metadata: list[tuple[str, str, str, str]] = field(default_factory=list)
    steps: list[tuple[str, int, int, bytes, str]] = field(default_factory=list)
    finished: dict[str, tuple[object, ...]] = field(default_factory=dict)
    finished_steps: list[tuple[str, int, int, bytes]] = field(default_factory=list)
    finished_metadata: list[tuple[str, str, str]] = field(default_factory=list)
    rewards: list[tuple[str, str, int, int, float, int, bytes]] = field(default_factory=list)
    calls: list[tuple[str, str, int, int, bytes]] = field(default_factory=list)
    stepped: set[str] = field(default_factory=set)
    """Unfinished trajectories whose step and token counts need recounting."""


def plan(events: list[pb.RolloutEvent]) -> Plan:
    """The rows `events` add. Events repeated within the batch count once."""
    out = Plan()
    seen: set[str] = set()
    for event in events:
        if event.event_id in seen:
            continue
        seen.add(event.event_id)
        kind = event.WhichOneof("event") or ""
        when = micros(event.event_time)
        tid = event.trajectory_id
        out.ledger.append((event.event_id, event.run_id, tid, kind, when))
        stub = out.stubs.setdefault(tid, [event.run_id, when, when])
        stub[1], stub[2] = min(stub[1], when), max(stub[2], when)  # type: ignore[call-overload]
        if kind == "rollout_started":
            _started(out, event.rollout_started.trajectory, tid, when)
        elif kind == "rollout_step":
            s = event.rollout_step.step
            out.steps.append((tid, s.index, len(s.tokens.token_ids), s.SerializeToString(), tid))
            out.stepped.add(tid)
        elif kind == "rollout_finished":
            _finished(out, event.rollout_finished.trajectory, tid, when)
        elif kind == "reward_added":
            _reward(out, tid, event.reward_added.reward, when * 1000)
        elif kind == "model_call_recorded":
            call = event.model_call_recorded
            out.calls.append((tid, call.call_id, when, call.seq, call.SerializeToString()))
    return out


def _header(t: tpb.Trajectory) -> bytes:
    """The trajectory without steps and rewards (those live in their own tables)."""
    header = tpb.Trajectory()
    header.CopyFrom(t)
    header.ClearField("steps")
    header.ClearField("rewards")
    return header.SerializeToString()


def _started(out: Plan, t: tpb.Trajectory, tid: str, when: int) -> None:
    start = micros(t.start_time) if t.HasField("start_time") else when
    out.started.append(
        (t.task_id, t.task_set, t.harness, t.policy.model, t.policy.weights_version, _header(t), start, start, tid)
    )
    out.started_metadata += [(tid, k, v, tid) for k, v in t.metadata.items()]


def _finished(out: Plan, t: tpb.Trajectory, tid: str, when: int) -> None:
    start = micros(t.start_time) if t.HasField("start_time") else None
    end = micros(t.end_time) if t.HasField("end_time") else when
    digest = patch_hash(t.final_patch)
    header = tpb.Trajectory()
    header.ParseFromString(_header(t))
    header.patch_hash = digest
    out.finished[tid] = (
        t.task_id,
        t.task_set,
        t.harness,
        t.policy.model,
        t.policy.weights_version,
        t.stop_reason,
        digest,
        start,
        end,
        end,
        len(t.steps),
        trajectory_tokens(t),
        header.SerializeToString(),
        tid,
    )
    out.finished_steps += [(tid, s.index, len(s.tokens.token_ids), s.SerializeToString()) for s in t.steps]
    out.finished_metadata += [(tid, k, v) for k, v in t.metadata.items()]
    for i, r in enumerate(t.rewards):
        _reward(out, tid, r, when * 1000 + i)


def _reward(out: Plan, tid: str, r: tpb.Reward, seq: int) -> None:
    status = r.outcome.status if r.WhichOneof("details") == "outcome" else 0
    out.rewards.append((tid, reward_key(r), seq, r.kind, r.value, status, r.SerializeToString()))
