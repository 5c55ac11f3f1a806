"""The pytest log parser SWE-bench grading uses (`parse_log_pytest_v2` semantics, ids with spaces kept whole)."""

from __future__ import annotations

import pytest

from orchard.tasks.logparse import parse_log_pytest_v2, passed

LOG = """\
============================= test session starts ==============================
collected 7 items

tests/test_words_hidden.py ...F.                                        [100%]
=================================== FAILURES ===================================
=========================== short test summary info ============================
PASSED tests/test_words.py::test_two_words
PASSED tests/test_words_hidden.py::test_word_count[hello world-2]
PASSED tests/test_words_hidden.py::test_word_count[  padded  -1]
PASSED tests/test_words_hidden.py::test_word_count[-0]
FAILED tests/test_words_hidden.py::test_word_count[a  b-2] - assert 3 == 2
FAILED tests/test_x.py::test_plain - AssertionError: boom - with dashes
ERROR tests/test_x.py::test_fixture - RuntimeError: setup [1] failed
XFAIL tests/test_x.py::test_expected - known bug
SKIPPED [1] tests/test_x.py:12: not on this platform
========================= 2 failed, 4 passed in 0.05s =========================
"""


def test_parses_summary_lines_with_spaces_in_parametrized_ids() -> None:
    statuses = parse_log_pytest_v2(LOG)
    assert statuses["tests/test_words_hidden.py::test_word_count[hello world-2]"] == "PASSED"
    assert statuses["tests/test_words_hidden.py::test_word_count[  padded  -1]"] == "PASSED"
    assert statuses["tests/test_words_hidden.py::test_word_count[-0]"] == "PASSED"
    assert statuses["tests/test_words_hidden.py::test_word_count[a  b-2]"] == "FAILED"
    assert statuses["tests/test_x.py::test_plain"] == "FAILED"
    assert statuses["tests/test_x.py::test_fixture"] == "ERROR"
    assert statuses["tests/test_x.py::test_expected"] == "XFAIL"
    assert statuses["tests/test_words.py::test_two_words"] == "PASSED"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("\x1b[32mPASSED\x1b[0m tests/t.py::test_a", {"tests/t.py::test_a": "PASSED"}),  # colour codes
        ("tests/t.py::test_b PASSED", {"tests/t.py::test_b": "PASSED"}),  # older pytest / -v
        ("tests/t.py::test_c[x y] FAILED", {"tests/t.py::test_c[x y]": "FAILED"}),
        ("ERROR: usage: pytest [options]", {}),  # pytest's own usage error is no test
        ("PASSED", {}),
        ("FAILED tests/t.py::test_d[a] - b] - msg", {"tests/t.py::test_d[a]": "FAILED"}),
    ],
)
def test_line_forms(line: str, expected: dict[str, str]) -> None:
    assert parse_log_pytest_v2(line) == expected


def test_passed_counts_xfail_and_not_missing() -> None:
    statuses = {"a": "PASSED", "b": "XFAIL", "c": "FAILED", "d": "XPASS"}
    assert [passed(t, statuses) for t in ("a", "b", "c", "d", "missing")] == [True, True, False, False, False]
