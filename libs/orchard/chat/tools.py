"""The tool-call format in one place: how a model writes a call (`<tool_call>{"name": ..., "arguments": ...}
</tool_call>`, or ```bash blocks for shell-only harnesses), how it is parsed, and a tool's schema as chat templates
and the OpenAI API take it."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from orchard.errors import InvalidArgument
from orchard.types.v1 import types_pb2 as tpb

ChatMessage = dict[str, Any]
"""A chat message in the OpenAI chat format (role, content, tool_calls, tool_call_id, name): what Hugging Face
chat templates take."""
ToolSpec = dict[str, Any]
"""A tool in the OpenAI format: {"type": "function", "function": {"name", "description", "parameters"}}."""

TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
"""A tagged call (the closing tag optional: a reply cut at its token budget still counts)."""
SHELL_BLOCK = re.compile(r"```(?:bash|sh|shell)?\s*\n(.*?)```", re.DOTALL)
"""A fenced shell command, as text-based harnesses (and the judge reading them) take it."""


@dataclass(frozen=True)
class ParsedToolCall:
    """A call the model asked for."""

    id: str
    name: str
    arguments: str
    """JSON text, as the model wrote it (re-serialized when it wrote an object)."""


def tool_spec(t: tpb.ToolDefinition, i: int) -> ToolSpec:
    """A tool definition (JSON-schema parameters as text) as chat templates take it; InvalidArgument naming
    tools[i] when its parameters are not JSON."""
    try:
        parameters = json.loads(t.parameters) if t.parameters else {"type": "object", "properties": {}}
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"tools[{i}].parameters is not JSON: {err}", field=f"tools[{i}].parameters") from None
    return {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": parameters}}


def tool_call_blocks(text: str) -> list[tpb.ToolCall] | None:
    """The calls of the `<tool_call>` blocks in text (any tool name); None when there is no block, [] when the
    blocks hold no parsable call."""
    blocks = TOOL_BLOCK.findall(text)
    if not blocks:
        return None
    return [
        tpb.ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=obj["name"], arguments=_arguments(obj))
        for block in blocks
        for obj in _json_calls(block)
        if isinstance(obj.get("name"), str)
    ]


def _arguments(obj: dict[str, Any]) -> str:
    args = obj.get("arguments", obj.get("parameters", {}))
    return args if isinstance(args, str) else json.dumps(args)


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str, list[ParsedToolCall]]:
    """Split a reply into its content and the tool calls it makes (only calls of offered tools count)."""
    blocks = list(TOOL_BLOCK.finditer(text))
    if blocks:
        candidates = [obj for b in blocks for obj in _json_calls(b.group(1))]
        content = TOOL_BLOCK.sub("", text).strip()
    else:
        candidates = _json_calls(text.strip())
        content = "" if candidates else text
    calls = []
    for obj in candidates:
        name = obj.get("name")
        if not isinstance(name, str) or name not in tool_names:
            continue
        calls.append(ParsedToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=_arguments(obj)))
    if not calls:
        return text, []
    return content, calls


def _json_calls(text: str) -> list[dict[str, Any]]:
    """The call objects in text when it is one JSON object or a list of them; [] otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return []
    items = value if isinstance(value, list) else [value]
    return [item for item in items if isinstance(item, dict) and "name" in item]
