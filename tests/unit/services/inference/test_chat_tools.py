"""Tool-call parsing and rendering for chat templates without tool support (pure logic, no model)."""

from __future__ import annotations

from typing import Any

import pytest

from orchard.chat.templates import _with_tool_preamble
from orchard.chat.tools import parse_tool_calls

TOOLS = {"get_weather", "search"}


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "",
            [("get_weather", '{"city": "Paris"}')],
        ),
        (
            'Let me check.\n<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>',
            "Let me check.",
            [("search", '{"q": "x"}')],
        ),
        (
            (
                '<tool_call>[{"name": "search", "arguments": {"q": "a"}}, {"name": "get_weather", "arguments": "{}"}]'
                "</tool_call>"
            ),
            "",
            [("search", '{"q": "a"}'), ("get_weather", "{}")],
        ),
        ('<tool_call>{"name": "search", "arguments": {"q": "cut"}}', "", [("search", '{"q": "cut"}')]),  # no end tag
        ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", '{"city": "Oslo"}')]),
        ("The capital of France is Paris.", "The capital of France is Paris.", []),
        (
            '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
            [],
        ),  # not an offered tool: stays text
        ('<tool_call>{"name": "search", "argu', '<tool_call>{"name": "search", "argu', []),  # truncated JSON
    ],
)
def test_parse_tool_calls(text: str, content: str, calls: list[tuple[str, str]]) -> None:
    parsed_content, parsed = parse_tool_calls(text, TOOLS)
    assert parsed_content == content
    assert [(c.name, c.arguments) for c in parsed] == calls
    assert len({c.id for c in parsed}) == len(parsed)


def test_tool_preamble_and_history() -> None:
    """Templates without tools get a system preamble; earlier calls become <tool_call> blocks."""
    tool = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {}}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}],
        },
    ]
    out = _with_tool_preamble(messages, [tool])
    assert out[0]["content"].startswith("Be brief.\n\nYou are a function calling AI model")
    assert '"name": "search"' in out[0]["content"]
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
    }
    assert messages[2]["tool_calls"]  # the caller's list is not changed
