"""How a rollout ended, in the three kinds every consumer needs (the runner's grading, the reward service's
outcome reward, BAR's group filling), decided here once: it submitted; it ran out of a budget (steps, tokens,
time) or kept writing unparsable replies (truncated: graded unresolved, still a usable sample); or the model or
the environment failed or it was cancelled (aborted: no signal, masked out)."""

from __future__ import annotations

from orchard.types.v1 import types_pb2 as tpb

TRUNCATED = frozenset(
    {tpb.STOP_REASON_STEP_LIMIT, tpb.STOP_REASON_TOKEN_LIMIT, tpb.STOP_REASON_TIME_LIMIT, tpb.STOP_REASON_FORMAT_ERROR}
)
"""The agent simply did not submit: graded unresolved, no tests run."""
ABORTED = frozenset(
    {tpb.STOP_REASON_MODEL_ERROR, tpb.STOP_REASON_ENV_ERROR, tpb.STOP_REASON_CANCELLED, tpb.STOP_REASON_UNSPECIFIED}
)
"""The rollout says nothing about the policy: the model or the sandbox failed, or it was cancelled."""


OVER_TIME = frozenset({tpb.STOP_REASON_TIME_LIMIT})
"""Truncated by the wall clock: graded unresolved like any truncation, but not a usable sample for BAR, whose
recipe backfills time-exceeded rollouts (their length says more about the machine than about the policy)."""
USABLE = frozenset({tpb.STOP_REASON_SUBMITTED}) | (TRUNCATED - OVER_TIME)
"""Rollouts BAR may put in a group: submitted, or truncated by a step or token budget or unparsable replies."""


def submitted(stop_reason: int) -> bool:
    return stop_reason == tpb.STOP_REASON_SUBMITTED


def truncated(stop_reason: int) -> bool:
    return stop_reason in TRUNCATED


def aborted(stop_reason: int) -> bool:
    return stop_reason in ABORTED
