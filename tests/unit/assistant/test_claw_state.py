"""The Claw sandbox's pure helpers on the host: state mail <-> RFC 5322 messages and events <-> iCalendar round-trip
exactly (the bundled task set's whole world included), the in-sandbox tool table is the task vocabulary, and the
tool specs match it."""

from __future__ import annotations

import ast
import sys
from typing import Any

import pytest

from orchard.assistant import TOOLS
from orchard.assistant.env import SCRIPTS
from orchard.tasks.assistant import TOOLS as VOCABULARY
from orchard.tasks.assistant import load_tasks

sys.path.insert(0, str(SCRIPTS))
import claw_state

MESSAGE: dict[str, Any] = {
    "id": "m2",
    "folder": "INBOX",
    "from": "Zoë Ünal <zoe@acme.test>",
    "to": ["jamie@acme.test"],
    "cc": ["mei.kim@acme.test", '"Li, Wei" <wei@acme.test>'],
    "subject": "Café budget — Q2 " + "long " * 30,
    "body": "Total: 1,200 €; ok?  \r\nline two\n\n",
    "date": "2026-02-24T08:30:00",
}
EVENT = {
    "uid": "e1",
    "summary": "Budget review; Q2, draft \\ 😀",
    "start": "2026-03-04T10:00:00",
    "end": "2026-03-04T11:00:00",
    "location": "Room 1, HQ",
    "attendees": ["mei.kim@acme.test", "zoe@acme.test"],
    "description": "Bring the numbers.\nAnd a long line " + "ü" * 120,
}


def test_a_message_round_trips_byte_for_byte() -> None:
    raw = claw_state.message_bytes(MESSAGE)
    assert raw.isascii()
    back = claw_state.message_dict(raw, "INBOX")
    assert back == {**MESSAGE, "body": MESSAGE["body"].replace("\r\n", "\n")}
    assert claw_state.message_dict(raw.replace(b"\n", b"\r\n"), "Sent") == {**back, "folder": "Sent"}
    assert "X-Claw-Id" not in claw_state.message_bytes({**MESSAGE, "id": ""}).decode()


def test_an_event_round_trips_through_icalendar() -> None:
    ics = claw_state.event_ics(EVENT)
    assert all(len(line.encode()) <= 75 for line in ics.split("\r\n"))
    assert "DTSTART:20260304T100000\r\n" in ics and "SUMMARY:Budget review\\; Q2\\, draft \\\\ 😀" in ics
    assert claw_state.event_dict(ics) == EVENT
    bare = {**EVENT, "location": "", "attendees": [], "description": ""}
    assert claw_state.event_dict(claw_state.event_ics(bare)) == bare


def test_event_times_with_zones_and_dates_read_as_written() -> None:
    ics = (
        "BEGIN:VCALENDAR\nBEGIN:VEVENT\nUID:x\nDTSTART;TZID=Europe/Berlin:20260304T100000\n"
        "DTEND;VALUE=DATE:20260305\nATTENDEE;CN=Mei:MAILTO:mei@acme.test\nEND:VEVENT\nEND:VCALENDAR\n"
    )
    event = claw_state.event_dict(ics)
    assert (event["start"], event["end"], event["attendees"]) == (
        "2026-03-04T10:00:00",
        "2026-03-05T00:00:00",
        ["mei@acme.test"],
    )


@pytest.mark.parametrize("task", load_tasks()[::10], ids=lambda t: t.task_id)
def test_bundled_worlds_round_trip(task) -> None:  # type: ignore[no-untyped-def]
    for message in task.fixture["mail"]:
        assert claw_state.message_dict(claw_state.message_bytes(message), message["folder"]) == message
    for event in task.fixture["events"]:
        assert claw_state.event_dict(claw_state.event_ics(event)) == event


def test_the_in_sandbox_tool_table_and_the_specs_are_the_task_vocabulary() -> None:
    source = (SCRIPTS / "claw_tool.py").read_text()
    table = next(
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TOOLS"
    )
    assert table is not None
    assert ast.literal_eval(table) == VOCABULARY
    specs = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert list(specs) == list(VOCABULARY)
    for name, (required, optional) in VOCABULARY.items():
        assert specs[name]["required"] == list(required)
        assert set(specs[name]["properties"]) == {*required, *optional}
