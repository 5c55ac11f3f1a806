"""The harness interface: what an agent loop needs from a domain (SWE, web, assistant) for one rollout.

A harness is made per rollout, bound to its task. The loop asks it for the tools and the opening messages,
hands it the model's text to parse into tool calls, has it carry each call out in its environment, and stops
when a call was the submission. Parsing of `<tool_call>{json}</tool_call>` blocks is shared here (the form the
inference service asks tool-less templates for); a harness adds its own text forms (e.g. a ```bash block).
"""

from __future__ import annotations

import abc
import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from orchard.chat.tools import tool_call_blocks
from orchard.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from orchard.types.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    from orchard.tasks.grading import GradeResult

T = TypeVar("T")
"""A `<tool_call>` block (the closing tag may be missing when generation stopped early)."""


@dataclass(frozen=True)
class ActionResult:
    """What carrying out one tool call gave."""

    output: str
    """The observation text shown to the model (empty for a submission)."""
    status: tpb.ActionStatus = tpb.ACTION_STATUS_OK
    """A types.v1 ActionStatus."""
    exit_code: int | None = None
    truncated: bool = False
    submitted: bool = False
    """True when the call was the submission: the rollout ends."""
    images: list[tpb.Image] = field(default_factory=list)
    """Screenshots to show with the output (GUI harnesses)."""


@dataclass(frozen=True)
class Parsed:
    """The tool calls found in a model reply, or why none were."""

    calls: list[tpb.ToolCall]
    error: str = ""


def tool(name: str, description: str, properties: dict[str, object], required: list[str]) -> tpb.ToolDefinition:
    """A tool definition with a JSON-schema object of `properties`."""
    schema = {"type": "object", "properties": properties, "required": required}
    return tpb.ToolDefinition(name=name, description=description, parameters=json.dumps(schema))


def call(name: str, **arguments: object) -> tpb.ToolCall:
    """A tool call with a fresh id."""
    return tpb.ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=json.dumps(arguments))


async def create_retried(create: Callable[[], Awaitable[T]], *, attempts: int, timeout_s: float) -> T:
    """`create()` (a sandbox), each try bounded by timeout_s, retried with backoff on transient errors (the service
    busy or briefly away); the last error is raised."""
    for attempt in range(attempts):
        try:
            async with asyncio.timeout(timeout_s):
                return await create()
        except (Unavailable, ResourceExhausted, DeadlineExceeded, TimeoutError):
            if attempt + 1 == attempts:
                raise
            await asyncio.sleep(2**attempt)
    raise ValueError("attempts must be at least 1")


def call_arguments(action: tpb.ToolCall) -> dict[str, Any] | ActionResult:
    """A call's arguments as a JSON object, or the PARSE_ERROR result to show the model instead."""
    try:
        args = json.loads(action.arguments or "{}")
    except json.JSONDecodeError as err:
        return ActionResult(f"The arguments are not valid JSON ({err}).", status=tpb.ACTION_STATUS_PARSE_ERROR)
    if not isinstance(args, dict):
        return ActionResult("The arguments must be a JSON object.", status=tpb.ACTION_STATUS_PARSE_ERROR)
    return args


parse_tool_calls = tool_call_blocks
"""The harnesses' parse of a reply: the calls of its `<tool_call>` blocks (chat.tools)."""


class Harness(abc.ABC):
    """One rollout's agent scaffold: tools, prompts, action parsing and an environment to act in.

    Subclasses set `name`, `task_id`, `task_set` and `tools`, and implement the abstract methods.
    `close()` must be safe to call whether or not `setup()` finished.
    """

    name: str
    """The harness's name as trajectories record it (e.g. "orchard-swe")."""
    task_id: str
    task_set: str
    tools: list[tpb.ToolDefinition]

    @abc.abstractmethod
    async def setup(self) -> None:
        """Make the environment ready (create a sandbox, set the task up)."""

    @abc.abstractmethod
    def initial_messages(self) -> list[tpb.Message]:
        """The opening conversation: system prompt and task statement."""

    def parse(self, text: str) -> Parsed:
        """The tool calls in a model reply: `<tool_call>` blocks by default."""
        calls = parse_tool_calls(text)
        if calls is None:
            return Parsed([], "no <tool_call> block found")
        if not calls:
            return Parsed([], 'the <tool_call> block is not a JSON object with a "name" and "arguments"')
        return Parsed(calls)

    def format_error(self, error: str) -> str:
        """The observation shown after an unparsable reply."""
        names = ", ".join(t.name for t in self.tools)
        return (
            f"Format error: {error}. Reply with exactly one tool call, e.g.\n<tool_call>\n"
            f'{{"name": "{self.tools[0].name}", "arguments": {{...}}}}\n</tool_call>\nTools: {names}.'
        )

    @abc.abstractmethod
    async def execute(self, call: tpb.ToolCall) -> ActionResult:
        """Carry one call out (its tool is one of `tools`); a failing command is a result, not an error.

        Raises an OrchardError only when the environment itself failed (the rollout then stops with ENV_ERROR).
        """

    def outcome(self) -> GradeResult | None:
        """The grade of a rollout this harness judged itself (a web task's check on the page the agent left,
        taken before close); None when the runner is to grade the submitted patch."""
        return None

    @abc.abstractmethod
    async def submission(self) -> tuple[str, str]:
        """What was submitted, as (final_patch, final_answer); called once after a submitting call."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the environment."""
