"""Rubrics as YAML: the bundled seven-criterion SWE rubric, and clear errors for malformed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchard.runtime import load_settings
from orchard.runtime.settings import SettingsError
from orchard.services.reward.rubric import BUNDLED_RUBRIC, DEFAULT_TEST_COMMANDS, RubricError, load_rubric
from orchard.services.reward.settings import RewardSettings

GOOD = """name: two
criteria:
  - {id: A, name: First, weight: 0.25, description: the first}
  - {id: B, name: Second, weight: 0.75, description: the second}
"""


def test_bundled_rubric_is_the_seven_criteria_of_the_recipe() -> None:
    rubric = load_rubric(BUNDLED_RUBRIC)
    assert [(c.id, c.name, c.weight) for c in rubric.criteria] == [
        ("R1", "Fix quality", 0.15),
        ("R2", "Self-test relevance", 0.18),
        ("R3", "Coverage", 0.12),
        ("R4", "Rigor", 0.15),
        ("R5", "Discriminativeness", 0.14),
        ("R6", "Regression guard", 0.12),
        ("R7", "Verification integrity", 0.14),
    ]
    assert sum(c.weight for c in rubric.criteria) == pytest.approx(1.0)
    assert all(c.description and "\n" not in c.description for c in rubric.criteria)


def test_bundled_rubric_guards_r2_r4_r6() -> None:
    rubric = load_rubric(BUNDLED_RUBRIC)
    policy = rubric.test_evidence
    assert rubric.evidence_ids == ["R2", "R4", "R6"] and policy is not None
    assert (policy.criterion_cap, policy.no_test_cap) == (0.5, 0.3)
    assert [p.pattern for p in policy.commands] == list(DEFAULT_TEST_COMMANDS)


def test_guards_are_opt_in(tmp_path: Path) -> None:
    """No marks and no test_evidence: unguarded. A marked criterion alone turns the guards on with defaults."""
    path = tmp_path / "r.yaml"
    path.write_text(GOOD)
    assert load_rubric(path).test_evidence is None
    path.write_text(GOOD.replace("description: the second}", "description: the second, needs_test_evidence: true}"))
    rubric = load_rubric(path)
    assert rubric.evidence_ids == ["B"] and rubric.test_evidence is not None
    assert rubric.test_evidence.no_test_cap == 0.3


def test_custom_rubric_loads(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(GOOD)
    rubric = load_rubric(path)
    assert rubric.name == "two" and rubric.ids == ["A", "B"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("0.75", "0.5"), "the weights sum to 0.75, not 1 (A=0.25, B=0.5)"),
        (GOOD.replace("id: B", "id: a"), "criteria[1] (a): id 'a' is used twice"),
        (GOOD.replace("name: Second, ", ""), "criteria[1] lacks ['name']"),
        (GOOD.replace("weight: 0.25,", "weight: 0.25, colour: red,"), "criteria[0] has unknown keys ['colour']"),
        (GOOD.replace("0.25", "'a quarter'"), "criteria[0] (A): weight must be a number; got 'a quarter'"),
        (GOOD.replace("0.25", "-0.25").replace("0.75", "1.25"), "criteria[0] (A): weight must be positive"),
        (GOOD.replace("description: the first", "description: ' '"), "criteria[0] (A): description is empty"),
        (GOOD.replace("id: A", "id: 'no spaces'"), "id 'no spaces' must be a short identifier"),
        ("criteria: []", "the rubric has no criteria"),
        ("- just a list", "expected a mapping with 'criteria'; got list"),
        ("criteria: {A: 1}", "'criteria' must be a list"),
        ("criteria: [", "not valid YAML"),
        (GOOD + "test_evidence: [pytest]\n", "test_evidence must be a mapping (commands, criterion_cap, no_test_cap)"),
        (GOOD + "test_evidence: {colour: red}\n", "test_evidence has unknown keys ['colour']"),
        (GOOD + "test_evidence: {no_test_cap: 2}\n", "test_evidence.no_test_cap must be a number in [0, 1]; got 2"),
        (GOOD + "test_evidence: {criterion_cap: yes}\n", "test_evidence.criterion_cap must be a number in [0, 1]"),
        (GOOD + "test_evidence: {commands: []}\n", "test_evidence.commands must be a non-empty list"),
        (GOOD + "test_evidence: {commands: ['pytest', '(']}\n", "test_evidence.commands[1] '(' is not a valid regex"),
        (
            GOOD.replace("description: the first}", "description: the first, needs_test_evidence: 'yes'}"),
            "criteria[0] (A): needs_test_evidence must be true or false; got 'yes'",
        ),
    ],
)
def test_malformed_rubrics_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RubricError, match=None) as caught:
        load_rubric(path)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_missing_rubric_file(tmp_path: Path) -> None:
    with pytest.raises(RubricError, match="cannot read rubric file"):
        load_rubric(tmp_path / "nope.yaml")


def test_settings_reject_a_bad_rubric_at_start_up(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("0.75", "0.5"))
    with pytest.raises(SettingsError, match=r"rubric_file \(env ORCHARD_REWARD_RUBRIC_FILE.*weights sum to 0.75"):
        load_settings(RewardSettings, ["--rubric-file", str(path)])
    assert load_settings(RewardSettings, []).port == 50053
