"""The task sets `orchard rollout` and `orchard eval` run, behind one `TaskSet` protocol (load, policy, harness,
report), so that the CLI has one rollout path and one report path whatever the tasks are:

- **swe**: SWE-bench-style instances (a bundled set such as toyrepair, or a JSON/JSONL file), each rollout's final
  patch graded by the task's tests in a fresh sandbox; the scripted policy is `reference:Q` (gold patches).
- **web**: web tasks in browser sandboxes through the web harness. The bundled sites are served on a loopback port
  for the run (or --site names a server already running), every rollout's browser may reach that site only, and
  each rollout is judged by its task's check on the page the agent left.
- **claw**: personal-assistant tasks in sandboxes with real mail, calendar and files through the assistant
  harness, scored as Claw-Eval scores them (pass@k and pass^k over the samples).

Web and claw rollouts judge themselves when they end (there is no patch to grade again later)."""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchard.harness import Harness, Model
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import GradeResult

KINDS = ("web", "claw")
"""The --tasks prefixes of the self-judging task sets; every other value names SWE instances."""


class TaskSet(Protocol):
    """One loaded task set: what a run of it needs and how its results are reported."""

    kind: str
    """ "swe", "web" or "claw"."""
    spec: str
    """The --tasks value it was loaded from."""
    by_id: dict[str, Any]
    """The tasks by id, in the set's order."""
    outcome: str
    """What a good rollout is called in progress lines and reports: "resolved" or "succeeded"."""
    regradable: bool
    """Whether a stored rollout can be graded again later (--regrade, --gold), i.e. from its patch alone."""

    def check_policy(self, policy: float | str | None) -> None:
        """InvalidArgument when --policy does not apply to these tasks."""
        ...

    def budgets(self, policy: float | str | None) -> tuple[int, int]:
        """The default token budgets (of a rollout, of one reply) for a served model or the scripted policy."""
        ...

    async def open(self, stack: contextlib.AsyncExitStack, args: argparse.Namespace) -> str:
        """Start what a run needs (web: the sites' server), closed with `stack`; a few words describing it."""
        ...

    def scripted(self, policy: float | str) -> Model:
        """The task set's own policy: reference:Q (SWE, from gold patches) or each task's bundled solution."""
        ...

    def harness(self, task: Any, client: AsyncSandboxClient, args: argparse.Namespace) -> Harness:
        """The harness of one rollout of `task`."""
        ...

    def report(
        self, grades: Sequence[GradeResult], *, run_id: str, model: str, k: int | None = None
    ) -> tuple[dict[str, Any], str]:
        """The report of graded rollouts over the tasks they ran on (in the set's order), and its text."""
        ...


def load(spec: str, ids: list[str] | None = None, env_specs: str | None = None) -> TaskSet:
    """The task set a --tasks value names (InvalidArgument for a bad file or unknown ids)."""
    kind = spec.partition(":")[0]
    if kind == "web":
        return WebTasks(spec, ids)
    if kind == "claw":
        return ClawTasks(spec, ids)
    return SWETasks(spec, ids, env_specs)


def _ids_line(report: dict[str, Any], outcome: str) -> str:
    return f"{outcome}: {', '.join(report['resolved_ids']) or '(none)'}"


class SWETasks:
    kind, outcome, regradable = "swe", "resolved", True

    def __init__(self, spec: str, ids: list[str] | None, env_specs: str | None) -> None:
        from orchard.tasks import load_instances

        self.spec = spec
        self.by_id: dict[str, Any] = {i.instance_id: i for i in load_instances(spec, ids, env_specs=env_specs)}
        # The name trajectories carry: a bundled set's name, or a file's stem.
        self.name = spec if "/" not in spec else Path(spec).stem

    def check_policy(self, policy: float | str | None) -> None:
        from orchard.errors import InvalidArgument

        if policy == "scripted":
            raise InvalidArgument(
                "--policy scripted follows a web or claw task's bundled solution; SWE task sets take "
                "--policy reference:Q, --policy expert or a served model"
            )

    def budgets(self, policy: float | str | None) -> tuple[int, int]:
        # The reference policy's tokens are bytes: its replies carry whole patches.
        return (8192, 256) if policy is None else (32768, 8192)

    async def open(self, stack: contextlib.AsyncExitStack, args: argparse.Namespace) -> str:
        return ""

    def scripted(self, policy: float | str) -> Model:
        from orchard.harness import ExpertModel, ReferenceModel

        if policy == "expert":
            return ExpertModel(list(self.by_id.values()))
        assert isinstance(policy, float)
        return ReferenceModel(list(self.by_id.values()), policy)

    def harness(self, task: Any, client: AsyncSandboxClient, args: argparse.Namespace) -> Harness:
        from orchard.harness import SWEHarness

        return SWEHarness(task, client, task_set=self.name)

    def report(
        self, grades: Sequence[GradeResult], *, run_id: str, model: str, k: int | None = None
    ) -> tuple[dict[str, Any], str]:
        from orchard.tasks import make_report
        from orchard.tasks.report import format_table

        ran = {g.instance_id for g in grades}
        out = make_report(list(grades), [i for i in self.by_id if i in ran], run_id=run_id, model=model, k=k)
        return out, f"{format_table(out)}\n{_ids_line(out, 'resolved')}"


class _SelfJudged:
    """Web and claw tasks: a scripted policy from each task's bundled solution, success per category."""

    kind = ""
    outcome, regradable = "succeeded", False

    def __init__(self, spec: str, ids: list[str] | None) -> None:
        from orchard.errors import InvalidArgument

        self.spec = spec
        path = spec.partition(":")[2]
        try:
            self.by_id: dict[str, Any] = {t.task_id: t for t in self._load(path or None, ids)}
        except (ValueError, OSError) as err:
            raise InvalidArgument(f"--tasks {spec}: {err}") from None

    def _load(self, path: str | None, ids: list[str] | None) -> list[Any]:
        raise NotImplementedError

    def check_policy(self, policy: float | str | None) -> None:
        from orchard.errors import InvalidArgument

        if policy is not None and policy != "scripted":
            raise InvalidArgument(
                f"--policy {'expert' if policy == 'expert' else 'reference:Q'} builds rollouts from gold patches, "
                f"which {self.kind} tasks have none "
                f"of; {self.kind} tasks take --policy scripted (each task's bundled solution) or a served "
                "model"
            )

    def budgets(self, policy: float | str | None) -> tuple[int, int]:
        # The scripted policies' tokens are bytes, and observations hold whole pages or mailboxes.
        return (8192, 256) if policy is None else (262_144, 256)

    def report(
        self, grades: Sequence[GradeResult], *, run_id: str, model: str, k: int | None = None
    ) -> tuple[dict[str, Any], str]:
        from orchard.tasks import make_report
        from orchard.tasks.report import format_table

        ran = {g.instance_id for g in grades}
        out: dict[str, Any] = make_report(
            list(grades), [i for i in self.by_id if i in ran], run_id=run_id, model=model, k=k
        )
        out["categories"] = category_rates(grades, list(self.by_id.values()))
        text = [format_table(out, outcome="success"), format_categories(out["categories"])]
        text += self._extra(out, grades, k)
        text.append(_ids_line(out, "succeeded"))
        return out, "\n".join(text)

    def _extra(self, out: dict[str, Any], grades: Sequence[GradeResult], k: int | None) -> list[str]:
        return []


class WebTasks(_SelfJudged):
    kind = "web"
    site = ""

    def _load(self, path: str | None, ids: list[str] | None) -> list[Any]:
        from orchard.tasks.web import load_tasks

        return list(load_tasks(path, ids))

    async def open(self, stack: contextlib.AsyncExitStack, args: argparse.Namespace) -> str:
        from orchard.tasks.web import SiteServer

        self.site = args.site or (await stack.enter_async_context(SiteServer())).url
        return f"(site {self.site}, observing {args.observe})"

    def scripted(self, policy: float | str) -> Model:
        from orchard.harness.web import WebScriptModel

        return WebScriptModel(list(self.by_id.values()), self.site)

    def harness(self, task: Any, client: AsyncSandboxClient, args: argparse.Namespace) -> Harness:
        from orchard.harness.web import WebHarness

        return WebHarness(task, client, self.site, observe=args.observe)


class ClawTasks(_SelfJudged):
    kind = "claw"

    def _load(self, path: str | None, ids: list[str] | None) -> list[Any]:
        from orchard.tasks.assistant import load_tasks

        return list(load_tasks(path, ids))

    async def open(self, stack: contextlib.AsyncExitStack, args: argparse.Namespace) -> str:
        return "(mail, calendar, files)"

    def scripted(self, policy: float | str) -> Model:
        from orchard.harness.assistant import AssistantScriptModel

        return AssistantScriptModel(list(self.by_id.values()))

    def harness(self, task: Any, client: AsyncSandboxClient, args: argparse.Namespace) -> Harness:
        from orchard.harness.assistant import AssistantHarness

        return AssistantHarness(task, client)

    def _extra(self, out: dict[str, Any], grades: Sequence[GradeResult], k: int | None) -> list[str]:
        from orchard.harness.assistant import claw_figures

        out["claw"], claw_text = claw_figures(grades, k or 3)
        return [claw_text]


def category_rates(grades: Sequence[GradeResult], tasks: Sequence[Any]) -> dict[str, dict[str, float | int]]:
    """Success per task category: rollouts, successes and the rate."""
    category = {t.task_id: t.category or "other" for t in tasks}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for grade in grades:
        row = counts[category.get(grade.instance_id, "other")]
        row[0] += 1
        row[1] += grade.resolved
    return {name: {"rollouts": n, "succeeded": s, "success_rate": s / n} for name, (n, s) in sorted(counts.items())}


def format_categories(rates: dict[str, dict[str, float | int]]) -> str:
    return "success by category: " + ", ".join(
        f"{name} {row['succeeded']}/{row['rollouts']} ({100 * row['success_rate']:.0f}%)" for name, row in rates.items()
    )
