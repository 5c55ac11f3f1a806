"""Messages between Orchard's proto form and the OpenAI chat format (dicts), both ways."""

from __future__ import annotations

import base64
import json
from typing import Any

from orchard.experience.v1 import experience_pb2 as pb
from orchard.types.v1 import types_pb2 as tpb

ROLE_NAMES = {
    tpb.ROLE_SYSTEM: "system",
    tpb.ROLE_DEVELOPER: "developer",
    tpb.ROLE_USER: "user",
    tpb.ROLE_ASSISTANT: "assistant",
    tpb.ROLE_TOOL: "tool",
}
ROLES = {name: role for role, name in ROLE_NAMES.items()}


def to_openai(m: tpb.Message) -> dict[str, Any]:
    """One message as an OpenAI chat message dict (images as data: URLs)."""
    out: dict[str, Any] = {"role": ROLE_NAMES.get(m.role, "user")}
    if m.parts:
        out["content"] = [_part(p) for p in m.parts]
    else:
        out["content"] = m.content
    if m.name:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning:
        out["reasoning_content"] = m.reasoning
    return out


def _part(p: tpb.ContentPart) -> dict[str, Any]:
    if p.WhichOneof("part") == "text":
        return {"type": "text", "text": p.text}
    image = p.image
    url = image.url or f"data:{image.mime_type or 'image/png'};base64,{base64.b64encode(image.data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def from_openai(d: dict[str, Any]) -> tpb.Message:
    """An OpenAI chat message dict as a proto Message; unknown roles become user messages."""
    m = tpb.Message(
        role=ROLES.get(str(d.get("role")), tpb.ROLE_USER),
        name=str(d.get("name") or ""),
        tool_call_id=str(d.get("tool_call_id") or ""),
        reasoning=str(d.get("reasoning_content") or d.get("reasoning") or ""),
    )
    content = d.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                m.parts.append(tpb.ContentPart(text=str(part.get("text", ""))))
            elif isinstance(part, dict) and part.get("type") == "image_url":
                m.parts.append(tpb.ContentPart(image=tpb.Image(url=str((part.get("image_url") or {}).get("url", "")))))
    elif content is not None:
        m.content = str(content)
    for call in d.get("tool_calls") or []:
        function = call.get("function") or {}
        m.tool_calls.append(
            tpb.ToolCall(
                id=str(call.get("id") or ""),
                name=str(function.get("name") or ""),
                arguments=str(function.get("arguments") or ""),
            )
        )
    return m


def messages_from_call(call: pb.ModelCallRecorded) -> list[tpb.Message]:
    """The conversation a recorded chat call shows: its request messages, then the first choice's answer."""
    try:
        request = json.loads(call.request_json) if call.request_json else {}
        response = json.loads(call.response_json) if call.response_json else {}
    except json.JSONDecodeError:
        return []
    messages = [from_openai(m) for m in request.get("messages") or [] if isinstance(m, dict)]
    choices = response.get("choices") if isinstance(response, dict) else None
    if choices and isinstance(choices[0], dict) and isinstance(choices[0].get("message"), dict):
        messages.append(from_openai(choices[0]["message"]))
    return messages
