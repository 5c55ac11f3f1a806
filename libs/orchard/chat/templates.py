"""Chat prompts with tools, through a model's chat template (the inference service's engines, the trainer's
tokenizer alike).

Messages and tools travel in the OpenAI format, which Hugging Face chat templates take. A template that knows
no tools (SmolLM2's does not) gets them the Hermes way: a system preamble listing them, asking for
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, and earlier calls rendered in that form (parsing:
tools.py).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from orchard.chat.tools import ChatMessage, ToolSpec
from orchard.errors import InvalidArgument

TOOL_PREAMBLE = (
    "You are a function calling AI model. You may call one or more functions to assist with the user query. "
    "Here are the available tools:\n<tools>\n{tools}\n</tools>\n"
    "For each function call, return a JSON object with the function name and arguments within "
    '<tool_call></tool_call> tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n'
    "</tool_call>"
)


class Template(Protocol):
    """What renders a conversation: a model's chat template (every inference engine, a tokenizer's wrapper)."""

    def apply_chat_template(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...


def render(
    engine: Template,
    messages: list[ChatMessage],
    tools: list[ToolSpec] | None,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
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


def template_knows_tools(engine: Template) -> bool:
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
