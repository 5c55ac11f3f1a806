"""SWE-bench-style run reports, and pass@k over k graded samples per task."""

from __future__ import annotations

from collections import defaultdict
from math import comb

from orchard.tasks.grading import GradeResult


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c passed (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def prediction_key(result: GradeResult, samples: int) -> str:
    """The id a prediction has in the report: the instance id, with "#<sample>" when there are several."""
    return result.instance_id if samples == 1 else f"{result.instance_id}#{result.sample_index}"


def make_report(
    results: list[GradeResult], instance_ids: list[str], *, run_id: str = "", model: str = "", k: int | None = None
) -> dict[str, object]:
    """SWE-bench's run report (schema_version 2) over every graded prediction, plus pass@1/pass@k per task.

    Args:
        results: one per (instance, sample) graded.
        instance_ids: every instance of the task set (those without a result count as incomplete).
        k: the k of pass@k; the most samples any instance has when None.
    """
    by_task: dict[str, list[GradeResult]] = defaultdict(list)
    for result in results:
        by_task[result.instance_id].append(result)
    samples = max((len(v) for v in by_task.values()), default=1)
    k = k or samples
    key = {id(r): prediction_key(r, samples) for r in results}
    ordered = sorted(results, key=lambda r: (r.instance_id, r.sample_index))
    errors = [key[id(r)] for r in ordered if r.error]
    completed = [r for r in ordered if not r.error]
    tasks = []
    for instance_id in instance_ids:
        graded = sorted(by_task.get(instance_id, []), key=lambda r: r.sample_index)
        n, c = len(graded), sum(r.resolved for r in graded)
        tasks.append(
            {
                "instance_id": instance_id,
                "samples": n,
                "resolved": c,
                "pass@1": pass_at_k(n, c, 1) if n else 0.0,
                f"pass@{k}": pass_at_k(n, c, k) if n >= k else None,
                "errors": sum(bool(r.error) for r in graded),
                "mean_grading_s": round(sum(r.duration_s for r in graded) / n, 3) if n else None,
            }
        )
    graded_tasks = [t for t in tasks if t["samples"]]
    return {
        "run_id": run_id,
        "model": model,
        "total_instances": len(instance_ids),
        "submitted_instances": len(ordered),
        "completed_instances": len(completed),
        "resolved_instances": sum(r.resolved for r in completed),
        "unresolved_instances": sum(not r.resolved for r in completed),
        "empty_patch_instances": sum(not r.patch_exists for r in ordered),
        "error_instances": len(errors),
        "completed_ids": [key[id(r)] for r in completed],
        "incomplete_ids": [i for i in instance_ids if i not in by_task],
        "empty_patch_ids": [key[id(r)] for r in ordered if not r.patch_exists],
        "submitted_ids": [key[id(r)] for r in ordered],
        "resolved_ids": [key[id(r)] for r in completed if r.resolved],
        "unresolved_ids": [key[id(r)] for r in completed if not r.resolved],
        "error_ids": errors,
        "schema_version": 2,
        "samples_per_instance": samples,
        "pass@1": sum(t["pass@1"] for t in graded_tasks) / len(graded_tasks) if graded_tasks else 0.0,  # type: ignore[misc]
        f"pass@{k}": (
            sum(t[f"pass@{k}"] for t in graded_tasks) / len(graded_tasks)  # type: ignore[misc]
            if graded_tasks and all(t[f"pass@{k}"] is not None for t in graded_tasks)
            else None
        ),
        "tasks": tasks,
        "instances": {key[id(r)]: r.report_entry() for r in ordered},
    }


def format_table(report: dict[str, object], outcome: str = "resolved") -> str:
    """The per-task table and the summary line of a report, for a terminal. `outcome` names what a passing
    rollout is: "resolved" (a patch passing the tests) or "success" (a web task's check on the final page)."""
    k = report["samples_per_instance"]
    header = "RESOLVED" if outcome == "resolved" else "SUCCEEDED"
    rows = [f"{'TASK':<40} {header:>9} {'PASS@1':>7} {f'PASS@{k}':>7}"]
    for task in report["tasks"]:  # type: ignore[attr-defined]
        at_k = task.get(f"pass@{k}")
        rows.append(
            f"{task['instance_id']:<40} {task['resolved']:>4}/{task['samples']:<4} "
            f"{task['pass@1']:>7.2f} {'-' if at_k is None else f'{at_k:.2f}':>7}"
        )
    at_k = report.get(f"pass@{k}")
    at_k_text = "" if k == 1 else f"pass@{k} {'-' if at_k is None else f'{at_k:.3f}'}  "
    patches = f"  empty patches {report['empty_patch_instances']}" if outcome == "resolved" else ""
    rows.append(
        f"pass@1 {report['pass@1']:.3f}  {at_k_text}"
        f"{outcome} {report['resolved_instances']}/{report['submitted_instances']}  "
        f"errors {report['error_instances']}{patches}"
    )
    return "\n".join(rows)
