"""Chat prompts and tool calls, shared by the gRPC servicer and the OpenAI endpoint.

Messages and tools travel in the OpenAI format, which Hugging Face chat templates take. A template that knows
no tools (SmolLM2's does not) gets them the Hermes way: a system preamble listing them, asking for
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and earlier calls rendered in that form.
Parsing is tolerant: tagged blocks (closing tag optional), or a reply that is one JSON call or a list of them.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from orchard.errors import InvalidArgument
from orchard.services.inference.engines.base import ChatMessage, Engine, ToolSpec

TOOL_PREAMBLE = (
    "You are a function calling AI model. You may call one or more functions to assist with the user query. "
    "Here are the available tools:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments within "
    "<tool_call></tool_call> tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n"
    "</tool_call>"
)
_TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedToolCall:
    """A call the model asked for."""

    id: str
    name: str
    arguments: str
    """JSON text, as the model wrote it (re-serialized when it wrote an object)."""


def render(engine: Engine, messages: list[ChatMessage], tools: list[ToolSpec] | None,
           add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text of a conversation, with tools, through the model's chat template."""
    if not messages:
        raise InvalidArgument("messages is empty; give at least one message", field="messages")
    if tools and not template_knows_tools(engine):
        messages = _with_tool_preamble(messages, tools)
        tools = None
    try:
        return engine.apply_chat_template(messages, tools, add_generation_prompt, template_kwargs)
    except Exception as err:  # jinja and template errors: the conversation does not fit the template
        raise InvalidArgument(f"the chat template cannot render this conversation: {err}", field="messages") from err


def template_knows_tools(engine: Engine) -> bool:
    """Whether the chat template renders tools itself: a probe renders a tool's name or not."""
    probe = [{"role": "user", "content": "hi"}]
    name = "orchard_probe_tool_4f1c"
    tool = {"type": "function", "function": {"name": name, "description": "", "parameters": {"type": "object"}}}
    return name in engine.apply_chat_template(probe, [tool], add_generation_prompt=False)


def _with_tool_preamble(messages: list[ChatMessage], tools: list[ToolSpec]) -> list[ChatMessage]:
    listed = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    preamble = TOOL_PREAMBLE.format(tools=listed)
    out = [_calls_as_text(m) for m in messages]
    if out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{preamble}"}
    else:
        out.insert(0, {"role": "system", "content": preamble})
    return out


def _calls_as_text(message: ChatMessage) -> ChatMessage:
    """An assistant message's tool calls as <tool_call> blocks in its content (for templates without tools)."""
    calls = message.get("tool_calls") or []
    if not calls:
        return message
    blocks = []
    for call in calls:
        fn = call["function"]
        args = fn["arguments"]
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        blocks.append(f"<tool_call>\n{json.dumps({'name': fn['name'], 'arguments': args})}\n</tool_call>")
    content = "\n".join([*([message["content"]] if message.get("content") else []), *blocks])
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": content}


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[str, list[ParsedToolCall]]:
    """Split a reply into its content and the tool calls it makes (only calls of offered tools count)."""
    blocks = list(_TOOL_BLOCK.finditer(text))
    if blocks:
        candidates = [obj for b in blocks for obj in _json_calls(b.group(1))]
        content = _TOOL_BLOCK.sub("", text).strip()
    else:
        candidates = _json_calls(text.strip())
        content = "" if candidates else text
    calls = []
    for obj in candidates:
        name = obj.get("name")
        if not isinstance(name, str) or name not in tool_names:
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        arguments = args if isinstance(args, str) else json.dumps(args)
        calls.append(ParsedToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=name, arguments=arguments))
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
