"""`orchard rollout --tasks web`: web tasks in browser sandboxes through the GUI harness. The bundled sites are
served on a loopback port for the run (or --site names a server already running), every rollout's browser may
reach that site only, each rollout is judged by its task's check on the page the agent left, and the run's
report gives success rates per task and per category."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchard.tasks import GradeResult
    from orchard.tasks.web import WebTask

WEB_PREFIX = "web"


def is_web(tasks: str) -> bool:
    """Whether a --tasks value names web tasks: "web" (the bundled set) or "web:FILE.jsonl"."""
    return tasks == WEB_PREFIX or tasks.startswith(f"{WEB_PREFIX}:")


def load(tasks: str, ids: list[str] | None) -> list[WebTask]:
    """The web tasks a --tasks value names (InvalidArgument for a bad file or unknown ids)."""
    from orchard.errors import InvalidArgument
    from orchard.tasks.web import load_tasks

    path = tasks.partition(":")[2] or None
    try:
        return load_tasks(path, ids)
    except (ValueError, OSError) as err:
        raise InvalidArgument(f"--tasks {tasks}: {err}") from None


def category_rates(grades: list[GradeResult], tasks: list[WebTask]) -> dict[str, dict[str, float | int]]:
    """Success per task category: rollouts, successes and the rate."""
    category = {t.task_id: t.category or "other" for t in tasks}
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for grade in grades:
        row = counts[category.get(grade.instance_id, "other")]
        row[0] += 1
        row[1] += grade.resolved
    return {name: {"rollouts": n, "succeeded": s, "success_rate": s / n} for name, (n, s) in sorted(counts.items())}


def format_categories(rates: dict[str, dict[str, float | int]]) -> str:
    return "success by category: " + ", ".join(f"{name} {row['succeeded']}/{row['rollouts']} "
                                               f"({100 * row['success_rate']:.0f}%)" for name, row in rates.items())


async def rollout(args: argparse.Namespace) -> int:
    from orchard.cli.rollout import RunLog, checked_run_id, connect_events
    from orchard.errors import InvalidArgument
    from orchard.harness import AgentLoop, InferenceModel, Limits, Model, SamplingConfig, run_rollouts
    from orchard.harness.gui import GUIHarness, WebScriptModel
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import make_report
    from orchard.tasks.report import format_table
    from orchard.tasks.web import SiteServer

    if args.policy is not None and args.policy != "scripted":
        raise InvalidArgument("--policy reference:Q builds rollouts from gold patches, which web tasks have none "
                              "of; web tasks take --policy scripted (each task's bundled solution) or a served model")
    tasks = load(args.tasks, args.ids)
    run_id = checked_run_id(args.run_id)
    folder = Path(args.out) / run_id
    sampling = SamplingConfig(temperature=args.temperature, seed=args.seed,
                              max_step_tokens=args.max_step_tokens or 256)
    async with contextlib.AsyncExitStack() as stack:
        publisher = None if args.no_events else await connect_events(stack, args.nats_url)
        site = args.site or await stack.enter_async_context(SiteServer())
        site = site if isinstance(site, str) else site.url
        model: Model
        if args.policy == "scripted":
            model = WebScriptModel(tasks, site)
        else:
            model = InferenceModel(args.inference_address, args.model, sampling)
            await model.connect()
            stack.push_async_callback(model.close)
        client = await stack.enter_async_context(AsyncSandboxClient(args.env_address))
        log = RunLog(stack, folder, len(tasks) * args.samples, outcome="succeeded")

        print(f"run {run_id}: {model.name} on {len(tasks)} web tasks x {args.samples} samples (site {site}, "
              f"observing {args.observe}) -> {folder}" + ("" if publisher is None else f" and {args.nats_url}"),
              file=sys.stderr)
        # The scripted policy's tokens are bytes, and every observation holds a page's accessibility tree.
        max_tokens = args.max_tokens or (8192 if args.policy is None else 262_144)
        loop = AgentLoop(model, Limits(max_steps=args.max_steps, max_tokens=max_tokens,
                                       wall_clock_s=args.wall_clock), sampling, sink=publisher, run_id=run_id)
        results = await run_rollouts(
            tasks, args.samples, loop=loop, client=client,  # type: ignore[arg-type]
            make_harness=lambda t: GUIHarness(t, client, site, observe=args.observe),  # type: ignore[arg-type]
            concurrency=args.concurrency, grade_patches=not args.no_grade, on_result=log)
        elapsed = time.monotonic() - log.started
        print(file=sys.stderr)
    grades = [r.grade for r in results if r.grade is not None]
    if grades:
        report = make_report(grades, [t.task_id for t in tasks], run_id=run_id, model=model.name)
        report["categories"] = category_rates(grades, tasks)
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        print(format_table(report, outcome="success"))
        print(format_categories(report["categories"]))  # type: ignore[arg-type]
    print(f"stored {len(results)} rollouts in {log.path} "
          f"({elapsed:.0f}s, {len(results) / max(elapsed, 1e-9):.2f} rollouts/s)")
    if publisher is not None:
        print(f"published {publisher.stats.published} events for run {run_id} to {args.nats_url}; "
              f"read them back with `orchard eval --run {run_id} --tasks {args.tasks}`")
    return 0
