"""Test-log parsing as SWE-bench grades pytest output (`pytest -rA`): a map from test id to status.

It follows swebench's `parse_log_pytest_v2` (ANSI colour codes and control characters stripped; a line that
starts with a status word names a test; " - " starts a failure message; older pytest's "<id> STATUS" lines),
with one deliberate difference: swebench cuts the id at the first whitespace, so a parametrized id with a
space ("tests/t.py::test_x[a b-2]") was misgraded as missing. Here the id runs to the closing bracket.
"""

from __future__ import annotations

import re

STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
"""pytest's short-summary status words (swebench's TestStatus values)."""
PASSING = frozenset({"PASSED", "XFAIL"})
"""Statuses that count as a pass (swebench's `test_passed`)."""

_ANSI = re.compile(r"\[(\d+)m")
_CONTROL = str.maketrans("", "", "".join(chr(c) for c in range(1, 32)))


def parse_log_pytest_v2(log: str) -> dict[str, str]:
    """Map each test id in a `pytest -rA` log to its status word (the last line naming it wins)."""
    statuses: dict[str, str] = {}
    for raw in log.split("\n"):
        line = _ANSI.sub("", raw).translate(_CONTROL)
        status = next((s for s in STATUSES if line.startswith(s) and line[len(s) : len(s) + 1] in (" ", "")), None)
        if status is not None:
            test_id = _leading_id(line[len(status) :].strip())
            if test_id:
                statuses[test_id] = status
            continue
        # Older pytest (and -v) lines: "<id> STATUS".
        status = next((s for s in STATUSES if line.endswith(" " + s)), None)
        if status is not None:
            test_id = line[: -len(status)].strip()
            if test_id and not test_id.startswith(("=", "_")):
                statuses[test_id] = status
    return statuses


def _leading_id(rest: str) -> str:
    """The test id at the start of a summary line's remainder, without the " - message" that may follow."""
    head, _, _ = rest.partition(" ")
    bracket = head.find("[")
    if bracket < 0 or head.endswith("]"):
        return head
    # A parametrized id with spaces: it ends at the first "]" that closes the line or precedes " - ".
    for match in re.finditer(r"\](?= - |$)", rest):
        return rest[: match.end()]
    return head


def passed(test_id: str, statuses: dict[str, str]) -> bool:
    """True when the log shows the test passed (or failed as expected)."""
    return statuses.get(test_id) in PASSING
