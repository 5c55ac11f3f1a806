"""The Claw assistant environment on real parts: a real env service, `claw` sandboxes running real SMTP (aiosmtpd),
IMAP (pymap) and CalDAV (radicale) servers, every tool through them, the world read back from disk; then the
assistant harness end to end: the bundled scripted solutions of one task per template pass their graders against
the real servers, and a do-nothing policy fails as the in-memory reference says it should."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.assistant import AssistantEnv
from orchard.errors import FailedPrecondition, NotFound
from orchard.harness import (
    AgentLoop,
    Limits,
    SamplingConfig,
    ScriptedModel,
    run_rollouts,
)
from orchard.harness.assistant import AssistantHarness, AssistantScriptModel
from orchard.harness.reference import tool_call
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.assistant import AssistantTask, grade, load_tasks

pytestmark = [needs_sandboxes, needs_image("claw"), pytest.mark.slow, pytest.mark.timeout(300)]

FIXTURE: dict[str, Any] = {
    "user": {"name": "Jamie Fox", "email": "jamie@acme.test"},
    "allowed_domains": ["acme.test"],
    "contacts": [{"name": "Mei Kim", "email": "mei.kim@acme.test"}],
    "mail": [
        {
            "id": "m1",
            "folder": "INBOX",
            "from": "mei.kim@acme.test",
            "to": ["jamie@acme.test"],
            "cc": [],
            "subject": "Lunch on Friday?",
            "body": "Hi Jamie,\n\nNoodles at 12:30?\n\nMei",
            "date": "2026-02-23T17:00:00",
        },
        {
            "id": "m2",
            "folder": "INBOX",
            "from": "Zoë Ünal <zoe@acme.test>",
            "to": ["jamie@acme.test"],
            "cc": ["mei.kim@acme.test"],
            "subject": "Café budget — Q2",
            "body": "Total: 1,200 €; ok?  \n",
            "date": "2026-02-24T08:30:00",
        },
        {
            "id": "m3",
            "folder": "Sent",
            "from": "jamie@acme.test",
            "to": ["mei.kim@acme.test"],
            "cc": [],
            "subject": "Re: Lunch",
            "body": "Yes!",
            "date": "2026-02-23T18:00:00",
        },
    ],
    "events": [
        {
            "uid": "e1",
            "summary": "Budget review; Q2, draft",
            "start": "2026-03-04T10:00:00",
            "end": "2026-03-04T11:00:00",
            "location": "Room 1",
            "attendees": ["mei.kim@acme.test"],
            "description": "Bring the numbers.\nAnd the long line " + "x" * 120,
        },
        {
            "uid": "e2",
            "summary": "1:1 with Mei",
            "start": "2026-03-05T09:00:00",
            "end": "2026-03-05T09:30:00",
            "location": "",
            "attendees": [],
            "description": "",
        },
    ],
    "files": {"notes/todo.txt": "- call Mei\n- budget\n", "reports/q1.csv": "region,revenue\nEast,10\n"},
}


def by(key: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(items, key=lambda item: item[key])


async def call(env: AssistantEnv, tool: str, **args: Any) -> Any:
    return json.loads(await env.call(tool, args))


async def test_every_tool_round_trips_through_the_servers(env: EnvServer) -> None:
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        claw = await AssistantEnv.start(client, FIXTURE, labels={"test": "claw"})
        try:
            assert by("id", (await claw.state())["mail"]) == by("id", FIXTURE["mail"])  # seeding round-trips

            # mail: search, read, send (the SMTP server files it in Sent)
            assert [m["id"] for m in await call(claw, "search_mail", query="noodles")] == ["m1"]
            assert [m["id"] for m in await call(claw, "search_mail", from_="zoe@")] == ["m2"]
            assert await call(claw, "read_mail", id="m2") == FIXTURE["mail"][1]
            sent = await call(
                claw,
                "send_mail",
                to=["mei.kim@acme.test"],
                subject="Agenda",
                body="See you at 10.\nJamie",
                cc=["zoe@acme.test"],
            )
            assert sent == {"id": "m4"}
            in_sent = await call(claw, "search_mail", folder="Sent")
            assert [(m["id"], m["subject"]) for m in in_sent] == [("m3", "Re: Lunch"), ("m4", "Agenda")]
            assert "error" in await call(claw, "read_mail", id="m99")

            # calendar: find, create, update, delete
            assert [e["uid"] for e in await call(claw, "find_events", query="budget")] == ["e1"]
            assert [
                e["uid"]
                for e in await call(claw, "find_events", start="2026-03-05T00:00:00", end="2026-03-06T00:00:00")
            ] == ["e2"]
            assert await call(claw, "find_events", query="budget") == [FIXTURE["events"][0]]
            created = await call(
                claw,
                "create_event",
                summary="Planning",
                start="2026-03-06T14:00:00",
                end="2026-03-06T15:00:00",
                attendees=["mei.kim@acme.test"],
                location="HQ",
            )
            assert created == {"uid": "e3"}
            moved = await call(claw, "update_event", uid="e2", start="2026-03-05T11:00:00", end="2026-03-05T11:30:00")
            assert (moved["start"], moved["summary"]) == ("2026-03-05T11:00:00", "1:1 with Mei")
            assert await call(claw, "delete_event", uid="e3") == {"uid": "e3"}
            assert "error" in await call(claw, "delete_event", uid="e3")
            assert "error" in await call(claw, "create_event", summary="x", start="tomorrow", end="later")

            # files: list, read, write; paths stay inside the files area
            assert await call(claw, "list_files") == ["notes/todo.txt", "reports/q1.csv"]
            assert await call(claw, "list_files", path="notes") == ["notes/todo.txt"]
            assert await call(claw, "read_file", path="reports/q1.csv") == FIXTURE["files"]["reports/q1.csv"]
            assert await call(claw, "write_file", path="notes/new/plan.md", content="# Plan ✓\n") == {
                "path": "notes/new/plan.md",
                "bytes": 11,
            }
            assert await call(claw, "read_file", path="notes/new/plan.md") == "# Plan ✓\n"
            for bad in ("../fixture.json", "/etc/passwd", "notes/../../x"):
                assert "outside the files area" in (await call(claw, "read_file", path=bad))["error"]
                assert "error" in await call(claw, "write_file", path=bad, content="x")
            assert "error" in await call(claw, "read_file", path="notes/missing.txt")

            # arguments are checked as the reference implementation checks them
            assert "takes" in (await call(claw, "send_mail", to=["a@acme.test"]))["error"]
            assert "unknown tool" in (await call(claw, "rm_rf"))["error"]

            state = await claw.state()
        finally:
            await claw.close()
            await claw.close()  # twice is fine
        with pytest.raises(NotFound):
            await client.get_sandbox(claw.sandbox.sandbox_id)

    for key in ("user", "allowed_domains", "contacts"):
        assert state[key] == FIXTURE[key]
    [new] = [m for m in state["mail"] if m["id"] == "m4"]
    assert (new["folder"], new["from"], new["to"], new["cc"], new["subject"], new["body"]) == (
        "Sent",
        "jamie@acme.test",
        ["mei.kim@acme.test"],
        ["zoe@acme.test"],
        "Agenda",
        "See you at 10.\nJamie",
    )
    assert by("id", [m for m in state["mail"] if m["id"] != "m4"]) == by("id", FIXTURE["mail"])
    moved_e2 = {**FIXTURE["events"][1], "start": "2026-03-05T11:00:00", "end": "2026-03-05T11:30:00"}
    assert by("uid", state["events"]) == [FIXTURE["events"][0], moved_e2]
    assert state["files"] == {**FIXTURE["files"], "notes/new/plan.md": "# Plan ✓\n"}


async def test_environments_are_separate_and_a_failed_start_leaves_nothing(env: EnvServer) -> None:
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:
        one = await AssistantEnv.start(client, FIXTURE)
        two = await AssistantEnv.start(client, FIXTURE)
        try:
            await call(one, "send_mail", to=["mei.kim@acme.test"], subject="Only in one", body="1")
            await call(two, "write_file", path="only-in-two.txt", content="2")
            await call(two, "delete_event", uid="e1")
            first, second = await one.state(), await two.state()
        finally:
            await one.close()
            await two.close()
        assert [m["subject"] for m in first["mail"] if m["folder"] == "Sent"] == ["Re: Lunch", "Only in one"]
        assert [m["subject"] for m in second["mail"] if m["folder"] == "Sent"] == ["Re: Lunch"]
        assert "only-in-two.txt" not in first["files"] and "only-in-two.txt" in second["files"]
        assert [e["uid"] for e in first["events"]] == ["e1", "e2"] and [e["uid"] for e in second["events"]] == ["e2"]

        broken = {k: v for k, v in FIXTURE.items() if k != "events"}
        with pytest.raises(FailedPrecondition, match="seeding"):
            await AssistantEnv.start(client, broken)
        assert [s async for s in client.list_sandboxes()] == []


def first_of_each_template() -> list[AssistantTask]:
    tasks: dict[str, AssistantTask] = {}
    for task in load_tasks():
        tasks.setdefault(task.template, task)
    return list(tasks.values())


async def test_the_bundled_solutions_pass_on_the_real_servers_and_doing_nothing_fails(env: EnvServer) -> None:
    tasks = first_of_each_template()
    assert len(tasks) == 15
    async with AsyncSandboxClient(f"127.0.0.1:{env.server.port}") as client:

        def harness(task: AssistantTask) -> AssistantHarness:
            return AssistantHarness(task, client)

        loop = AgentLoop(
            AssistantScriptModel(tasks),
            Limits(max_steps=20, max_tokens=400_000),
            SamplingConfig(max_step_tokens=4096),
            run_id="claw-script",
        )
        solved = await run_rollouts(tasks, 1, loop=loop, client=client, make_harness=harness, concurrency=4)
        idle = AgentLoop(
            ScriptedModel(lambda prompt, step: tool_call("finish", answer=""), name="idle"),
            Limits(max_steps=2, max_tokens=400_000),
            SamplingConfig(max_step_tokens=512),
            run_id="claw-idle",
        )
        idled = await run_rollouts(tasks, 1, loop=idle, client=client, make_harness=harness, concurrency=4)
        left = [s async for s in client.list_sandboxes()]

    failed = {
        r.trajectory.task_id: (r.trajectory.stop_detail, r.grade and r.grade.log_tail)
        for r in solved
        if r.grade is None or not r.grade.resolved or r.grade.value != 1.0
    }
    assert not failed, failed
    for result, task in zip(solved, tasks, strict=True):
        assert len(result.trajectory.steps) == len(task.solution) + 1
        assert result.trajectory.rewards[-1].value == 1.0

    # Doing nothing passes exactly where the untouched fixture with an empty answer passes (the in-memory
    # reference), and fails every task whose solution changes the world.
    expected = {t.task_id: grade(t, copy.deepcopy(t.fixture), "").passed for t in tasks}
    got = {r.trajectory.task_id: bool(r.grade and r.grade.resolved) for r in idled}
    assert got == expected
    changing = {
        t.task_id
        for t in tasks
        if any(
            c["tool"] in ("send_mail", "create_event", "update_event", "delete_event", "write_file") for c in t.solution
        )
    }
    assert changing and not any(got[t] for t in changing)
    assert not left  # every sandbox was deleted
