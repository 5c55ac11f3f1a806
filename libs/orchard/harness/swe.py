"""The SWE harness: a repository in a sandbox, and three tools: `bash` (one command per call, in a fresh shell
at the repository root), `editor` (view, create, str_replace) and `submit` (the submission is the git diff of
the workspace against the base commit). Models without tool calling may send a ```bash block instead."""

from __future__ import annotations

import json

from orchard.chat.tools import SHELL_BLOCK
from orchard.harness.base import ActionResult, Harness, Parsed, call, call_arguments, create_retried, tool
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.tasks.environments import builder_for, task_sandbox
from orchard.tasks.instance import TaskInstance
from orchard.tasks.repo import SANDBOX_ENV
from orchard.types.v1 import types_pb2 as tpb

SYSTEM_PROMPT = (
    "You are a software engineer fixing an issue in a Python repository. Work step by step: look at the code, "
    "reproduce the problem, edit the files, run the tests, then submit. Each reply must contain exactly one "
    "tool call."
)
TASK_PROMPT = (
    "The repository is at {workdir} (your commands start there).\n\n<issue>\n{problem}\n</issue>\n\n"
    "Fix the issue by editing the source files (not the tests). When you are done, call submit."
)
BASH = tool(
    "bash",
    "Run one bash command at the repository root and return its output and exit code.",
    {"command": {"type": "string", "description": 'The command, e.g. "grep -rn foo src".'}},
    ["command"],
)
EDITOR = tool(
    "editor",
    "View a file (with line numbers) or directory, create a file, or replace one exact, "
    "unique occurrence of old_str with new_str in a file.",
    {
        "command": {"type": "string", "enum": ["view", "create", "str_replace"]},
        "path": {"type": "string", "description": "Relative to the repository root, or absolute."},
        "file_text": {"type": "string", "description": "For create: the whole content."},
        "old_str": {"type": "string"},
        "new_str": {"type": "string"},
    },
    ["command", "path"],
)
SUBMIT = tool("submit", "Submit your changes (the diff of the repository) and end the task.", {}, [])

# Runs inside the sandbox with the call's arguments as JSON on stdin: a failed edit is output, not an error.
EDITOR_SCRIPT = r"""
import json, os, sys
a = json.load(sys.stdin)
cmd, path = a.get("command"), a.get("path", "")
if cmd == "view":
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            depth = root[len(path):].count(os.sep)
            if depth < 2:
                for f in sorted(files):
                    print(os.path.join(root, f))
    else:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                print(f"{n:6}\t{line}", end="")
elif cmd == "create":
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(a.get("file_text", ""))
    print(f"created {path}")
elif cmd == "str_replace":
    old, new = a.get("old_str", ""), a.get("new_str", "")
    text = open(path).read()
    count = text.count(old) if old else 0
    if count != 1:
        sys.exit(f"old_str must occur exactly once in {path}; it occurs {count} times")
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))
    print(f"edited {path}")
else:
    sys.exit(f"unknown editor command {cmd!r}; use view, create or str_replace")
"""


class SWEHarness(Harness):
    """One SWE rollout on a task instance, in its own sandbox."""

    name = "orchard-swe"
    tools = [BASH, EDITOR, SUBMIT]

    def __init__(
        self,
        instance: TaskInstance,
        client: AsyncSandboxClient,
        *,
        task_set: str = "",
        command_timeout_s: float = 60.0,
        create_timeout_s: float = 120.0,
        create_attempts: int = 3,
        max_output_chars: int = 8000,
        sandbox_ttl_s: float = 7200.0,
    ) -> None:
        self.instance = instance
        self.client = client
        self.task_id = instance.instance_id
        self.task_set = task_set
        self.command_timeout_s = command_timeout_s
        self.create_timeout_s = create_timeout_s
        self.create_attempts = create_attempts
        self.max_output_chars = max_output_chars
        self.sandbox_ttl_s = sandbox_ttl_s
        self.sandbox: AsyncSandbox | None = None
        self._patch = ""

    async def setup(self) -> None:
        """Create the sandbox (bounded, retried on transient errors) and set the repository up in it."""
        if self.instance.environment is not None:  # a built environment: the first build may take minutes
            await builder_for(self.client).prepare(self.instance)
        labels = {"orchard.role": "rollout", "orchard.task": self.task_id[:63]}
        self.sandbox, _ = await create_retried(
            lambda: task_sandbox(self.client, self.instance, labels=labels, timeout=self.sandbox_ttl_s),
            attempts=self.create_attempts,
            timeout_s=self.create_timeout_s,
        )

    def initial_messages(self) -> list[tpb.Message]:
        return [
            tpb.Message(role=tpb.ROLE_SYSTEM, content=SYSTEM_PROMPT),
            tpb.Message(
                role=tpb.ROLE_USER,
                content=TASK_PROMPT.format(workdir=self.instance.workdir, problem=self.instance.problem_statement),
            ),
        ]

    def parse(self, text: str) -> Parsed:
        """`<tool_call>` blocks, else the first ```bash block (a bare "submit" in it submits)."""
        parsed = super().parse(text)
        if parsed.calls or "<tool_call>" in text:
            return parsed
        block = SHELL_BLOCK.search(text)
        if block is None:
            return Parsed([], "no <tool_call> block and no ```bash block found")
        command = block.group(1).strip()
        if command in ("submit", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"):
            return Parsed([call("submit")])
        return Parsed([call("bash", command=command)])

    async def execute(self, action: tpb.ToolCall) -> ActionResult:
        assert self.sandbox is not None, "setup() first"
        args = call_arguments(action)
        if isinstance(args, ActionResult):
            return args
        if action.name == "submit":
            diff = await self.sandbox.exec(
                "git add -A && git -c core.quotepath=off diff --cached HEAD",
                cwd=self.instance.workdir,
                env=SANDBOX_ENV,
                timeout=60,
            )
            self._patch = diff.stdout if diff.succeeded else ""
            return ActionResult("", status=tpb.ACTION_STATUS_SUBMITTED, submitted=True)
        if action.name == "bash":
            command = args.get("command")
            if not isinstance(command, str) or not command.strip():
                return ActionResult('bash needs a non-empty "command" string.', status=tpb.ACTION_STATUS_PARSE_ERROR)
            result = await self.sandbox.exec(
                command, cwd=self.instance.workdir, env=SANDBOX_ENV, timeout=self.command_timeout_s
            )
        else:  # editor
            result = await self.sandbox.exec(
                ["python3", "-c", EDITOR_SCRIPT],
                cwd=self.instance.workdir,
                env=SANDBOX_ENV,
                timeout=self.command_timeout_s,
                stdin=json.dumps(args),
            )
        output = result.stdout + result.stderr
        truncated = len(output) > self.max_output_chars or result.stdout_truncated or result.stderr_truncated
        if len(output) > self.max_output_chars:
            half = self.max_output_chars // 2
            output = f"{output[:half]}\n[... {len(output) - 2 * half} characters cut ...]\n{output[-half:]}"
        if result.timed_out:
            return ActionResult(
                f"{output}\n[the command timed out after {self.command_timeout_s:g}s and was killed]",
                status=tpb.ACTION_STATUS_TIMED_OUT,
                exit_code=result.exit_code,
                truncated=truncated,
            )
        return ActionResult(
            f"{output}\n[exit code {result.exit_code}]", exit_code=result.exit_code, truncated=truncated
        )

    async def submission(self) -> tuple[str, str]:
        return self._patch, ""

    async def close(self) -> None:
        if self.sandbox is not None:
            await self.sandbox.delete()
