"""Loading SWE-bench task instances (JSON, JSON lines, the bundled ToyRepair set) and their validation errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchard.errors import InvalidArgument, NotFound
from orchard.tasks import BUNDLED, load_instances
from orchard.tasks.grading import evaluate_log, patched_files
from orchard.tasks.repo import repo_files

RECORD = {
    "instance_id": "a__b-1",
    "repo": "a/b",
    "base_commit": "abc",
    "problem_statement": "It breaks.",
    "patch": "",
    "test_patch": "",
    "FAIL_TO_PASS": ["t.py::test_x"],
    "PASS_TO_PASS": [],
    "extra": 1,
}


def test_bundled_toyrepair_is_complete() -> None:
    quick, extended = load_instances("toyrepair"), load_instances("toyrepair-extended")
    assert 6 <= len(quick) <= 10 and len(extended) == len(quick) + 16
    assert extended[: len(quick)] == quick  # the extended set is the quick one and 16 more
    assert any(t.instance_id.startswith("toyrepair-trivial-") for t in quick)
    # The reference policy finds a task by its problem statement in the prompt: none may hold another.
    statements = [t.problem_statement for t in extended]
    assert not [(a, b) for a in statements for b in statements if a is not b and a in b]
    for task in extended:
        assert task.patch.startswith("diff --git") and task.test_patch.startswith("diff --git")
        assert task.fail_to_pass and task.pass_to_pass and len(task.base_commit) == 40
        assert task.repo_dir is not None and task.repo_dir.is_dir() and repo_files(task.repo_dir)
        # The hidden tests live only in the test patch, never in the repository the agent sees.
        hidden = [f for f in patched_files(task.test_patch)]
        assert hidden and not any((task.repo_dir / f).exists() for f in hidden)
        assert set(task.test_files) <= {
            *hidden,
            *(str(p.relative_to(task.repo_dir)) for p in repo_files(task.repo_dir)),
        }


def test_json_and_jsonl_and_string_lists(tmp_path: Path) -> None:
    swebench_style = {**RECORD, "FAIL_TO_PASS": json.dumps(["t.py::test_x"]), "PASS_TO_PASS": "[]", "repo_dir": "repo"}
    (tmp_path / "a.json").write_text(json.dumps([swebench_style]))
    (tmp_path / "b.jsonl").write_text(json.dumps(RECORD) + "\n\n" + json.dumps({**RECORD, "instance_id": "c"}) + "\n")
    [a] = load_instances(tmp_path / "a.json")
    assert a.fail_to_pass == ["t.py::test_x"] and a.pass_to_pass == [] and a.repo_dir == tmp_path / "repo"
    assert [i.instance_id for i in load_instances(tmp_path / "b.jsonl", ids=["c"])] == ["c"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            json.dumps({k: v for k, v in RECORD.items() if k != "problem_statement"}),
            "line 1: not a valid task instance (problem_statement: Field required)",
        ),
        (json.dumps(RECORD) + "\n{oops", "b.jsonl:2: not valid JSON"),
        (json.dumps({**RECORD, "FAIL_TO_PASS": []}), "FAIL_TO_PASS"),
        (json.dumps(RECORD) + "\n" + json.dumps(RECORD), "instance id 'a__b-1' appears twice"),
    ],
)
def test_errors_name_the_line_and_field(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "b.jsonl").write_text(content)
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_instances(tmp_path / "b.jsonl")


def test_a_bundled_set_of_several_files_checks_ids_across_them(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps(RECORD) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({**RECORD, "instance_id": "c"}) + "\n")
    monkeypatch.setitem(BUNDLED, "two", (tmp_path / "a.jsonl", tmp_path / "b.jsonl"))
    assert [i.instance_id for i in load_instances("two")] == ["a__b-1", "c"]
    assert [i.instance_id for i in load_instances("two", ids=["c"])] == ["c"]
    (tmp_path / "b.jsonl").write_text(json.dumps(RECORD) + "\n")
    with pytest.raises(InvalidArgument, match="a.jsonl \\+ .*b.jsonl: instance id 'a__b-1' appears twice"):
        load_instances("two")


def test_unknown_source_and_ids() -> None:
    with pytest.raises(NotFound, match="neither a file nor a bundled task set"):
        load_instances("no-such-set")
    with pytest.raises(NotFound, match="has no instances"):
        load_instances("toyrepair", ids=["nope"])
    assert "toyrepair" in BUNDLED


def test_evaluate_log_needs_every_listed_test() -> None:
    [task] = load_instances("toyrepair", ids=["toyrepair-word-count-split"])
    all_pass = "\n".join(f"PASSED {t}" for t in task.fail_to_pass + task.pass_to_pass)
    assert evaluate_log(task, all_pass)[0] is True
    one_missing = "\n".join(f"PASSED {t}" for t in task.fail_to_pass[1:] + task.pass_to_pass)
    resolved, f2p, p2p, _ = evaluate_log(task, one_missing)
    assert not resolved and f2p["failure"] == task.fail_to_pass[:1] and not p2p["failure"]
    p2p_broken = all_pass.replace(f"PASSED {task.pass_to_pass[0]}", f"FAILED {task.pass_to_pass[0]} - x")
    assert evaluate_log(task, p2p_broken)[0] is False
