"""Rendering a trajectory for the judge (docs/training.md §2.5): the task, each step's reasoning, command and compact
observation, and the final patch, each cut to its cap with head and tail kept."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from orchard.chat.tools import SHELL_BLOCK
from orchard.types.v1 import types_pb2 as tpb

TASK_CHARS = 4000
REASONING_CHARS = 600
COMMAND_CHARS = 400
ERROR_OUTPUT_CHARS = 800
"""A non-zero return code keeps this much of its output (head and tail)."""
OBSERVATION_CHARS = 1200
"""The cap of one compact observation, head and tail kept."""
DUMP_CHARS = 2000
"""A successful command's output longer than this is a dump: collapsed to a size marker and its summary lines."""
PATCH_CHARS = 4000
GOLD_PATCH_CHARS = 3000

# Lines worth keeping from any output: test summaries and the final line of errors.
_SUMMARY = re.compile(
    r"^(=+ .*\b(passed|failed|error|errors|skipped|no tests ran|xfailed|xpassed)\b.* =+"
    r"|(FAILED|ERROR|PASSED|XPASS|XFAIL)\b.*"
    r"|collected \d+ items?.*"
    r"|Ran \d+ tests? in .*"
    r"|OK( \(.*\))?|FAILED \(.*\)"
    r"|[\w.]*(Error|Exception): .*"
    r"|.*No module named .*)$"
)
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


@dataclass(frozen=True)
class RenderedStep:
    """One step as the judge sees it."""

    index: int
    reasoning: str
    command: str
    exit_code: int | None
    output: str


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` chars, keeping head and tail around a marker of what was dropped."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} chars omitted ...]\n"
    head = (limit * 2) // 3
    return text[:head] + marker + text[len(text) - (limit - head) :]


def summary_lines(output: str) -> list[str]:
    """The test-summary and error lines of an output, in order, without repeats."""
    lines = (line.strip() for line in output.splitlines())
    return list(dict.fromkeys(line for line in lines if line and _SUMMARY.match(line)))


def compact_observation(output: str, exit_code: int | None) -> str:
    """An observation in the judge's compact mode: errors keep 800 chars, summary lines are kept, successful
    dumps collapse to a size marker, everything is capped at 1,200 chars."""
    output = output.rstrip()
    summary = summary_lines(output)
    if exit_code not in (None, 0):
        body = clip(output, ERROR_OUTPUT_CHARS)
    elif len(output) > DUMP_CHARS:
        body = f"[output collapsed: {len(output.splitlines())} lines, {len(output)} chars]"
    else:
        body = output
    kept = [line for line in summary if line not in body]
    if kept:
        body += "\n[summary lines]\n" + "\n".join(kept)
    return clip(body, OBSERVATION_CHARS)


def command_of(action: tpb.ToolCall) -> str:
    """The shell command of an action, or `name(arguments)` for other tools."""
    try:
        args = json.loads(action.arguments) if action.arguments else {}
    except json.JSONDecodeError:
        args = None
    if isinstance(args, dict) and isinstance(args.get("command"), str) and len(args) == 1:
        return args["command"]
    return f"{action.name}({action.arguments})"


def steps_of(trajectory: tpb.Trajectory) -> list[RenderedStep]:
    """The trajectory's steps, from its structured steps or, when it has none, from its assistant/tool messages
    (mini-swe-agent style, with the return code parsed from `<returncode>`)."""
    if trajectory.steps:
        return [_structured(s) for s in trajectory.steps]
    return _from_messages(list(trajectory.messages))


def _structured(step: tpb.Step) -> RenderedStep:
    out = step.model_output
    reasoning = out.reasoning or out.content or "".join(p.text for p in out.parts)
    command = "\n".join(command_of(a) for a in step.actions)
    if step.action_status not in (tpb.ACTION_STATUS_UNSPECIFIED, tpb.ACTION_STATUS_OK):
        error = f": {step.action_error}" if step.action_error else ""
        command += f"\n[{tpb.ActionStatus.Name(step.action_status)}{error}]"
    # A step with several actions reports its first failing exit code, else its first one.
    codes = [o.exit_code for o in step.observations if o.HasField("exit_code")]
    code = next((c for c in codes if c != 0), codes[0] if codes else None)
    text = "\n".join(o.message.content or "".join(p.text for p in o.message.parts) for o in step.observations)
    return RenderedStep(step.index, reasoning, command.strip(), code, text)


def _from_messages(messages: list[tpb.Message]) -> list[RenderedStep]:
    steps: list[RenderedStep] = []
    first_user = next((i for i, m in enumerate(messages) if m.role == tpb.ROLE_USER), None)
    for i, m in enumerate(messages):
        if m.role != tpb.ROLE_ASSISTANT:
            continue
        blocks = SHELL_BLOCK.findall(m.content)
        command = "\n".join(command_of(c) for c in m.tool_calls) or (blocks[-1].strip() if blocks else "")
        reasoning = m.reasoning or SHELL_BLOCK.sub("", m.content).strip()
        output, code = "", None
        following = messages[i + 1] if i + 1 < len(messages) else None
        if following is not None and following.role in (tpb.ROLE_TOOL, tpb.ROLE_USER) and i + 1 != first_user:
            output = following.content
            found = _RETURNCODE.search(output)
            code = int(found.group(1)) if found else None
        steps.append(RenderedStep(len(steps), reasoning, command, code, output))
    return steps


def patch_files(patch: str) -> list[str]:
    """The files a unified diff touches: renamed files by both names, added and deleted ones (/dev/null) by
    their real name."""
    files: list[str] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line[len("diff --git ") :].split(" b/", 1)
            files += [parts[0].removeprefix("a/"), *parts[1:]]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            files.append(line.split(" ", 2)[2])
        elif line.startswith(("--- ", "+++ ")):
            name = line[4:].split("\t", 1)[0].strip()
            if name != "/dev/null":
                files.append(name[2:] if name.startswith(("a/", "b/")) else name)
    return list(dict.fromkeys(f for f in files if f))


def problem_statement(trajectory: tpb.Trajectory) -> str:
    """The trajectory's first user message: the task statement a harness sent."""
    first = next((m for m in trajectory.messages if m.role == tpb.ROLE_USER), None)
    return "" if first is None else first.content or "".join(p.text for p in first.parts)


@dataclass(frozen=True)
class Reference:
    """The reference solution a reference-guided judge sees."""

    gold_patch: str
    changed_files: list[str]
    test_files: list[str]
    fail_to_pass: list[str]


def render_trajectory(task: str, steps: list[RenderedStep], final_patch: str, reference: Reference | None) -> str:
    """The judge's user message: task, optional reference, the steps in compact form, the final patch."""
    parts = [f"## Task\n{clip(task.strip(), TASK_CHARS)}"]
    if reference is not None:
        ref = [
            f"Gold patch:\n{clip(reference.gold_patch, GOLD_PATCH_CHARS)}" if reference.gold_patch else "",
            f"Changed files: {', '.join(reference.changed_files)}" if reference.changed_files else "",
            f"Test files: {', '.join(reference.test_files)}" if reference.test_files else "",
            f"FAIL_TO_PASS tests: {', '.join(reference.fail_to_pass)}" if reference.fail_to_pass else "",
        ]
        parts.append(
            "## Reference (use only to ground R2, R3 and R5; do not grade whether the edit matches it)\n"
            + "\n".join(r for r in ref if r)
        )
    rendered = []
    for s in steps:
        lines = [f"### Step {s.index}"]
        if s.reasoning.strip():
            lines.append(f"Reasoning: {clip(s.reasoning.strip(), REASONING_CHARS)}")
        lines.append(f"Command: {clip(s.command, COMMAND_CHARS)}" if s.command else "Command: (none)")
        code = "none" if s.exit_code is None else str(s.exit_code)
        lines.append(f"Return code: {code}\nObservation:\n{compact_observation(s.output, s.exit_code)}")
        rendered.append("\n".join(lines))
    parts.append("## Trajectory\n" + ("\n\n".join(rendered) if rendered else "(no steps)"))
    if final_patch.strip():
        files = ", ".join(patch_files(final_patch))
        parts.append(f"## Final patch (files: {files})\n{clip(final_patch, PATCH_CHARS)}")
    else:
        parts.append("## Final patch\n(none submitted)")
    return "\n\n".join(parts)
