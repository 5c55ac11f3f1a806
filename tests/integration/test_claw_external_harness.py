"""examples/claw_external_harness.py, an agent outside Orchard's harness library, run as a program on real parts: a
real env service with `claw` sandboxes, the real recording proxy, and behind it a SCRIPTED OpenAI-compatible
model (a real HTTP server replaying bundled tasks' solutions as tool calls). Every task scores 1.0 and the proxy
holds one rollout per task with every tool-calling turn."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from env_helpers import EnvServer, needs_image, needs_sandboxes

from orchard.assistant import TOOLS
from orchard.services.proxy.records import read_records
from orchard.services.proxy.server import RecordingProxy
from orchard.services.proxy.settings import ProxySettings
from orchard.tasks.assistant import AssistantTask, load_tasks

pytestmark = [needs_sandboxes, needs_image("claw"), pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "claw_external_harness.py"
IDS = ["reply-question-000", "reschedule-event-003", "update-csv-007"]  # email, calendar, files


class ScriptedClaw:
    """A SCRIPTED model, not a real one (as ScriptedChat in test_mini_swe_agent.py): an OpenAI-compatible HTTP
    server whose POST /v1/chat/completions finds the task by its instruction and, after n assistant turns, replies
    with the solution's call n as a tool call, then with the task's answer. It records every request and its
    Authorization header, so the test sees what reached the model through the proxy."""

    def __init__(self, tasks: list[AssistantTask]) -> None:
        self.tasks = {t.instruction: t for t in tasks}
        self.requests: list[tuple[str, dict[str, Any]]] = []
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                chat.requests.append((self.headers.get("Authorization", ""), body))
                task = chat.tasks[body["messages"][1]["content"]]
                n = sum(m["role"] == "assistant" for m in body["messages"])
                if n < len(task.solution):
                    step = task.solution[n]
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"call_{n}",
                                "type": "function",
                                "function": {"name": step["tool"], "arguments": json.dumps(step["args"])},
                            }
                        ],
                    }
                else:
                    message = {"role": "assistant", "content": task.answer}
                reply = {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.api_base = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def tasks() -> list[AssistantTask]:
    chosen = load_tasks(ids=IDS)
    assert len({t.template for t in chosen}) == len(IDS) and all(t.solution for t in chosen)
    return chosen


@pytest.fixture
def scripted(tasks: list[AssistantTask]) -> Iterator[ScriptedClaw]:
    chat = ScriptedClaw(tasks)
    yield chat
    chat.close()


async def test_the_external_harness_solves_tasks_through_the_recording_proxy(
    env: EnvServer, tasks: list[AssistantTask], scripted: ScriptedClaw, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    proxy = RecordingProxy(
        ProxySettings(
            port=0,
            upstream_url=scripted.api_base,
            records_dir=records,
            require_rollout_id=True,
            log_format="text",
            grace_period_s=1.0,
        )
    )
    await proxy.start()
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            "--base-url",
            f"http://127.0.0.1:{proxy.port}/v1",
            "--model",
            "scripted",
            "--api-key",
            "sk-upstream",
            "--env-address",
            f"127.0.0.1:{env.server.port}",
            "--ids",
            *IDS,
            "--max-steps",
            "8",
            "--run-id",
            "ext",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(240):
            out, _ = await process.communicate()
    finally:
        await proxy.stop()
    output = out.decode()
    assert process.returncode == 0, output

    # 1. Every task scored 1.0 by the Claw-Eval grader, after exactly its solution's tool calls.
    for task in tasks:
        assert (
            f"{task.task_id}: score 1.00 after {len(task.solution)} tool calls (rollout ext-{task.task_id})" in output
        ), output
    assert "mean score 1.000 over 3 tasks" in output

    # 2. One rollout per task: each model call recorded in order, the tool calls out and the tool results back.
    assert sorted(p.name for p in records.iterdir()) == sorted(f"ext-{i}.jsonl" for i in IDS)
    for task in tasks:
        rollout = read_records(records, f"ext-{task.task_id}")
        assert [r["seq"] for r in rollout] == list(range(len(task.solution) + 1))
        assert all(r["status"] == 200 and r["path"] == "/v1/chat/completions" and r["error"] is None for r in rollout)
        for n, record in enumerate(rollout):
            request, message = record["request"], record["response"]["choices"][0]["message"]
            assert request["model"] == "scripted" and request["tools"] == TOOLS
            assert request["messages"][1] == {"role": "user", "content": task.instruction}
            assert len(request["messages"]) == 2 + 2 * n
            if n < len(task.solution):
                [call] = message["tool_calls"]
                assert call["function"]["name"] == task.solution[n]["tool"]
                assert json.loads(call["function"]["arguments"]) == task.solution[n]["args"]
            else:
                assert message == {"role": "assistant", "content": task.answer}
            if n:
                previous, result = request["messages"][-2:]
                assert previous["tool_calls"] == rollout[n - 1]["response"]["choices"][0]["message"]["tool_calls"]
                assert result["role"] == "tool" and result["tool_call_id"] == f"call_{n - 1}"
                assert "error" not in json.loads(result["content"])  # the env's answer, not a failure

    # 3. The proxy passed the upstream key on, without the rollout id; nothing went to the model around it.
    assert len(scripted.requests) == sum(len(t.solution) + 1 for t in tasks)
    assert {auth for auth, _ in scripted.requests} == {"Bearer sk-upstream"}
