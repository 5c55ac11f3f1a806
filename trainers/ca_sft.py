"""Credit-assignment SFT (docs/training.md §2.2): a teacher annotates key-step values V(s_t) of an unresolved trajectory,
the values are interpolated into a curve, and only the actions inside rise segments (per-step credit
c_t = V(s_t+1) - V(s_t) >= epsilon) are trained; resolved trajectories train every action.

States s_0..s_T of a trajectory with T steps: s_t is the history before step t's action a_t, s_T the end.

Choices [I]:
- The teacher is asked for JSON {"key_steps": [{"step": t, "value": v, "why": ...}]}, t in [0, T], v in [0, 1]
  (values outside are clamped; a step given twice keeps the last value).
- Interpolation is linear between key steps and flat beyond the first and last.
- The comparison c_t >= epsilon allows 1e-9 of float slack, so an increment of exactly 0.05 counts.
- a_t is trained when t is in [t_i, t_j - 1] of a segment [t_i, t_j] (a_t drives s_t -> s_t+1).
- `merge_gap` joins segments whose gap (next start - previous end) is at most merge_gap steps; the actions in
  the gap are then trained too. 0 (the default) merges none.
- One sample per unresolved trajectory, cut after its last trained action, the mask covering all segments;
  a trajectory with no segment gives no sample.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Protocol

from orchard.inference.v1 import inference_pb2 as ipb
from orchard.sdk.transport import Transport
from orchard.trainers.sft import Sample, from_trajectory
from orchard.types.v1 import types_pb2 as tpb

EPSILON = 0.05
"""The least per-step credit inside a rise segment."""
SLACK = 1e-9
"""Float slack on the >= epsilon test (0.15 - 0.10 is 0.04999999999999999)."""
ACTION_CHARS, OBSERVATION_CHARS = 600, 800
"""How much of each action and observation the annotation prompt shows."""


@dataclass(frozen=True)
class KeyStep:
    """One annotated state value."""

    step: int
    """The state index t in [0, T]."""
    value: float
    """V(s_t) = P(resolve | h_t, outcome), on [0, 1]."""
    why: str = ""


def interpolate(key_steps: Sequence[KeyStep], n_states: int) -> list[float]:
    """The value curve V(s_0..s_{n_states-1}): the key values exactly, linear between, flat beyond the ends."""
    if not key_steps:
        raise ValueError("cannot interpolate a value curve without any key step")
    points = sorted({k.step: k.value for k in key_steps}.items())
    if points[0][0] < 0 or points[-1][0] >= n_states:
        raise ValueError(f"key steps must lie in [0, {n_states - 1}], got {[t for t, _ in points]}")
    curve = []
    for t in range(n_states):
        if t <= points[0][0]:
            curve.append(points[0][1])
        elif t >= points[-1][0]:
            curve.append(points[-1][1])
        else:
            (t0, v0), (t1, v1) = next((a, b) for a, b in pairwise(points) if a[0] <= t <= b[0])
            curve.append(v0 + (v1 - v0) * (t - t0) / (t1 - t0))
    return curve


def credits(values: Sequence[float]) -> list[float]:
    """Per-step credit c_t = V(s_t+1) - V(s_t), t in [0, T - 1]."""
    return [b - a for a, b in pairwise(values)]


def extract_rise_segments(
    values: Sequence[float], epsilon: float = EPSILON, merge_gap: int = 0
) -> list[tuple[int, int]]:
    """Maximal [t_i, t_j] with c_t >= epsilon for every t in [t_i, t_j - 1], in order."""
    segments: list[tuple[int, int]] = []
    start = None
    for t, c in enumerate(credits(values)):
        if c >= epsilon - SLACK:
            start = t if start is None else start
        elif start is not None:
            segments.append((start, t))
            start = None
    if start is not None:
        segments.append((start, len(values) - 1))
    merged: list[tuple[int, int]] = []
    for seg in segments:
        if merged and seg[0] - merged[-1][1] <= merge_gap:
            merged[-1] = (merged[-1][0], seg[1])
        else:
            merged.append(seg)
    return merged


def trained_steps(segments: Sequence[tuple[int, int]]) -> list[int]:
    """The actions a_t the segments train: t in [t_i, t_j - 1] of each."""
    return sorted({t for a, b in segments for t in range(a, b)})


def ca_sample(traj: tpb.Trajectory, resolved: bool, segments: Sequence[tuple[int, int]]) -> Sample | None:
    """The SFT sample of one trajectory: every action when resolved, else the rise-segment actions with the
    earlier history as context, cut after the last trained action; None when nothing is trained."""
    if resolved:
        return from_trajectory(traj)
    sample = from_trajectory(traj, trained_steps(segments))
    if not any(sample.loss_mask):
        return None
    end = max(i for i, m in enumerate(sample.loss_mask) if m) + 1
    return Sample(sample.token_ids[:end], sample.loss_mask[:end])


# Value annotation by the trajectory's own teacher.


class Annotator(Protocol):
    """A chat model that answers the annotation prompt (the teacher, through the inference service)."""

    async def __call__(self, messages: list[tpb.Message]) -> str:
        """The model's reply text."""
        ...


class InferenceAnnotator:
    """An `Annotator` over the inference service's Chat RPC (greedy, with a deadline)."""

    def __init__(self, inference: Transport, model: str, timeout_s: float = 300.0, max_tokens: int = 2048) -> None:
        self.inference, self.model, self.timeout_s, self.max_tokens = inference, model, timeout_s, max_tokens

    async def __call__(self, messages: list[tpb.Message]) -> str:
        request = ipb.ChatRequest(
            model=self.model,
            messages=messages,
            sampling=ipb.SamplingParams(temperature=0.0, max_tokens=self.max_tokens),
            labels={"purpose": "ca-sft-annotation"},
        )
        response = await self.inference.unary("Chat", request, idempotent=True, timeout=self.timeout_s)
        return response.choices[0].text


SYSTEM_PROMPT = """You are a retrospective value function for a software agent's trajectory. You see the whole \
trajectory and its final outcome. For a few key states s_t (t = 0 is the start, t = T is after the last step), \
estimate V(s_t) = the probability, given the history up to s_t, that the agent would go on to resolve the task. \
Answer with JSON only: {"key_steps": [{"step": t, "value": v, "why": "one sentence"}]}, v in [0, 1]."""


def annotation_prompt(traj: tpb.Trajectory, resolved: bool) -> list[tpb.Message]:
    """The messages asking the teacher for key-step values of `traj`."""
    task = next((m.content for m in traj.messages if m.role == tpb.ROLE_USER), "")
    lines = [f"Task:\n{task[:4000]}", ""]
    for step in traj.steps:
        action = step.model_output.content or "".join(c.arguments for c in step.model_output.tool_calls)
        lines.append(f"[state {step.index}] action {step.index}: {action[:ACTION_CHARS]}")
        for obs in step.observations:
            lines.append(f"  observation: {obs.message.content[:OBSERVATION_CHARS]}")
    outcome = "resolved" if resolved else "NOT resolved (the hidden tests failed or nothing was submitted)"
    lines += [f"[state {len(traj.steps)}] end", "", f"Outcome: {outcome}. T = {len(traj.steps)}."]
    return [
        tpb.Message(role=tpb.ROLE_SYSTEM, content=SYSTEM_PROMPT),
        tpb.Message(role=tpb.ROLE_USER, content="\n".join(lines)),
    ]


_JSON = re.compile(r"\{.*\}", re.DOTALL)


def parse_key_steps(text: str, n_states: int) -> list[KeyStep]:
    """The key steps in the teacher's reply; values clamped to [0, 1], steps outside [0, T] dropped."""
    found = _JSON.search(text)
    if found is None:
        raise ValueError(f"annotation has no JSON object: {text[:200]!r}")
    items = json.loads(found.group(0)).get("key_steps", [])
    steps = [
        KeyStep(int(k["step"]), min(1.0, max(0.0, float(k["value"]))), str(k.get("why", "")))
        for k in items
        if isinstance(k, dict) and 0 <= int(k.get("step", -1)) < n_states
    ]
    if not steps:
        raise ValueError(f"annotation names no key step in [0, {n_states - 1}]: {text[:200]!r}")
    return steps


async def annotate_values(traj: tpb.Trajectory, resolved: bool, annotator: Annotator) -> list[float]:
    """V(s_0..s_T) of a trajectory, from the annotator's key steps."""
    n_states = len(traj.steps) + 1
    reply = await annotator(annotation_prompt(traj, resolved))
    return interpolate(parse_key_steps(reply, n_states), n_states)
