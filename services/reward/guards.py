"""Test-evidence guards of the RPR judge (docs/training.md §2.5 [I]): find the steps that ran a test, clamp the criteria that
need test evidence when none backs them, and cap J when no step ran a test at all. Cheap checks in code against a
judge that rewards testing it only imagined."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchard.chat.render import RenderedStep
from orchard.services.reward.rubric import EvidencePolicy, Rubric, aggregate

# A step's command splits into simple commands at newlines, `&&`, `||`, `;` and `|`.
_SEPARATOR = re.compile(r"\s*(?:&&|\|\||;|\||\n)\s*")
# Wrappers before the command that runs: a subshell or group, VAR=value, env/time/nohup/sudo/exec, `timeout 60`,
# `bash -c "`, `uv run` / `poetry run` and the like.
_PREFIX = re.compile(
    r"""^(?:
      [({!]\s*
    | [A-Za-z_]\w*=(?:"[^"]*"|'[^']*'|\S*)\s+
    | (?:env|time|nohup|sudo|exec|command)\s+
    | timeout\s+(?:-\S+\s+)*\d\S*\s+
    | (?:bash|sh|zsh)\s+-\w*c\s+["']?
    | (?:uv|poetry|pdm|hatch|pipenv|rye)\s+run\s+
    | conda\s+run\s+(?:-\S+\s+\S+\s+)*
)+""",
    re.VERBOSE,
)
SHELL_NOT_RUN_CODES = (126, 127)
"""Exit codes with which the shell says a command could not be executed or was not found: no test ran."""
_NOT_RUN_OUTPUT = re.compile(r"No module named '?(?:pytest|nose2?|tox)\b")
"""Output that says a test runner never started (the masked import error the rubric's R7 warns about)."""
_CITATION = re.compile(r"\bsteps?\s*#?\s*(\d+(?:(?:\s*(?:,|-|–|to|and|or|&|/))+\s*#?\s*\d+)*)", re.IGNORECASE)
_CITED_NUMBER = re.compile(r"(\d+)(?:\s*(?:-|–|to)\s*#?\s*(\d+))?")
MAX_CITED_RANGE = 1000
"""A cited range ("steps 3-9") longer than this is read as its two ends only."""


def runs_test(command: str, policy: EvidencePolicy) -> bool:
    """Whether a step's command runs a test: one of its simple commands, wrappers stripped, starts with a match."""
    for part in _SEPARATOR.split(command):
        part = _PREFIX.sub("", part.strip())
        if part and any(p.match(part) for p in policy.commands):
            return True
    return False


def steps_with_tests(steps: Sequence[RenderedStep], policy: EvidencePolicy) -> list[int]:
    """The indices of the steps that ran a test: a test command whose shell did not report it missing."""
    return [
        s.index
        for s in steps
        if runs_test(s.command, policy)
        and s.exit_code not in SHELL_NOT_RUN_CODES
        and not _NOT_RUN_OUTPUT.search(s.output)
    ]


def cited_steps(reasoning: str) -> list[int]:
    """The step indices the judge's reasoning cites ("step 3", "steps 2, 4 and 6", "steps 5-7"), in order."""
    cited: list[int] = []
    for group in _CITATION.finditer(reasoning):
        for number in _CITED_NUMBER.finditer(group.group(1)):
            first = int(number.group(1))
            last = int(number.group(2)) if number.group(2) else first
            if first <= last <= first + MAX_CITED_RANGE:
                cited += range(first, last + 1)
            else:
                cited += (first, last)
    return list(dict.fromkeys(cited))


@dataclass(frozen=True)
class Guarded:
    """Scores and J after the guards, and what the guards changed (empty when nothing)."""

    scores: dict[str, float]
    judge_score: float
    adjustments: list[tuple[str, str]]
    """(criterion id, or J for the cap; what the guard did and why, person-readable), in the order applied."""
    ran_tests: bool | None
    """Whether any step ran a test; None for an unguarded rubric (nothing was checked)."""


def _steps(indices: Sequence[int]) -> str:
    return ("step " if len(indices) == 1 else "steps ") + ", ".join(map(str, indices))


def apply_guards(scores: dict[str, float], rubric: Rubric, steps: Sequence[RenderedStep], reasoning: str) -> Guarded:
    """The rubric's guards over snapped scores:
    1. a criterion that needs test evidence and scores above `criterion_cap` is clamped to it when no step ran a
       test, or when the reasoning cites steps and none of them ran one;
    2. J, the weighted mean of the clamped scores, is capped at `no_test_cap` when no step ran a test."""
    policy = rubric.test_evidence
    if policy is None:
        return Guarded(dict(scores), aggregate(scores, rubric), [], None)
    tested = steps_with_tests(steps, policy)
    cited = cited_steps(reasoning)
    if not tested:
        why = "no step ran a test"
    elif cited and not set(cited) & set(tested):
        why = f"the cited {_steps(cited)} ran no test (tests ran in {_steps(tested)})"
    else:
        why = ""
    out: dict[str, float] = dict(scores)
    adjustments: list[tuple[str, str]] = []
    if why:
        for cid in rubric.evidence_ids:
            if out[cid] > policy.criterion_cap:
                note = f"{cid} capped at {policy.criterion_cap:g} (judge gave {out[cid]:g}): {why}"
                adjustments.append((cid, note))
                out[cid] = policy.criterion_cap
    j = aggregate(out, rubric)
    if not tested and j > policy.no_test_cap:
        adjustments.append(("J", f"J capped at {policy.no_test_cap:g} (was {j:g}): no step ran a test"))
        j = policy.no_test_cap
    return Guarded(out, j, adjustments, bool(tested))
