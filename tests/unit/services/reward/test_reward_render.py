"""Rendering trajectories for the judge: the compact observation rules, step extraction and patch file lists."""

from __future__ import annotations

import json

import pytest

from orchard.chat.render import (
    OBSERVATION_CHARS,
    Reference,
    RenderedStep,
    clip,
    compact_observation,
    patch_files,
    render_trajectory,
    steps_of,
)
from orchard.types.v1 import types_pb2 as tpb

PYTEST_FAIL = "\n".join(
    [
        "============================= test session starts ==============================",
        "collected 3 items",
        "",
        *[f"tests/test_x.py::test_{i} noise line {i} " + "x" * 60 for i in range(40)],
        "FAILED tests/test_x.py::test_edge - AssertionError: assert 2 == 3",
        "========================= 1 failed, 2 passed in 0.12s ==========================",
    ]
)


def test_clip_keeps_head_and_tail() -> None:
    text = "H" * 500 + "M" * 1000 + "T" * 500
    out = clip(text, 600)
    assert out.startswith("H" * 400) and out.endswith("T" * 200) and "[... 1400 chars omitted ...]" in out
    assert clip("short", 600) == "short"


def test_failed_run_keeps_800_chars_and_its_summary_lines() -> None:
    out = compact_observation(PYTEST_FAIL, 1)
    assert "FAILED tests/test_x.py::test_edge - AssertionError: assert 2 == 3" in out
    assert "1 failed, 2 passed in 0.12s" in out and "collected 3 items" in out
    assert "chars omitted" in out and len(out) <= OBSERVATION_CHARS + 60


def test_large_successful_dump_collapses_to_a_size_marker() -> None:
    dump = "\n".join(f"line {i}: " + "y" * 80 for i in range(500))
    out = compact_observation(dump, 0)
    assert out == f"[output collapsed: 500 lines, {len(dump)} chars]"
    with_summary = dump + "\n===== 12 passed in 0.50s ====="
    assert compact_observation(with_summary, 0).endswith("[summary lines]\n===== 12 passed in 0.50s =====")


def test_small_outputs_stay_whole_and_masked_import_errors_are_kept() -> None:
    assert compact_observation("ok\n", 0) == "ok"
    out = compact_observation("x" * 3000 + "\n/usr/bin/python: No module named pytest\n" + "z" * 3000, 1)
    assert "No module named pytest" in out


def _step(i: int, command: str, output: str, code: int | None, reasoning: str = "") -> tpb.Step:
    obs = tpb.Observation(message=tpb.Message(role=tpb.ROLE_TOOL, content=output))
    if code is not None:
        obs.exit_code = code
    return tpb.Step(
        index=i,
        model_output=tpb.Message(role=tpb.ROLE_ASSISTANT, content=reasoning),
        actions=[tpb.ToolCall(name="bash", arguments=json.dumps({"command": command}))],
        action_status=tpb.ACTION_STATUS_OK,
        observations=[obs],
    )


def test_structured_steps() -> None:
    traj = tpb.Trajectory(steps=[_step(0, "cat a.py", "print(1)", 0, "look first"), _step(1, "pytest", "E assert", 1)])
    traj.steps.add(
        index=2,
        model_output=tpb.Message(content="oops"),
        action_status=tpb.ACTION_STATUS_PARSE_ERROR,
        action_error="no action found",
    )
    assert steps_of(traj) == [
        RenderedStep(0, "look first", "cat a.py", 0, "print(1)"),
        RenderedStep(1, "", "pytest", 1, "E assert"),
        RenderedStep(2, "oops", "[ACTION_STATUS_PARSE_ERROR: no action found]", None, ""),
    ]


def test_message_only_trajectory_parses_returncode() -> None:
    """mini-swe-agent style: assistant/user pairs, the command in a bash block, the return code in a tag."""
    traj = tpb.Trajectory(
        messages=[
            tpb.Message(role=tpb.ROLE_SYSTEM, content="You are an agent."),
            tpb.Message(role=tpb.ROLE_USER, content="Fix the bug in chunks()."),
            tpb.Message(role=tpb.ROLE_ASSISTANT, content="THOUGHT: run tests\n\n```bash\npython -m pytest -q\n```"),
            tpb.Message(role=tpb.ROLE_USER, content="<returncode>1</returncode>\n<output>\n1 failed\n</output>"),
            tpb.Message(role=tpb.ROLE_ASSISTANT, content="Submit.\n```bash\necho COMPLETE_TASK_AND_SUBMIT\n```"),
        ]
    )
    steps = steps_of(traj)
    assert [(s.index, s.reasoning, s.command, s.exit_code) for s in steps] == [
        (0, "THOUGHT: run tests", "python -m pytest -q", 1),
        (1, "Submit.", "echo COMPLETE_TASK_AND_SUBMIT", None),
    ]


@pytest.mark.parametrize(
    ("patch", "files"),
    [
        ("diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\n-a\n+b\n", ["src/x.py"]),
        (
            "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n",
            ["old.py", "new.py"],
        ),
        (
            "diff --git a/t/new.py b/t/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/t/new.py\n@@ -0,0 +1 @@\n+x\n",
            ["t/new.py"],
        ),
        ("diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n--- a/gone.py\n+++ /dev/null\n", ["gone.py"]),
        ("--- a/plain.py\t2020-01-01\n+++ b/plain.py\t2020-01-02\n@@ -1 +1 @@\n-a\n+b\n", ["plain.py"]),
        ("", []),
    ],
)
def test_patch_files(patch: str, files: list[str]) -> None:
    assert patch_files(patch) == files


def test_render_caps_each_part_and_shows_the_reference() -> None:
    steps = [RenderedStep(0, "r" * 2000, "c" * 1000, 0, "ok")]
    text = render_trajectory(
        "T" * 9000,
        steps,
        "diff --git a/x.py b/x.py\n" + "+" * 9000,
        Reference("GOLD" * 2000, ["x.py"], ["tests/test_x.py"], ["tests/test_x.py::t"]),
    )
    task, ref, traj, patch = text.split("\n\n## ")
    assert len(task) < 4000 + 80 and "chars omitted" in task
    assert "do not grade whether the edit matches it" in ref and "FAIL_TO_PASS tests: tests/test_x.py::t" in ref
    assert len(ref) < 3000 + 400
    assert "Reasoning: " + "r" * 400 in traj and len(traj) < 600 + 400 + 300
    assert patch.startswith("Final patch (files: x.py)") and len(patch) < 4000 + 100
    assert "(none submitted)" in render_trajectory("t", [], "", None)
