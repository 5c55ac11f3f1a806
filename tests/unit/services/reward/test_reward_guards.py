"""The judge's test-evidence guards (docs/training.md §2.5 [I]): the test-execution detector, the citation parser, the clamp of
R2/R4/R6 and the cap of J, with exact numbers, and how the judge reports them. The judge model is a scripted fake
(tests/unit/services/reward/scripted_models.py), since no real model runs in unit tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from scripted_models import ScriptedModels

from orchard.chat.render import RenderedStep
from orchard.services.reward.guards import apply_guards, cited_steps, runs_test, steps_with_tests
from orchard.services.reward.judge import Judge, JudgeInput, log_batch, system_prompt
from orchard.services.reward.rubric import BUNDLED_RUBRIC, Criterion, EvidencePolicy, build_rubric, load_rubric
from orchard.types.v1 import types_pb2 as tpb

RUBRIC = load_rubric(BUNDLED_RUBRIC)
POLICY = EvidencePolicy()
SCORES = {"R1": 0.8, "R2": 1.0, "R3": 0.5, "R4": 0.7, "R5": 0.6, "R6": 0.0, "R7": 0.9}
J = 0.15 * 0.8 + 0.18 * 1.0 + 0.12 * 0.5 + 0.15 * 0.7 + 0.14 * 0.6 + 0.14 * 0.9  # 0.675
J_CLAMPED = 0.15 * 0.8 + 0.18 * 0.5 + 0.12 * 0.5 + 0.15 * 0.5 + 0.14 * 0.6 + 0.14 * 0.9  # R2, R4 at 0.5: 0.555


@pytest.mark.parametrize(
    "command",
    [
        "pytest",
        "pytest -q tests/test_x.py::test_edge",
        "py.test",
        "python -m pytest -x",
        "python3.11 -m pytest",
        ".venv/bin/python -m pytest",
        "cd /repo && python -m pytest tests",
        "PYTHONPATH=. pytest",
        "timeout 60 pytest -q",
        "uv run pytest",
        'bash -c "pytest"',
        "(cd src; pytest)",
        "python -m unittest discover -s tests",
        "tox -e py311",
        "npm test",
        "yarn run test:unit",
        "npx jest",
        "go test ./...",
        "cargo test",
        "make test",
        "python manage.py test app",
        "run_tests",
        'run_tests({"path": "tests"})',
        "./run_tests.sh",
        "python reproduce_issue.py",
        "python3 -u /tmp/repro.py 2>&1 | tail -5",
        "python tests/runtests.py",
        "bash run_test.sh",
        "sh repro.sh",
        "./test.sh",
        "cat > /tmp/repro.py <<'EOF'\nimport m\nassert m.add(1, 2) == 3\nEOF\npython /tmp/repro.py",
    ],
)
def test_test_commands_are_detected(command: str) -> None:
    assert runs_test(command, POLICY)


@pytest.mark.parametrize(
    "command",
    [
        "cat tests/test_x.py",
        "sed -n 1,20p tests/test_x.py",
        "pip install pytest",
        "grep -rn pytest .",
        "echo pytest",
        "ls tests/",
        "find . -name '*test*'",
        "vim test.py",
        "python -c 'import m; print(m.add(1, 2))'",
        "cat > test_x.py <<EOF\npytest.main()\nEOF",
        "python setup.py build",
        "go build ./...",
        "cargo build",
        'str_replace_editor({"path": "tests/test_x.py"})',
        "echo COMPLETE_TASK_AND_SUBMIT",
        "",
    ],
)
def test_other_commands_are_not_tests(command: str) -> None:
    assert not runs_test(command, POLICY)


def test_a_rubric_can_name_its_own_test_commands(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "name: custom\ntest_evidence: {commands: ['check\\b'], no_test_cap: 0.2}\ncriteria:\n"
        "  - {id: A, name: A, weight: 1, description: a, needs_test_evidence: true}\n"
    )
    policy = load_rubric(path).test_evidence
    assert policy is not None and (policy.criterion_cap, policy.no_test_cap) == (0.5, 0.2)
    assert runs_test("CHECK --all", policy) and not runs_test("pytest", policy)


def step(i: int, command: str, code: int | None = 0, output: str = "") -> RenderedStep:
    return RenderedStep(i, "", command, code, output)


def test_steps_that_ran_tests_exclude_runners_the_shell_could_not_start() -> None:
    steps = [
        step(0, "cat a.py"),
        step(1, "pytest", 1, "1 failed"),
        step(2, "pytest", 127, "pytest: command not found"),
        step(3, "python -m pytest", 1, "/usr/bin/python: No module named pytest"),
        step(4, "cd t && ./test.sh", 0),
        step(5, "python repro.py", None),
    ]
    assert steps_with_tests(steps, POLICY) == [1, 4, 5]


@pytest.mark.parametrize(
    ("reasoning", "cited"),
    [
        ("Step 2 reproduces the bug; step 5 reruns it.", [2, 5]),
        ("Steps 2, 4, and 6 test it.", [2, 4, 6]),
        ("It ran tests in steps 3-5 (see step #9) and steps 10 to 11.", [3, 4, 5, 9, 10, 11]),
        ("Good tests (Step 4), again in step 4.", [4]),
        ("No citations; stepping back, 3 edits.", []),
        ("steps 1-100000", [1, 100000]),
    ],
)
def test_cited_steps(reasoning: str, cited: list[int]) -> None:
    assert cited_steps(reasoning) == cited


TESTED = [step(0, "cat m.py"), step(1, "python -m pytest -q", 1), step(2, "sed -i s/-/+/ m.py"), step(3, "pytest -q")]
UNTESTED = [step(0, "cat m.py"), step(1, "sed -i s/-/+/ m.py"), step(2, "python -c 'import m'")]
NO_TEST = "no step ran a test"


@pytest.mark.parametrize(
    ("steps", "reasoning", "j", "adjustments"),
    [
        # Tests ran and the judge cites one of them (or cites nothing): the scores stand.
        (TESTED, "Step 1 reproduces the bug and step 3 shows it fixed.", J, []),
        (TESTED, "Reproduced, fixed, verified.", J, []),
        # Tests ran, but the cited steps ran none: R2 and R4 (above 0.5) drop to 0.5; R6 (0.0) is left alone; no cap.
        (
            TESTED,
            "Step 0 reads the code and step 2 edits it.",
            J_CLAMPED,
            [
                "R2 capped at 0.5 (judge gave 1): the cited steps 0, 2 ran no test (tests ran in steps 1, 3)",
                "R4 capped at 0.5 (judge gave 0.7): the cited steps 0, 2 ran no test (tests ran in steps 1, 3)",
            ],
        ),
        # No step ran a test: the clamp, then J (0.555) capped at 0.3.
        (
            UNTESTED,
            "Step 2 checks the fix.",
            0.3,
            [
                "R2 capped at 0.5 (judge gave 1): no step ran a test",
                "R4 capped at 0.5 (judge gave 0.7): no step ran a test",
                "J capped at 0.3 (was 0.555): no step ran a test",
            ],
        ),
    ],
)
def test_clamp_and_cap(steps: list[RenderedStep], reasoning: str, j: float, adjustments: list[str]) -> None:
    guarded = apply_guards(SCORES, RUBRIC, steps, reasoning)
    assert guarded.judge_score == pytest.approx(j) and [note for _, note in guarded.adjustments] == adjustments
    clamped = {cid for cid, _ in guarded.adjustments} - {"J"}
    assert guarded.scores == {k: 0.5 if k in clamped else v for k, v in SCORES.items()}
    assert guarded.ran_tests == (steps is TESTED)


def test_scores_at_the_caps_stand() -> None:
    """A criterion at 0.5 is not above the criterion cap, and a J of exactly 0.3 is not above the J cap."""
    at_criterion_cap = SCORES | {"R2": 0.5, "R4": 0.5}
    guarded = apply_guards(at_criterion_cap, RUBRIC, TESTED, "Step 2 edits it.")
    assert guarded.scores == at_criterion_cap and guarded.adjustments == []
    assert guarded.judge_score == pytest.approx(J_CLAMPED)
    at_j_cap = dict.fromkeys(SCORES, 0.3)
    guarded = apply_guards(at_j_cap, RUBRIC, UNTESTED, "")
    assert guarded.judge_score == 0.3 and guarded.adjustments == [] and guarded.ran_tests is False


def test_a_rubric_without_guards_is_not_checked() -> None:
    plain = build_rubric("request", [Criterion(c.id, c.name, c.weight, c.description) for c in RUBRIC.criteria])
    guarded = apply_guards(SCORES, plain, UNTESTED, "")
    assert plain.test_evidence is None and guarded.scores == SCORES and guarded.judge_score == pytest.approx(J)
    assert guarded.adjustments == [] and guarded.ran_tests is None
    assert "need a test that actually ran" not in system_prompt(plain)
    assert "Scores above 0.5 for R2, R4, R6 need a test that actually ran" in system_prompt(RUBRIC)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_judge_reports_the_guards_and_records_metrics(caplog: pytest.LogCaptureFixture) -> None:
    traj = tpb.Trajectory(
        trajectory_id="t-untested",
        final_patch="diff --git a/m.py b/m.py\n",
        steps=[
            tpb.Step(
                index=0,
                model_output=tpb.Message(content="look"),
                actions=[tpb.ToolCall(name="bash", arguments='{"command": "cat m.py"}')],
                observations=[tpb.Observation(message=tpb.Message(content="def add(a, b): ..."), exit_code=0)],
            )
        ],
    )
    out = tpb.Reward(
        kind=tpb.REWARD_KIND_OUTCOME, value=1.0, outcome=tpb.OutcomeDetails(status=tpb.OUTCOME_STATUS_RESOLVED)
    )
    models = ScriptedModels(chat_reply=json.dumps({"reasoning": "Step 0 reads it; thorough tests.", "scores": SCORES}))
    before = {
        (n, c): sample(n, rubric="swe", criterion=c)
        for n in ("orchard_reward_judge_score_count", "orchard_reward_judge_guard_adjustments_total")
        for c in ("R2", "J")
    }
    untested_before = sample("orchard_reward_judged_trajectories_total", rubric="swe", ran_tests="false")
    item = JudgeInput(
        trajectory=traj,
        problem_statement="Fix add().",
        outcome=out,
        reference=None,
        rubric=RUBRIC,
        model="",
        alpha=0.5,
        temperature=0.6,
        max_tokens=1024,
    )
    reward = await Judge(models, 1, 10).judge(item)
    d = reward.judge
    assert not d.fell_back and d.judge_score == 0.3 and reward.value == pytest.approx(1.0 + 0.5 * 0.3)
    assert [(s.criterion_id, s.score, s.raw_score) for s in d.scores if s.criterion_id in ("R2", "R4")] == [
        ("R2", 0.5, 1.0),
        ("R4", 0.5, 0.7),
    ]
    assert list(d.adjustments) == [
        "R2 capped at 0.5 (judge gave 1): no step ran a test",
        "R4 capped at 0.5 (judge gave 0.7): no step ran a test",
        "J capped at 0.3 (was 0.555): no step ran a test",
    ]
    for (name, criterion), value in before.items():
        assert sample(name, rubric="swe", criterion=criterion) == value + 1
    assert sample("orchard_reward_judged_trajectories_total", rubric="swe", ran_tests="false") == untested_before + 1
    with caplog.at_level("INFO", logger="orchard.reward.judge"):
        log_batch([reward, tpb.Reward(judge=tpb.JudgeDetails(fell_back=True))])
    assert caplog.messages == [
        (
            "judged a batch of 2 (1 fell back): mean J 0.300; means R1=0.80 R2=0.50 R3=0.50 "
            "R4=0.50 R5=0.60 R6=0.00 R7=0.90; guards adjusted 1"
        )
    ]
