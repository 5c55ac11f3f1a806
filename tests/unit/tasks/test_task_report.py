"""SWE-bench-style run reports and pass@k."""

from __future__ import annotations

import pytest

from orchard.tasks import GradeResult, format_table, make_report, pass_at_k
from orchard.types.v1 import types_pb2 as tpb


def result(instance_id: str, sample: int, resolved: bool, *, patch: bool = True, error: str = "") -> GradeResult:
    return GradeResult(
        instance_id=instance_id,
        patch_exists=patch,
        patch_applied=patch,
        resolved=resolved,
        error=error,
        sample_index=sample,
        duration_s=1.0,
    )


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"), [(5, 0, 1, 0.0), (5, 5, 1, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (3, 1, 3, 1.0)]
)
def test_pass_at_k(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_single_sample_report_has_swebench_fields() -> None:
    report = make_report(
        [result("a", 0, True), result("b", 0, False, patch=False), result("c", 0, False, error="boom")],
        ["a", "b", "c", "d"],
        run_id="r1",
        model="m",
    )
    assert report["total_instances"] == 4 and report["submitted_instances"] == 3
    assert report["completed_ids"] == ["a", "b"] and report["resolved_ids"] == ["a"]
    assert report["unresolved_ids"] == ["b"] and report["error_ids"] == ["c"]
    assert report["empty_patch_ids"] == ["b"] and report["incomplete_ids"] == ["d"]
    assert report["schema_version"] == 2 and report["instances"]["a"]["resolved"] is True  # type: ignore[index]
    assert report["pass@1"] == pytest.approx(1 / 3)


def test_k_samples_report_pass_at_k_per_task() -> None:
    results = [result("a", 0, True), result("a", 1, False), result("b", 0, False), result("b", 1, False)]
    report = make_report(results, ["a", "b"])
    assert report["samples_per_instance"] == 2 and report["resolved_ids"] == ["a#0"]
    assert report["pass@1"] == pytest.approx(0.25) and report["pass@2"] == pytest.approx(0.5)
    table = format_table(report)
    assert "pass@1 0.250  pass@2 0.500" in table and "a " in table


def test_reward_from_grade() -> None:
    graded = GradeResult(
        instance_id="a",
        patch_exists=True,
        patch_applied=True,
        resolved=False,
        fail_to_pass={"success": ["t::x"], "failure": ["t::y"]},
        pass_to_pass={"success": ["t::z"], "failure": []},
        statuses={"t::x": "PASSED", "t::z": "PASSED"},
    )
    reward = graded.to_reward()
    assert reward.kind == tpb.REWARD_KIND_OUTCOME and reward.value == -1.0
    assert reward.outcome.status == tpb.OUTCOME_STATUS_UNRESOLVED
    assert (reward.outcome.fail_to_pass_passed, reward.outcome.fail_to_pass_total) == (1, 2)
    assert [t.status for t in reward.outcome.tests] == [
        tpb.TEST_STATUS_PASSED,
        tpb.TEST_STATUS_MISSING,
        tpb.TEST_STATUS_PASSED,
    ]


def test_eval_reads_grades_back_from_stored_rewards() -> None:
    from orchard.cli.runs import grade_from_trajectory

    graded = GradeResult(
        instance_id="a",
        patch_exists=True,
        patch_applied=True,
        resolved=True,
        fail_to_pass={"success": ["t::x"], "failure": []},
        pass_to_pass={"success": ["t::z"], "failure": []},
        statuses={"t::x": "PASSED", "t::z": "PASSED"},
        sample_index=3,
        duration_s=1.5,
    )
    trajectory = tpb.Trajectory(
        task_id="a", sample_index=3, final_patch="diff --git a/x b/x\n", rewards=[graded.to_reward()]
    )
    back = grade_from_trajectory(trajectory)
    assert back == GradeResult(**{**graded.__dict__, "statuses": {}, "log_tail": ""})
    assert grade_from_trajectory(tpb.Trajectory(task_id="a")) is None
