"""ReferenceModel: a synthetic policy of chosen quality, built from a task set's gold patches, for exercising value
training, reranking and best-of-N without a capable model. It is no model: it knows every answer and chooses,
per rollout, whether to give it.

Each rollout draws a plan from its own seeded RNG: with probability `quality` it writes the task's gold patch,
otherwise a flawed one (see FLAWS). It looks at the code (cat, grep, the editor), applies its patch with
`git apply`, runs the tests more often the better it is, may revert and apply the gold patch after seeing them
fail, and submits. Everything goes through the real harness and sandbox, so observations, test runs and grades
are real; only the choices are scripted.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import InvalidArgument
from orchard.harness.model import ModelError, Sample
from orchard.harness.scripted import ScriptedModel
from orchard.tasks.environments import is_git_repo
from orchard.tasks.instance import TaskInstance
from orchard.types.v1 import types_pb2 as tpb

FLAWS = {"mutated": 4, "partial": 3, "deleted": 2, "unchanged": 1}
"""Kinds of flawed attempt, with their weights among those a task allows: the gold patch with one added line
mutated (a constant, operator, index or argument order: it applies, and is meant to fail the tests), only some
hunks of a multi-hunk gold patch, the offending lines deleted without the fix (the right file, broken), and no
change at all."""
TEST_COMMANDS = ("python -m pytest -q", "python -m pytest -q tests", "python -m pytest -x -q")

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@(.*)$")
_MUTATIONS: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (re.compile(r"(?<![<>=!-])[<>](?![<>=])"), lambda m: {"<": ">", ">": "<"}[m[0]]),
    (re.compile(r"<=|>="), lambda m: {"<=": ">=", ">=": "<="}[m[0]]),
    (re.compile(r"==|!="), lambda m: {"==": "!=", "!=": "=="}[m[0]]),
    (re.compile(r"\b(?:and|or)\b"), lambda m: {"and": "or", "or": "and"}[m[0]]),
    (re.compile(r"(?<![\w.])\d+(?![\w.])"), lambda m: str(int(m[0]) + 1)),
    (re.compile(r" [+-] "), lambda m: {" + ": " - ", " - ": " + "}[m[0]]),
    (re.compile(r"\[(-?\w+)([:\]])"), lambda m: f"[{m[1]} + 1{m[2]}"),
    (re.compile(r"\[(-?\w+)([:\]])"), lambda m: f"[{m[1]} - 1{m[2]}"),
    (re.compile(r"\b(\w+)\((\w+), (\w+)\)"), lambda m: f"{m[1]}({m[3]}, {m[2]})"),
]
"""Single-point mutations of a code line: flip a comparison, and/or, a constant (+1), +/-, an index (+/-1), or
the arguments of a two-argument call."""
_RETURN = re.compile(r"^(\s*return )(.+?)\s*$")
"""When no mutation fits: an off-by-one in the returned value."""
_ROLLOUT: ContextVar[str] = ContextVar("orchard_reference_rollout")

File = tuple[list[str], list[list[str]]]
"""A file's part of a unified diff: its header lines, and its hunks (each its @@ line, then its body)."""
NOT_CODE_SUFFIXES = frozenset(
    {".md", ".rst", ".txt", ".adoc", ".html", ".cfg", ".toml", ".ini", ".json", ".yml", ".yaml", ".in", ".lock"}
)
NOT_CODE_NAMES = frozenset(
    {"changelog", "changes", "news", "history", "authors", "contributors", "readme", "license", "copying"}
)


def is_code(header: list[str]) -> bool:
    """Whether a diff file section is code: a flaw put only in docs, a changelog or a config leaves the fix whole
    (reference:0.0 would then resolve tasks)."""
    path = next((line[6:] for line in header if line.startswith("+++ b/")), "") or next(
        (line.split(" b/", 1)[-1] for line in header if line.startswith("diff --git")), ""
    )
    name = Path(path).name.lower()
    return (
        Path(name).suffix not in NOT_CODE_SUFFIXES
        and Path(name).stem not in NOT_CODE_NAMES
        and "/docs/" not in f"/{path}"
        and not path.startswith("doc/")
    )


def split_patch(patch: str) -> list[File]:
    """A unified diff (`diff --git` sections) as its files' headers and hunks."""
    files: list[File] = []
    for line in patch.splitlines():
        if line.startswith("diff --git") or not files:
            files.append(([line], []))
        elif line.startswith("@@"):
            files[-1][1].append([line])
        elif files[-1][1]:
            if line:
                files[-1][1][-1].append(line)
        else:
            files[-1][0].append(line)
    return files


def join_patch(files: list[File]) -> str:
    """A unified diff of these files, with every hunk's line numbers and counts remade from its body; hunks
    without changes, and files without hunks, are left out."""
    out: list[str] = []
    for header, hunks in files:
        kept = [h for h in hunks if any(line[:1] in "+-" for line in h[1:])]
        if not kept:
            continue
        out += header
        shift = 0
        for hunk in kept:
            match = _HUNK.match(hunk[0])
            if match is None:
                raise ValueError(f"not a hunk header: {hunk[0]!r}")
            body = hunk[1:]
            start = int(match[1])
            old = sum(line[:1] in " -" for line in body)
            new = sum(line[:1] in " +" for line in body)
            out.append(f"@@ -{_span(start, old)} +{_span(start + shift + (old == 0), new)} @@{match[2]}")
            out += body
            shift += new - old
    return "\n".join(out) + "\n" if out else ""


def _span(start: int, count: int) -> str:
    """A hunk header's range, as git writes it (no count when it is 1)."""
    return str(start) if count == 1 else f"{start},{count}"


def mutations(patch: str) -> list[str]:
    """Every patch that is `patch` with one mutation in one added code line (see _MUTATIONS), unless the mutation
    writes back a line the patch removes (a mutated fix that restores the bug is no change at all)."""
    files = split_patch(patch)
    found: list[tuple[int, int, int, str]] = []
    fallback: list[tuple[int, int, int, str]] = []
    for f, (header, hunks) in enumerate(files):
        if not is_code(header):
            continue
        for h, hunk in enumerate(hunks):
            removed = {line[1:] for line in hunk[1:] if line.startswith("-")}
            for n, line in enumerate(hunk[1:], 1):
                code = line[1:]
                if not line.startswith("+") or not code.strip() or code.strip().startswith(("#", '"""', "'''")):
                    continue
                mutants = [
                    code[: m.start()] + replace(m) + code[m.end() :]
                    for pattern, replace in _MUTATIONS
                    for m in pattern.finditer(code)
                ]
                found += [(f, h, n, mutant) for mutant in mutants if mutant not in removed]
                if returned := _RETURN.match(code):
                    fallback.append((f, h, n, f"{returned[1]}{returned[2]} - 1"))
    patches = []
    for f, h, n, code in found or fallback:
        copy = [(header, [list(hunk) for hunk in hunks]) for header, hunks in files]
        copy[f][1][h][n] = "+" + code
        patches.append(join_patch(copy))
    return list(dict.fromkeys(patches))


def partials(patch: str) -> list[str]:
    """Every patch that is `patch` less one of its code hunks (none when it has a single hunk): dropping a hunk
    of docs alone would leave the fix whole."""
    files = split_patch(patch)
    if sum(len(hunks) for _, hunks in files) < 2:
        return []
    where = [(f, h) for f, (header, hunks) in enumerate(files) if is_code(header) for h in range(len(hunks))]
    return [
        join_patch(
            [
                (header, [hunk for h, hunk in enumerate(hunks) if (f, h) != drop])
                for f, (header, hunks) in enumerate(files)
            ]
        )
        for drop in where
    ]


def deletion(patch: str) -> str:
    """`patch` without its added lines: the offending code removed, the fix not written ("" when that is no
    change or is the gold patch itself)."""
    files = split_patch(patch)
    if not any(
        line.startswith("+") for header, hunks in files if is_code(header) for hunk in hunks for line in hunk[1:]
    ):
        return ""
    return join_patch(
        [
            (
                header,
                [
                    [hunk[0], *(line for line in hunk[1:] if not line.startswith("+"))] if is_code(header) else hunk
                    for hunk in hunks
                ],
            )
            for header, hunks in files
        ]
    )


def changed_files(patch: str) -> list[str]:
    """The paths a patch touches, in order."""
    return [line[6:] for line in patch.splitlines() if line.startswith("+++ b/")] or [
        line[6:] for line in patch.splitlines() if line.startswith("--- a/")
    ]


def tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def apply_command(patch: str, via_file: bool = False) -> str:
    """A bash command that applies `patch` at the repository root (from stdin, or written to a file first)."""
    if via_file:
        return f"cat > /tmp/fix.diff <<'PATCH'\n{patch}PATCH\ngit apply /tmp/fix.diff && git diff --stat"
    return f"git apply -v <<'PATCH'\n{patch}PATCH"


@dataclass(frozen=True)
class Plan:
    """What one rollout does, drawn once from its RNG."""

    flaw: str
    """"" when it writes the gold patch, else the kind of flawed attempt (a key of FLAWS)."""
    replies: list[str]
    """The replies up to and including the tests (looking, the edit, the test run)."""
    tests: str
    """The test command it runs after the edit ("" when it does not run tests)."""
    retry: bool
    """Whether failing tests make it revert and apply the gold patch."""


class ReferenceModel(ScriptedModel):
    """A synthetic policy of chosen quality built from the tasks' gold patches (see the module docstring).

    A rollout's choices come from an RNG seeded with `seed`, the task and the rollout's identity: in a seeded
    run the sample (the loop's `step_seed` of step s is the sample's seed + s, so seed - s names it), else the
    trajectory id.
    So the k samples of a task differ, and a seeded run repeats exactly.
    """

    def __init__(self, tasks: Sequence[TaskInstance], quality: float, seed: int = 0) -> None:
        if not 0.0 <= quality <= 1.0:
            raise InvalidArgument(f"a reference policy's quality must be in [0, 1], got {quality}", field="quality")
        super().__init__(self.reply, name=f"reference-q{quality:.2f}")
        self.tasks = list(tasks)
        self.quality = quality
        self.seed = seed

    async def generate(
        self,
        token_ids: list[int],
        max_tokens: int,
        seed: int | None,
        labels: dict[str, str],
        images: Sequence[tpb.Image] = (),
    ) -> Sample:
        # ScriptedModel shows its policy only (prompt, step): which rollout this is travels in a context variable.
        rollout = f"sample {seed - int(labels['step'])}" if seed is not None else labels["trajectory_id"]
        token = _ROLLOUT.set(rollout)
        try:
            return await super().generate(token_ids, max_tokens, seed, labels, images)
        finally:
            _ROLLOUT.reset(token)

    def task_of(self, prompt: str) -> TaskInstance:
        return task_in(self.tasks, prompt)

    def plan(self, task: TaskInstance, rollout: str) -> Plan:
        """The plan of `rollout` on `task` (the same for the same seed, task and rollout)."""
        rng = random.Random(f"{self.seed}/{task.instance_id}/{rollout}")
        solves = rng.random() < self.quality  # drawn first: a rollout that solves at q also solves above q
        runs_tests = rng.random() < 0.25 + 0.7 * self.quality
        retry = rng.random() < self.quality
        flaw, patch = "", task.patch
        if not solves:
            options = {
                "mutated": mutations(task.patch),
                "partial": partials(task.patch),
                "deleted": [d] if (d := deletion(task.patch)) else [],
                "unchanged": [""],
            }
            kinds = [k for k in FLAWS if options[k]]
            flaw = rng.choices(kinds, [FLAWS[k] for k in kinds])[0]
            patch = rng.choice(options[flaw])
        target = (changed_files(task.patch) or ["."])[0]
        symbol = re.search(r"`[\w.]*?(\w+)[`(]", task.problem_statement)
        replies: list[str] = []
        if rng.random() < 0.4:
            replies.append(
                "Let me get my bearings in the repository first.\n"
                + tool_call(
                    "bash",
                    command=rng.choice(
                        [
                            "ls -R . | grep -v pyc | head -40",
                            "git ls-files",
                            "find . -name '*.py' -not -path './.git/*'",
                        ]
                    ),
                )
            )
        if symbol and rng.random() < 0.5:
            replies.append(
                f"Let me find where `{symbol[1]}` is defined.\n"
                + tool_call("bash", command=f"grep -rn '{symbol[1]}' --include='*.py' .")
            )
        replies.append(
            f"Let me read {target}.\n"
            + rng.choice(
                [
                    tool_call("bash", command=f"cat {target}"),
                    tool_call("bash", command=f"cat -n {target}"),
                    tool_call("editor", command="view", path=target),
                ]
            )
        )
        if patch:
            replies.append(
                f"I see the problem in {target}. Fixing it:\n"
                + tool_call("bash", command=apply_command(patch, rng.random() < 0.5))
            )
        tests = rng.choice(TEST_COMMANDS) if runs_tests else ""
        if tests:
            replies.append("Let me run the tests.\n" + tool_call("bash", command=tests))
        return Plan(flaw, replies, tests, retry)

    def reply(self, prompt: str, step: int) -> str:
        """The policy: the plan's replies, then a retry with the gold patch if the tests failed, then submit."""
        task = self.task_of(prompt)
        plan = self.plan(task, _ROLLOUT.get())
        done = len(plan.replies)
        if step < done:
            return plan.replies[step]
        # Only a retry goes on past `done` (a submission ends the rollout), so steps are told apart by index.
        passed = last_exit_code(prompt) == 0
        if step == done and plan.tests and not passed and plan.retry:
            command = "git reset -q --hard && git clean -fdq && " + apply_command(task.patch)
            return "The tests fail. Let me start again from a clean tree and fix it properly.\n" + tool_call(
                "bash", command=command
            )
        if step == done + 1:
            return "Let me run the tests again.\n" + tool_call("bash", command=plan.tests)
        if not plan.tests:
            return "That should do it. Submitting.\n" + tool_call("submit")
        if passed:
            return "The tests pass. Submitting.\n" + tool_call("submit")
        return "Some tests still fail, but I believe the issue is addressed. Submitting.\n" + tool_call("submit")


def task_in(tasks: Sequence[TaskInstance], prompt: str) -> TaskInstance:
    """The task whose problem statement is in the prompt's first user message."""
    first = prompt.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]
    for task in tasks:
        if task.problem_statement in first:
            return task
    raise ModelError(
        f"the scripted policy does not know the task in this prompt: build it from the task set "
        f"being run (it knows {len(tasks)} tasks, e.g. {tasks[0].instance_id})"
    )


def last_exit_code(prompt: str) -> int | None:
    """The exit code the last observation in the prompt reports (None when it reports none)."""
    last = prompt.rsplit("<|im_start|>", 2)[-2] if prompt.count("<|im_start|>") >= 2 else ""
    found = re.search(r"\[exit code (-?\d+)\]\s*<\|im_end\|>", last)
    return int(found[1]) if found else None


Edit = tuple[str, str, str]
"""One editor str_replace: (path, old_str, new_str)."""


def edits(task: TaskInstance) -> list[Edit]:
    """The gold patch of `task` as str_replace edits, one a hunk, each as short as it can be and still match once.

    A hunk's changed lines are kept with as little context as makes its old side unique in the file (read from the
    task's local `repo_dir`); without a local copy, or for a pure insertion, at least one context line is kept."""
    out: list[Edit] = []
    for header, hunks in split_patch(task.patch):
        path = next((line[6:] for line in header if line.startswith("+++ b/")), "")
        if not path:  # a deleted file: str_replace cannot express it
            raise InvalidArgument(f"task {task.instance_id}: the expert cannot delete files", field="patch")
        text = _base_text(task, path)
        for hunk in hunks:
            body = hunk[1:]
            changed = [n for n, line in enumerate(body) if line[:1] in "+-"]
            lo, hi = changed[0], changed[-1] + 1
            pure_insert = not any(line.startswith("-") for line in body)
            pad = 1 if pure_insert or text is None else 0
            while True:
                part = body[max(0, lo - pad) : hi + pad]
                old = "\n".join(line[1:] for line in part if line[:1] in " -")
                new = "\n".join(line[1:] for line in part if line[:1] in " +")
                grown = max(0, lo - pad) == 0 and hi + pad >= len(body)
                if grown or text is None or (old and text.count(old) == 1):
                    break
                pad += 1
            out.append((path, old, new))
    return out


def _base_text(task: TaskInstance, path: str) -> str | None:
    """The file at the task's base state, when the task has a local copy of its repository: at `base_commit` for a
    git repository (its work tree may hold another commit, a synthesized task's fixed one), else the file itself."""
    if task.repo_dir is None:
        return None
    if task.base_commit and is_git_repo(task.repo_dir):
        shown = subprocess.run(
            ["git", "-C", str(task.repo_dir), "show", f"{task.base_commit}:{path}"], capture_output=True, check=False
        )
        return shown.stdout.decode(errors="replace") if shown.returncode == 0 else None
    if not (task.repo_dir / path).is_file():
        return None
    return (task.repo_dir / path).read_text(errors="replace")


class ExpertModel(ScriptedModel):
    """The teacher for distillation: it writes each task's gold patch as the shortest trajectory that solves it, one
    editor str_replace a hunk and then submit, with no other words. Short, uniform trajectories are what a small
    student can learn from on a CPU in minutes; the observations and the grade are real (the real harness and
    sandbox run every call)."""

    def __init__(self, tasks: Sequence[TaskInstance]) -> None:
        super().__init__(self.reply, name="expert")
        self.tasks = list(tasks)
        self._edits = {t.instance_id: edits(t) for t in self.tasks if t.patch}

    def reply(self, prompt: str, step: int) -> str:
        task = task_in(self.tasks, prompt)
        todo = self._edits.get(task.instance_id, [])
        if step < len(todo):
            path, old, new = todo[step]
            return tool_call("editor", command="str_replace", path=path, old_str=old, new_str=new)
        return tool_call("submit")
