"""A deterministic in-memory fake of the assistant's tools over a plain-data world state.

It is the reference meaning of the tool vocabulary (`tasks.TOOLS`), for tests and for checking that scripted
solutions solve their tasks; it is not the mail, calendar and files servers agents run against.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from orchard.errors import InvalidArgument, NotFound
from orchard.tasks.assistant.checks import State, when
from orchard.tasks.assistant.tasks import TOOLS

SENT_AT = "2026-03-02T12:00:00"
"""The date the fake gives every message it sends."""


def _next_id(prefix: str, taken: Iterable[str]) -> str:
    used, number = set(taken), 1
    while f"{prefix}{number}" in used:
        number += 1
    return f"{prefix}{number}"


def _send_mail(
    state: dict[str, Any], to: list[str], subject: str, body: str, cc: list[str] | None = None
) -> dict[str, str]:
    message_id = _next_id("m", (m["id"] for m in state["mail"]))
    state["mail"].append(
        {
            "id": message_id,
            "folder": "Sent",
            "from": state["user"]["email"],
            "to": list(to),
            "cc": list(cc or []),
            "subject": subject,
            "body": body,
            "date": SENT_AT,
        }
    )
    return {"id": message_id}


def _search_mail(state: dict[str, Any], query: str = "", folder: str = "", from_: str = "") -> list[dict[str, str]]:
    """Messages whose subject or body contains `query`, in `folder`, from an address containing `from_`."""
    found = [
        m
        for m in state["mail"]
        if query.lower() in f"{m['subject']}\n{m['body']}".lower()
        and (not folder or m["folder"] == folder)
        and from_.lower() in m["from"].lower()
    ]
    return [{k: m[k] for k in ("id", "folder", "from", "subject", "date")} for m in found]


def _read_mail(state: dict[str, Any], id: str) -> dict[str, Any]:
    for message in state["mail"]:
        if message["id"] == id:
            return copy.deepcopy(message)
    raise NotFound(f"message {id!r} not found (search_mail lists message ids)")


def _create_event(
    state: dict[str, Any],
    summary: str,
    start: str,
    end: str,
    attendees: list[str] | None = None,
    location: str = "",
    description: str = "",
) -> dict[str, str]:
    uid = _next_id("e", (e["uid"] for e in state["events"]))
    state["events"].append(
        {
            "uid": uid,
            "summary": summary,
            "start": start,
            "end": end,
            "location": location,
            "attendees": list(attendees or []),
            "description": description,
        }
    )
    return {"uid": uid}


def _event(state: dict[str, Any], uid: str) -> dict[str, Any]:
    for event in state["events"]:
        if event["uid"] == uid:
            return event  # type: ignore[no-any-return]
    raise NotFound(f"event {uid!r} not found (find_events lists event uids)")


def _update_event(state: dict[str, Any], uid: str, **changes: Any) -> dict[str, Any]:
    event = _event(state, uid)
    event.update(changes)
    return copy.deepcopy(event)


def _delete_event(state: dict[str, Any], uid: str) -> dict[str, str]:
    state["events"].remove(_event(state, uid))
    return {"uid": uid}


def _find_events(state: dict[str, Any], query: str = "", start: str = "", end: str = "") -> list[dict[str, Any]]:
    """Events with `query` in the summary, location or description that overlap [start, end)."""
    low, high = when(start) if start else datetime.min, when(end) if end else datetime.max
    return [
        copy.deepcopy(e)
        for e in state["events"]
        if query.lower() in f"{e['summary']}\n{e.get('location', '')}\n{e.get('description', '')}".lower()
        and when(e["start"]) < high
        and when(e["end"]) > low
    ]


def _list_files(state: dict[str, Any], path: str = "") -> list[str]:
    prefix = path.strip("/") + "/" if path.strip("/") else ""
    return sorted(p for p in state["files"] if p.startswith(prefix))


def _read_file(state: dict[str, Any], path: str) -> str:
    if path not in state["files"]:
        raise NotFound(f"file {path!r} not found (list_files lists the files)")
    return state["files"][path]  # type: ignore[no-any-return]


def _write_file(state: dict[str, Any], path: str, content: str) -> dict[str, Any]:
    state["files"][path] = content
    return {"path": path, "bytes": len(content.encode())}


_TOOLS: dict[str, Callable[..., Any]] = {
    "send_mail": _send_mail,
    "search_mail": _search_mail,
    "read_mail": _read_mail,
    "create_event": _create_event,
    "update_event": _update_event,
    "delete_event": _delete_event,
    "find_events": _find_events,
    "list_files": _list_files,
    "read_file": _read_file,
    "write_file": _write_file,
}


def call_tool(state: dict[str, Any], tool: str, args: Mapping[str, Any]) -> Any:
    """Apply one tool call to `state`, in place, and return the tool's result.

    Raises InvalidArgument for an unknown tool or arguments, NotFound for a missing message, event or file.
    """
    if tool not in _TOOLS:
        raise InvalidArgument(f"unknown tool {tool!r}; the tools are {', '.join(TOOLS)}")
    required, optional = TOOLS[tool]
    bad = sorted(set(args) - set(required) - set(optional)) + [a for a in required if a not in args]
    if bad:
        raise InvalidArgument(f"{tool} takes {', '.join(required + optional)}; check {', '.join(bad)}")
    return _TOOLS[tool](state, **args)


def run_solution(fixture: State, calls: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The state after applying tool calls ({"tool": ..., "args": {...}}) to a copy of `fixture`."""
    state = copy.deepcopy(dict(fixture))
    for call in calls:
        call_tool(state, call["tool"], call["args"])
    return state
