"""Turns a batch of RolloutEvents into the rows the store writes, in one pass and without I/O.

Every row is written idempotently (primary keys, ON CONFLICT DO NOTHING, or a full replace by a finished
event), so a redelivered event, or a whole redelivered batch, changes nothing. Events may arrive in any
order: a finished event is authoritative whenever it comes; started and step events never overwrite it.
Because a finished event replaces the trajectory's row, steps and metadata in the same transaction, the started
and step events of a trajectory finished in the same batch add no rows but their ledger entries (what they would
write is overwritten before the commit): a batch holding whole rollouts writes each step once, not twice.
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
    finished_here = {e.trajectory_id for e in events if e.HasField("rollout_finished")}
    ledger, stubs, steps, stepped = out.ledger, out.stubs, out.steps, out.stepped
    for event in events:  # the hot loop of ingest: plain attribute reads, no helper calls for step events
        event_id = event.event_id
        if event_id in seen:
            continue
        seen.add(event_id)
        kind = event.WhichOneof("event") or ""
        stamp = event.event_time
        when = stamp.seconds * 1_000_000 + stamp.nanos // 1000
        tid = event.trajectory_id
        ledger.append((event_id, event.run_id, tid, kind, when))
        stub = stubs.get(tid)
        if stub is None:
            stubs[tid] = [event.run_id, when, when]
        elif when < stub[1]:  # type: ignore[operator]
            stub[1] = when
        elif when > stub[2]:  # type: ignore[operator]
            stub[2] = when
        if kind == "rollout_step":
            if tid not in finished_here:
                s = event.rollout_step.step
                steps.append((tid, s.index, len(s.tokens.token_ids), s.SerializeToString(), tid))
                stepped.add(tid)
        elif kind == "rollout_started":
            if tid not in finished_here:
                _started(out, event.rollout_started.trajectory, tid, when)
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
    header.CopyFrom(t)
    header.ClearField("steps")
    header.ClearField("rewards")
    header.patch_hash = digest
    if tid in out.finished:  # finished twice in one batch: the later event replaces the earlier one's rows too
        out.finished_steps = [row for row in out.finished_steps if row[0] != tid]
        out.finished_metadata = [row for row in out.finished_metadata if row[0] != tid]
    steps = [(tid, s.index, len(s.tokens.token_ids), s.SerializeToString()) for s in t.steps]
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
        len(steps),
        t.token_count or len(t.prompt_tokens.token_ids) + sum(row[2] for row in steps),  # the producer's, else counted
        header.SerializeToString(),
        tid,
    )
    out.finished_steps += steps
    out.finished_metadata += [(tid, k, v) for k, v in t.metadata.items()]
    for i, r in enumerate(t.rewards):
        _reward(out, tid, r, when * 1000 + i)


def _reward(out: Plan, tid: str, r: tpb.Reward, seq: int) -> None:
    status = r.outcome.status if r.WhichOneof("details") == "outcome" else 0
    out.rewards.append((tid, reward_key(r), seq, r.kind, r.value, status, r.SerializeToString()))
