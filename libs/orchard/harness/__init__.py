"""Agent harnesses: the loop that drives a model through tasks in Orchard Env sandboxes and records token-level
trajectories (ids, log-probs, loss mask) for RL, SFT and evaluation.

    loop = AgentLoop(InferenceModel("127.0.0.1:50052"), Limits(max_steps=20))
    trajectory = await loop.run(SWEHarness(instance, sandbox_client))

A domain plugs in as a `Harness` (SWE here; web and assistant harnesses implement the same five methods);
models as a `Model` (`InferenceModel` over gRPC, `ScriptedModel` for deterministic tests, `ReferenceModel`, a
synthetic policy of chosen quality built from gold patches); event publishers
as an `EventSink`.
"""

from orchard.harness.base import (
    ActionResult,
    Harness,
    Parsed,
    call,
    parse_tool_calls,
    tool,
)
from orchard.harness.events import EventSink, ListSink, NullSink
from orchard.harness.loop import AgentLoop, Limits
from orchard.harness.model import (
    InferenceModel,
    Model,
    ModelError,
    Rendered,
    Sample,
    SamplingConfig,
    Timeouts,
)
from orchard.harness.reference import ExpertModel, ReferenceModel
from orchard.harness.runner import RolloutResult, run_rollouts
from orchard.harness.scripted import ScriptedModel, replay
from orchard.harness.swe import SWEHarness

__all__ = [
    "ExpertModel",
    "ActionResult",
    "AgentLoop",
    "EventSink",
    "Harness",
    "InferenceModel",
    "Limits",
    "ListSink",
    "Model",
    "ModelError",
    "NullSink",
    "Parsed",
    "ReferenceModel",
    "Rendered",
    "RolloutResult",
    "SWEHarness",
    "Sample",
    "SamplingConfig",
    "ScriptedModel",
    "Timeouts",
    "call",
    "parse_tool_calls",
    "replay",
    "run_rollouts",
    "tool",
]
