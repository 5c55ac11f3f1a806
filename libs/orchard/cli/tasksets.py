"""`orchard rollout --tasks web|claw`: task sets whose rollouts judge themselves (no patch to grade).

- **web**: web tasks in browser sandboxes through the GUI harness. The bundled sites are served on a loopback port
  for the run (or --site names a server already running), every rollout's browser may reach that site only, and
  each rollout is judged by its task's check on the page the agent left.
- **claw**: personal-assistant tasks in sandboxes with real mail, calendar and files through the assistant
  harness, scored as Claw-Eval scores them (pass@k and pass^k over the samples).

Both report success per task and per category; `orchard eval --run R --tasks web|claw` reads the same back from
the experience service."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchard.harness import Harness, Model
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import GradeResult

KINDS = ("web", "claw")


def kind_of(tasks: str) -> str | None:
    """ "web" or "claw" when a --tasks value names such a task set ("web", "claw", or "web:FILE.jsonl" /
    "claw:FILE.jsonl"), else None (a SWE task set)."""
    kind = tasks.partition(":")[0]
    return kind if kind in KINDS else None


def load(tasks: str, ids: list[str] | None) -> list[Any]:
    """The tasks a --tasks value names (InvalidArgument for a bad file or unknown ids)."""
    from orchard.errors import InvalidArgument

    kind, _, path = tasks.partition(":")
    if kind == "web":
        from orchard.tasks.web import load_tasks
    else:
        from orchard.tasks.assistant import load_tasks  # type: ignore[assignment]
    try:
        return load_tasks(path or None, ids)  # type: ignore[arg-type]
    except (ValueError, OSError) as err:
        raise InvalidArgument(f"--tasks {tasks}: {err}") from None


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


def report(
    kind: str, grades: Sequence[GradeResult], tasks: Sequence[Any], *, run_id: str, model: str, k: int | None = None
) -> tuple[dict[str, Any], str]:
    """The run's report and its text: the per-task success table and success by category; for claw also the
    Claw-Eval figures (mean score, pass@k and pass^k, k = 3 by default)."""
    from orchard.tasks import make_report
    from orchard.tasks.report import format_table

    ran = {g.instance_id for g in grades}
    out: dict[str, Any] = make_report(
        list(grades), [t.task_id for t in tasks if t.task_id in ran], run_id=run_id, model=model, k=k
    )
    out["categories"] = category_rates(grades, tasks)
    text = [format_table(out, outcome="success"), format_categories(out["categories"])]
    if kind == "claw":
        from orchard.harness.assistant import claw_figures

        out["claw"], claw_text = claw_figures(grades, k or 3)
        text.append(claw_text)
    return out, "\n".join(text)


class Setup:
    """What a kind of task set needs for a run: a scripted policy and a harness per task (and, for web, a site)."""

    def __init__(self, kind: str, args: argparse.Namespace, client: AsyncSandboxClient, site: str = "") -> None:
        self.kind, self.args, self.client, self.site = kind, args, client, site

    def scripted(self, tasks: Sequence[Any]) -> Model:
        if self.kind == "web":
            from orchard.harness.gui import WebScriptModel

            return WebScriptModel(tasks, self.site)
        from orchard.harness.assistant import AssistantScriptModel

        return AssistantScriptModel(tasks)

    def harness(self, task: Any) -> Harness:
        if self.kind == "web":
            from orchard.harness.gui import GUIHarness

            return GUIHarness(task, self.client, self.site, observe=self.args.observe)
        from orchard.harness.assistant import AssistantHarness

        return AssistantHarness(task, self.client)

    def describe(self) -> str:
        return f"(site {self.site}, observing {self.args.observe})" if self.kind == "web" else "(mail, calendar, files)"


async def rollout(args: argparse.Namespace) -> int:
    from orchard.cli.rollout import RunLog, checked_run_id, connect_events
    from orchard.errors import InvalidArgument
    from orchard.harness import AgentLoop, InferenceModel, Limits, SamplingConfig, run_rollouts
    from orchard.sdk import AsyncSandboxClient

    kind = kind_of(args.tasks)
    assert kind is not None
    if args.policy is not None and args.policy != "scripted":
        raise InvalidArgument(
            f"--policy reference:Q builds rollouts from gold patches, which {kind} tasks have none "
            f"of; {kind} tasks take --policy scripted (each task's bundled solution) or a served "
            "model"
        )
    tasks = load(args.tasks, args.ids)
    run_id = checked_run_id(args.run_id)
    folder = Path(args.out) / run_id
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed, max_step_tokens=args.max_step_tokens or 256)
    async with contextlib.AsyncExitStack() as stack:
        publisher = None if args.no_events else await connect_events(stack, args.nats_url)
        site = ""
        if kind == "web":
            from orchard.tasks.web import SiteServer

            site = args.site or (await stack.enter_async_context(SiteServer())).url
        client = await stack.enter_async_context(AsyncSandboxClient(args.env_address))
        setup = Setup(kind, args, client, site)
        model: Model
        if args.policy == "scripted":
            model = setup.scripted(tasks)
        else:
            model = InferenceModel(args.inference_address, args.model, sampling)
            await model.connect()
            stack.push_async_callback(model.close)
        log = RunLog(stack, folder, len(tasks) * args.samples, outcome="succeeded")

        print(
            f"run {run_id}: {model.name} on {len(tasks)} {kind} tasks x {args.samples} samples "
            f"{setup.describe()} -> {folder}" + ("" if publisher is None else f" and {args.nats_url}"),
            file=sys.stderr,
        )
        # The scripted policies' tokens are bytes, and observations hold whole pages or mailboxes.
        max_tokens = args.max_tokens or (8192 if args.policy is None else 262_144)
        loop = AgentLoop(
            model,
            Limits(max_steps=args.max_steps, max_tokens=max_tokens, wall_clock_s=args.wall_clock),
            sampling,
            sink=publisher,
            run_id=run_id,
        )
        results = await run_rollouts(
            tasks,
            args.samples,
            loop=loop,
            client=client,
            make_harness=setup.harness,
            concurrency=args.concurrency,
            grade_patches=not args.no_grade,
            on_result=log,
        )
        elapsed = time.monotonic() - log.started
        log.finish()
    grades = [r.grade for r in results if r.grade is not None]
    if grades:
        out, text = report(kind, grades, tasks, run_id=run_id, model=model.name)
        (folder / "report.json").write_text(json.dumps(out, indent=2) + "\n")
        print(text)
    print(
        f"stored {len(results)} rollouts in {log.path} "
        f"({elapsed:.0f}s, {len(results) / max(elapsed, 1e-9):.2f} rollouts/s)"
    )
    if publisher is not None:
        print(
            f"published {publisher.stats.published} events for run {run_id} to {args.nats_url}; "
            f"read them back with `orchard eval --run {run_id} --tasks {args.tasks}`"
        )
    return 0
