"""mini-swe-agent 2.4, unmodified, on Orchard Env through orchard.integrations.mini_swe_agent: its environment
contract against a real env service and real python:3.11-slim sandboxes, then its real DefaultAgent and litellm
model classes end to end, with (1) a scripted OpenAI-compatible server and (2) the real embedded model
(SmolLM2-135M-Instruct) behind the inference service's OpenAI endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from env_helpers import needs_sandboxes

pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install 'mini-swe-agent==2.4.*')")

from minisweagent.environments import get_environment
from minisweagent.exceptions import Submitted

from orchard import SandboxClient
from orchard.errors import NotFound
from orchard.integrations.mini_swe_agent import (
    ENVIRONMENT_CLASS,
    OrchardEnvironment,
    mini_config,
    run_mini_swe_agent,
)
from orchard.sdk import Sandbox
from orchard.services.env.images import default_images_dir, image_dirname
from orchard.services.env.server import build as build_env
from orchard.services.env.settings import EnvSettings

IMAGE = "python:3.11-slim"
REPO = "/testbed"  # where mini's stock SWE-bench prompts say the repository is
TASK = "ANSWER in consts.py should be 42, not 41."
FILES = {
    "consts.py": "ANSWER = 41\n",
    "test_consts.py": "import unittest\n\nfrom consts import ANSWER\n\n\nclass T(unittest.TestCase):\n"
    "    def test_answer(self):\n        self.assertEqual(ANSWER, 42)\n",
}
EMBEDDED_MODEL = "SmolLM2-135M-Instruct"

pytestmark = [
    needs_sandboxes,
    pytest.mark.skipif(
        not (default_images_dir() / image_dirname(IMAGE) / "rootfs").is_dir(),
        reason=f"image {IMAGE} is not built (orchard image build {IMAGE})",
    ),
    pytest.mark.timeout(120),
]


class LoopThread:
    """An event loop in a daemon thread: the servers live on it while the tests (and mini) block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def address(loop: LoopThread) -> Iterator[str]:
    """A real env service (local backend) on 127.0.0.1:0."""
    with tempfile.TemporaryDirectory() as state:
        settings = EnvSettings(port=0, state_dir=Path(state) / "state", log_format="text", grace_period_s=1.0)

        async def start() -> tuple[Any, int]:
            server, _ = await build_env(settings)
            return server, await server.start()

        server, port = loop.run(start())
        yield f"127.0.0.1:{port}"
        loop.run(server.stop())


@pytest.fixture
def environment(address: str) -> Iterator[OrchardEnvironment]:
    """An OrchardEnvironment on a fresh sandbox, closed after the test."""
    with OrchardEnvironment(address=address, image=IMAGE, timeout=20) as env:
        yield env


@pytest.fixture
def repo_env(address: str) -> Iterator[OrchardEnvironment]:
    """An OrchardEnvironment whose sandbox holds the tiny repository (a git checkout) at /testbed."""
    with OrchardEnvironment(address=address, image=IMAGE, cwd=REPO, timeout=20) as env:
        put_repo(env.sandbox)
        yield env


def put_repo(sandbox: Sandbox) -> None:
    """The tiny repository at /testbed, committed, with its test failing."""
    for name, text in FILES.items():
        sandbox.upload_content(text, f"{REPO}/{name}")
    done = sandbox.exec(
        "git init -q && git add -A && git -c user.name=t -c user.email=t@example.com commit -qm init"
        " && python3 -m unittest",
        cwd=REPO,
        timeout=60,
    )
    assert done.exit_code == 1 and "AssertionError: 41 != 42" in done.stderr, done


def fixes_the_repo(address: str, patch: str) -> bool:
    """Whether `patch` applies to a fresh copy of the repository and makes its test pass."""
    with SandboxClient(address) as client, client.create_sandbox(IMAGE) as sandbox:
        put_repo(sandbox)
        sandbox.apply_patch(patch, cwd=REPO)
        return sandbox.exec("python3 -m unittest", cwd=REPO, timeout=60).exit_code == 0


# (a) The environment contract, called directly.


def test_output_is_merged_in_order_with_the_exit_code(environment: OrchardEnvironment) -> None:
    out = environment.execute({"command": "echo one; echo two >&2; echo three; exit 3"})
    assert out == {"output": "one\ntwo\nthree\n", "returncode": 3, "exception_info": ""}


def test_every_command_runs_in_a_fresh_subshell(environment: OrchardEnvironment) -> None:
    """cd and exports do not carry over; files do; cwd= picks the directory of one call."""
    assert environment.execute({"command": "cd /tmp && export X=1 && touch kept && pwd"})["output"] == "/tmp\n"
    assert (
        environment.execute({"command": 'pwd; echo "${X-unset}"; ls /tmp/kept'})["output"]
        == "/workspace\nunset\n/tmp/kept\n"
    )
    assert environment.execute({"command": "pwd"}, cwd="/tmp")["output"] == "/tmp\n"


def test_the_shell_is_clean_and_non_interactive(address: str) -> None:
    """No BASH_ENV or rc file sneaks in (the pyenv-init hang); config env reaches every command."""
    with OrchardEnvironment(address=address, image=IMAGE, env={"PAGER": "cat"}) as env:
        out = env.execute({"command": 'echo "${BASH_ENV-unset} $PAGER $-"; shopt -q login_shell || echo no-login'})
    bash_env, pager, flags, login = out["output"].split()
    assert (bash_env, pager, login) == ("unset", "cat", "no-login") and "i" not in flags


def test_a_timeout_kills_the_command_and_returns_minus_one(environment: OrchardEnvironment) -> None:
    started = time.monotonic()
    out = environment.execute({"command": "echo started; sleep 30 & wait"}, timeout=1)
    assert time.monotonic() - started < 25  # the 1 s timeout, not the sleep 30
    assert out["returncode"] == -1 and out["output"] == "started\n"
    assert "timed out after 1 seconds" in out["exception_info"]
    assert environment.execute({"command": "echo alive"})["output"] == "alive\n"  # the sandbox lives on


def test_the_magic_first_line_submits_the_rest_of_the_output(repo_env: OrchardEnvironment) -> None:
    """Submitted carries the patch; a failing command with the marker, or the marker later on, does not submit."""
    assert repo_env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; exit 1"})["returncode"] == 1
    assert repo_env.execute({"command": "echo x; echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})["returncode"] == 0
    repo_env.execute({"command": "sed -i 's/41/42/' consts.py"})
    with pytest.raises(Submitted) as info:
        repo_env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"})
    (message,) = info.value.messages
    patch = message["extra"]["submission"]
    assert message["role"] == "exit" and message["extra"]["exit_status"] == "Submitted"
    assert patch.startswith("diff --git a/consts.py b/consts.py") and "+ANSWER = 42" in patch
    assert fixes_the_repo(repo_env.config.address or "", patch)


def test_mini_builds_it_from_a_stock_config(address: str) -> None:
    """mini's own loader builds it from the stock swebench environment section (interpreter, BASH_ENV... and
    keys of other environments are tolerated); template vars describe the sandbox; close deletes the sandbox."""
    stock = {
        "environment_class": ENVIRONMENT_CLASS,
        "cwd": "/",
        "timeout": 60,
        "interpreter": ["bash", "-c"],
        "env": {"PAGER": "cat"},
        "run_args": ["--rm"],
        "forward_env": [],
        "image": IMAGE,
        "address": address,
    }
    env = get_environment(stock)
    assert isinstance(env, OrchardEnvironment)
    sandbox_id = env.sandbox.sandbox_id
    template_vars = env.get_template_vars(task="t")
    assert template_vars["system"] == "Linux" and template_vars["node"] == sandbox_id
    assert template_vars["machine"] and template_vars["release"] and template_vars["cwd"] == "/"
    assert template_vars["task"] == "t"
    info = env.serialize()["info"]
    assert info["config"]["environment_type"] == ENVIRONMENT_CLASS and info["orchard_sandbox_id"] == sandbox_id
    assert json.loads(json.dumps(info))["config"]["environment"]["image"] == IMAGE
    env.close()
    env.close()  # twice is fine
    with SandboxClient(address) as client, pytest.raises(NotFound):
        client.get_sandbox(sandbox_id)


# (b) End to end: mini's DefaultAgent, its litellm model classes, our adapter.


class ScriptedChat:
    """A SCRIPTED model, not a real one: a tiny OpenAI-compatible HTTP server whose POST /v1/chat/completions
    replays `commands` in order, each as an assistant reply with one bash tool call, and records every request.

    It proves the adapter and mini's loop (real litellm client, real tool-call parsing and observations)
    without depending on what a model happens to write.
    """

    def __init__(self, commands: list[str]) -> None:
        self.commands = commands
        self.requests: list[dict[str, Any]] = []
        chat = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = len(chat.requests)
                chat.requests.append(body)
                if self.path != "/v1/chat/completions" or n >= len(chat.commands):
                    self.send_error(404 if n < len(chat.commands) else 500, "no scripted reply left")
                    return
                call = {
                    "id": f"call_{n}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": json.dumps({"command": chat.commands[n]})},
                }
                reply = {
                    "id": f"chatcmpl-{n}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "tool_calls",
                            "message": {"role": "assistant", "content": f"Step {n + 1}.", "tool_calls": [call]},
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


def test_scripted_model_solves_the_task_through_the_adapter(repo_env: OrchardEnvironment, address: str) -> None:
    """mini's stock SWE-bench config (tool calls, litellm) with a SCRIPTED model: it reads, edits, tests, writes
    the patch and submits it; the patch fixes a fresh copy of the repository."""
    chat = ScriptedChat(
        [
            "cat consts.py && python3 -m unittest",
            "sed -i 's/ANSWER = 41/ANSWER = 42/' consts.py && python3 -m unittest",
            "git diff -- consts.py > patch.txt",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt",
        ]
    )
    try:
        config = mini_config("scripted", chat.api_base, address=address, step_limit=10)
        run = run_mini_swe_agent(TASK, config, repo_env)
    finally:
        chat.close()
    assert (run.exit_status, run.api_calls) == ("Submitted", 4)
    assert run.submission.startswith("diff --git a/consts.py b/consts.py") and fixes_the_repo(address, run.submission)
    # Every request went through litellm's OpenAI client with mini's bash tool, and each carried the
    # observation of the previous command back as a tool message.
    assert len(chat.requests) == 4
    assert all(
        r["model"] == "scripted" and [t["function"]["name"] for t in r["tools"]] == ["bash"] for r in chat.requests
    )
    observations = [r["messages"][-1] for r in chat.requests[1:]]
    assert [(m["role"], m["tool_call_id"]) for m in observations] == [("tool", f"call_{i}") for i in range(3)]
    assert "ANSWER = 41" in observations[0]["content"] and "AssertionError: 41 != 42" in observations[0]["content"]
    assert "<returncode>0</returncode>" in observations[1]["content"] and "OK" in observations[1]["content"]


def test_run_builds_and_deletes_its_own_environment(address: str) -> None:
    """Without an environment, run_mini_swe_agent builds one from config["environment"] and deletes it after."""
    chat = ScriptedChat(["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && uname -s"])
    try:
        run = run_mini_swe_agent(TASK, mini_config("scripted", chat.api_base, address=address, cwd="/"))
    finally:
        chat.close()
    assert (run.exit_status, run.submission) == ("Submitted", "Linux\n")
    with SandboxClient(address) as client:
        assert list(client.list_sandboxes()) == []


def test_the_mini_cli_runs_unmodified_on_it(address: str, tmp_path: Path) -> None:
    """mini's own `mini` command, picked up by --environment-class, with a SCRIPTED model; its sandbox is
    deleted when the process exits (the SDK client's exit hook: mini never closes environments)."""
    chat = ScriptedChat(["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && uname -s"])
    trajectory = tmp_path / "run.traj.json"
    settings = {
        "environment.image": IMAGE,
        "environment.address": address,
        "model.model_name": "openai/scripted",
        "model.model_kwargs.api_base": chat.api_base,
        "model.model_kwargs.api_key": "none",
        "model.cost_tracking": "ignore_errors",
    }
    argv = [
        str(Path(sys.executable).parent / "mini"),
        "--yolo",
        "--exit-immediately",
        "--task",
        TASK,
        "--environment-class",
        ENVIRONMENT_CLASS,
        "--output",
        str(trajectory),
        "-c",
        "mini.yaml",
        *[arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")],
    ]
    env = {
        **os.environ,
        "MSWEA_CONFIGURED": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    try:
        done = subprocess.run(
            argv, env=env, check=False, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
        )
    finally:
        chat.close()
    assert done.returncode == 0, done.stdout + done.stderr
    info = json.loads(trajectory.read_text())["info"]
    assert (info["exit_status"], info["submission"]) == ("Submitted", "Linux\n")
    assert info["config"]["environment_type"] == ENVIRONMENT_CLASS
    with SandboxClient(address) as client, pytest.raises(NotFound):
        client.get_sandbox(info["orchard_sandbox_id"])


@pytest.fixture(scope="module")
def embedded_api_base(loop: LoopThread) -> Iterator[str]:
    """The inference service with the real embedded model and its OpenAI endpoint on loopback ports."""
    from orchard.services.inference.server import build, start_gateway
    from orchard.services.inference.settings import InferenceSettings

    async def start() -> tuple[Any, int]:
        settings = InferenceSettings(port=0, http_port=0, log_format="text", grace_period_s=1.0)
        server, engine = await build(settings)
        gateway = await start_gateway(settings, server, engine)
        assert gateway is not None
        await server.start()
        return server, gateway.port

    server, http_port = loop.run(start())
    yield f"http://127.0.0.1:{http_port}/v1"
    loop.run(server.stop())


# SmolLM2-135M cannot work out a fix, nor call tools zero-shot; what it can do, greedily, is copy a command it is
# shown in a ```bash block. So the prompts name each step's command: the model's copy runs in the sandbox,
# its output goes back in the next prompt (which names the submit command), and the copied submit ends the run.
EMBEDDED_SYSTEM = "You are a helpful assistant."
EMBEDDED_INSTANCE = """Task: {{task}}

Repeat the following text exactly, and nothing else:

```bash
echo STEP_1 && sed -i 's/ANSWER = 41/ANSWER = 42/' consts.py && git diff
```
"""
EMBEDDED_OBSERVATION = """<returncode>{{output.returncode}}</returncode>
<output>
{{output.output}}</output>

Repeat the following text exactly, and nothing else:

```bash
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff
```
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_embedded_model_solves_the_trivial_task_through_our_endpoint(
    repo_env: OrchardEnvironment, address: str, embedded_api_base: str
) -> None:
    """The REAL embedded model behind our OpenAI endpoint, mini's text-based litellm model class, very explicit
    prompts (see above) and a step limit of 4: two model calls, an observation in between, a patch that works."""
    config = mini_config(EMBEDDED_MODEL, embedded_api_base, textbased=True, address=address, step_limit=4)
    config["agent"] |= {"system_template": EMBEDDED_SYSTEM, "instance_template": EMBEDDED_INSTANCE}
    config["model"] |= {
        "observation_template": EMBEDDED_OBSERVATION,
        # the model writes ```bash, never mini's ```mswea_bash_command tag
        "action_regex": r"```(?:mswea_bash_command|bash)\s*\n(.*?)\n```",
    }
    config["model"]["model_kwargs"] |= {"max_tokens": 64, "temperature": 0}
    run = run_mini_swe_agent(TASK, config, repo_env)

    said = [m["content"] or m.get("extra", {}).get("model_response") for m in run.messages[2:]]
    assert (run.exit_status, run.api_calls) == ("Submitted", 2), said
    replies = [m for m in run.messages if m["role"] == "assistant"]
    assert all(m["extra"]["response"]["model"] == EMBEDDED_MODEL for m in replies)  # they came from our endpoint
    (observation,) = [m for m in run.messages if m["role"] == "user" and "<returncode>" in m["content"]]
    assert observation["content"].startswith("<returncode>0</returncode>\n<output>\nSTEP_1\ndiff --git")
    assert run.submission.startswith("diff --git a/consts.py b/consts.py") and fixes_the_repo(address, run.submission)


def test_orchard_rollout_runs_mini_on_a_task_set(address: str, tmp_path: Path) -> None:
    """`orchard rollout --harness mini-swe-agent`: mini's DefaultAgent (a SCRIPTED model that applies the gold
    patch, then submits `git diff`) on a bundled task, with Orchard's task setup, grading and storage: the report
    resolves it, the stored trajectory is mini's conversation as steps with its outcome reward."""
    from orchard.tasks import load_instances

    task = load_instances("toyrepair")[0]
    chat = ScriptedChat(
        [f"git apply <<'PATCH'\n{task.patch}PATCH", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"]
    )
    try:
        done = subprocess.run(
            [
                str(Path(sys.executable).with_name("orchard")),
                "rollout",
                "--tasks",
                "toyrepair",
                "--ids",
                task.instance_id,
                "--harness",
                "mini-swe-agent",
                "--openai-base",
                chat.api_base,
                "--model",
                "scripted",
                "--env-address",
                address,
                "--no-events",
                "--run-id",
                "mini-run",
                "--out",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        chat.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resolved 1/1" in done.stdout, done.stdout
    [stored] = [json.loads(line) for line in (tmp_path / "mini-run" / "trajectories.jsonl").read_text().splitlines()]
    assert stored["harness"] == "mini-swe-agent" and len(stored["steps"]) == 2
    assert stored["finalPatch"].startswith("diff --git") and stored["rewards"][0]["value"] == 1.0
    assert "<returncode>0</returncode>" in stored["steps"][0]["observations"][0]["message"]["content"]
    with SandboxClient(address) as client:
        assert list(client.list_sandboxes()) == []  # the rollout's and the grade's sandboxes are gone
