"""Problem statements for synthesized tasks, written from what the failing tests report: their names and their
assertion output, never the diff or a line the bug changed (nor a line that quotes the library's source)."""

from __future__ import annotations

import re
from typing import Any

from orchard.tasks.factory.ask import ask

MAX_TESTS = 8
MAX_ERROR_LINES = 12
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}")  # object reprs: `<function f at 0x7f...>` differs run to run
_SECTION = re.compile(r"^_{3,} (.+?) _{3,}$")
_SPACE = re.compile(r"\s+")
_KEYWORD = re.compile(r"^(return|yield|if|elif|while|for|assert|raise|del|not)\b\s*")
MIN_QUOTE = 5
"""Shorter code (`x`, `n+1`) is checked by the whole line only: the tests' own words would match it by chance."""


def failure_lines(log: str, tests: list[str]) -> list[str]:
    """The `E   ...` lines pytest printed for the failing tests (the first few), addresses masked."""
    wanted = {t.split("::")[-1] for t in tests}
    lines: list[str] = []
    current = ""
    for raw in log.splitlines():
        if (section := _SECTION.match(raw.strip())) is not None:
            current = section.group(1).split(".")[-1].split("::")[-1]
            continue
        if current and raw.startswith("E ") and (current in wanted or current.split("[")[0] in wanted):
            line = _ADDRESS.sub("0x...", raw[1:].strip())
            if line and line not in lines:
                lines.append(line)
    return lines


def leaks(text: str, changed: tuple[str, ...]) -> bool:
    """Whether `text` quotes a changed line (either side of the diff), or its expression without the statement's
    keyword (`return x[n - 1]` quoted as `x[n - 1]`), spaces ignored."""
    flat = _SPACE.sub("", text)
    for line in changed:
        code = line.split("#", 1)[0].strip()
        core = _KEYWORD.sub("", code).rstrip(":")
        if any(len(part) >= MIN_QUOTE and part in flat for part in (_SPACE.sub("", code), _SPACE.sub("", core))):
            return True
    return False


def template(repo: str, failing: list[str], log: str, changed: tuple[str, ...]) -> str:
    """The statement: what fails and how, in the tests' words; lines that quote the change are dropped."""
    files = sorted({t.split("::", 1)[0] for t in failing})
    errors = [line for line in failure_lines(log, failing) if not leaks(line, changed)][:MAX_ERROR_LINES]
    shown = failing[:MAX_TESTS]
    parts = [
        f"Something in `{repo}` is broken: {len(failing)} test{'s' if len(failing) != 1 else ''} in "
        f"{', '.join(f'`{f}`' for f in files)} fail{'s' if len(failing) == 1 else ''}.",
        "",
        "Failing tests:",
        *(f"- `{t}`" for t in shown),
        *([f"- ... and {len(failing) - len(shown)} more"] if len(failing) > len(shown) else []),
    ]
    if errors:
        parts += ["", "What they report:", "", "```", *errors, "```"]
    parts += ["", "The tests are right; fix the library so that they pass, without breaking the other tests."]
    statement = "\n".join(parts) + "\n"
    if leaks(statement, changed):  # a test's own name can quote the line; such a task is not made
        raise ValueError("the statement would quote a changed line")
    return statement


WRITER_SYSTEM = (
    "You write bug reports for a Python library, as a user who hit the bug would. Describe the wrong behaviour the "
    "failing tests show, in a few sentences. Do not suggest a fix and do not quote the library's source code."
)


class ModelWriter:
    """Statements written by a model through the inference service (`--writer model`). What it writes is checked
    like the template's: a text that quotes a changed line, or is too short to say anything, is not used (the
    template's statement stands, and the task records which writer made its text)."""

    MIN_CHARS = 40

    def __init__(self, inference: Any, *, seed: int = 0, max_tokens: int = 160, temperature: float = 0.7) -> None:
        self.inference = inference  # an orchard.clients transport to the inference service
        self.seed = seed
        self.max_tokens = max_tokens
        self.temperature = temperature

    async def write(self, repo: str, failing: list[str], log: str, changed: tuple[str, ...], index: int) -> str | None:
        errors = [line for line in failure_lines(log, failing) if not leaks(line, changed)][:MAX_ERROR_LINES]
        facts = "\n".join(
            [
                f"Library: {repo}",
                "Failing tests:",
                *(f"- {t}" for t in failing[:MAX_TESTS]),
                "What they report:",
                *errors,
            ]
        )
        choice = await ask(
            self.inference,
            WRITER_SYSTEM,
            f"{facts}\n\nWrite the bug report.",
            seed=self.seed,
            index=index,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            purpose="task-factory-statement",
            timeout_s=300,
        )
        text = choice.message.content.strip() if choice is not None else ""
        if len(text) < self.MIN_CHARS or leaks(text, changed):
            return None
        names = "\n".join(f"- `{t}`" for t in failing[:MAX_TESTS])
        return f"{text}\n\nFailing tests:\n{names}\n"
