"""The Claw assistant's tools as OpenAI-style function specs: the vocabulary of `orchard.tasks.assistant.TOOLS`
(same names, same required and optional arguments), with descriptions and JSON schemas for a model."""

from __future__ import annotations

from typing import Any

_ADDRESSES = {"type": "array", "items": {"type": "string"}, "description": "Mail addresses."}
_TIME = "A local time, ISO 8601 without a zone, e.g. 2026-03-04T10:00:00."


def _spec(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _spec(
        "send_mail",
        "Send a mail from the user's address. Sent mail is kept in the Sent folder.",
        {
            "to": _ADDRESSES,
            "subject": {"type": "string"},
            "body": {"type": "string", "description": "Plain text."},
            "cc": _ADDRESSES,
        },
        ["to", "subject", "body"],
    ),
    _spec(
        "search_mail",
        "Find messages: those whose subject or body contains `query`, in `folder`, from an address "
        "containing `from_` (each filter is optional; case is ignored). Returns id, folder, from, subject, date.",
        {
            "query": {"type": "string"},
            "folder": {"type": "string", "enum": ["INBOX", "Sent"]},
            "from_": {"type": "string", "description": "Part of the sender's address."},
        },
        [],
    ),
    _spec(
        "read_mail",
        "Read one message in full (from, to, cc, subject, body, date) by its id from search_mail.",
        {"id": {"type": "string"}},
        ["id"],
    ),
    _spec(
        "create_event",
        "Add an event to the user's calendar. Returns its uid.",
        {
            "summary": {"type": "string"},
            "start": {"type": "string", "description": _TIME},
            "end": {"type": "string", "description": _TIME},
            "attendees": _ADDRESSES,
            "location": {"type": "string"},
            "description": {"type": "string"},
        },
        ["summary", "start", "end"],
    ),
    _spec(
        "update_event",
        "Change an event (by uid from find_events); only the fields given change.",
        {
            "uid": {"type": "string"},
            "summary": {"type": "string"},
            "start": {"type": "string", "description": _TIME},
            "end": {"type": "string", "description": _TIME},
            "attendees": _ADDRESSES,
            "location": {"type": "string"},
            "description": {"type": "string"},
        },
        ["uid"],
    ),
    _spec(
        "delete_event",
        "Remove an event (by uid from find_events) from the calendar.",
        {"uid": {"type": "string"}},
        ["uid"],
    ),
    _spec(
        "find_events",
        "Find events with `query` in the summary, location or description that overlap the time "
        "range [start, end) (each filter is optional). Returns the events with their uids.",
        {
            "query": {"type": "string"},
            "start": {"type": "string", "description": _TIME},
            "end": {"type": "string", "description": _TIME},
        },
        [],
    ),
    _spec(
        "list_files",
        "List the files in the user's files area, or those under folder `path`.",
        {"path": {"type": "string", "description": "A folder relative to the files area, e.g. notes."}},
        [],
    ),
    _spec(
        "read_file",
        "Read a text file from the files area.",
        {"path": {"type": "string", "description": "Relative to the files area, e.g. notes/todo.txt."}},
        ["path"],
    ),
    _spec(
        "write_file",
        "Write (create or replace) a text file in the files area.",
        {
            "path": {"type": "string", "description": "Relative to the files area, e.g. notes/todo.txt."},
            "content": {"type": "string"},
        },
        ["path", "content"],
    ),
]
"""The tools, in `orchard.tasks.assistant.TOOLS`'s order."""
