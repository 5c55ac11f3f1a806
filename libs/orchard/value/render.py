"""A candidate as the value model reads it: the task, the compact trajectory and the final patch, rendered by
the RPR judge's renderer (docs/training.md §2.5) without a reference, so training and serving see the same text."""

from __future__ import annotations

from orchard.chat.render import problem_statement, render_trajectory, steps_of
from orchard.types.v1 import types_pb2 as tpb


def render_candidate(trajectory: tpb.Trajectory, *, problem: str = "", patch: str = "") -> str:
    """The value model's input for one candidate. `problem` defaults to the trajectory's first user message and
    `patch` to its final patch."""
    return render_trajectory(
        problem or problem_statement(trajectory), steps_of(trajectory), patch or trajectory.final_patch, None
    )
