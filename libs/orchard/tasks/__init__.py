"""Tasks in the SWE-bench instance format: loading, repository setup in sandboxes, grading as SWE-bench does,
and reports. The bundled ToyRepair set (`load_instances("toyrepair")`) is built from local files, offline."""

from orchard.tasks.grading import GradeResult, evaluate_log, grade
from orchard.tasks.instance import BUNDLED, TaskInstance, load_instances
from orchard.tasks.logparse import parse_log_pytest_v2
from orchard.tasks.repo import SANDBOX_ENV, setup_repo
from orchard.tasks.report import format_table, make_report, pass_at_k

__all__ = [
    "BUNDLED",
    "SANDBOX_ENV",
    "GradeResult",
    "TaskInstance",
    "evaluate_log",
    "format_table",
    "grade",
    "load_instances",
    "make_report",
    "parse_log_pytest_v2",
    "pass_at_k",
    "setup_repo",
]
