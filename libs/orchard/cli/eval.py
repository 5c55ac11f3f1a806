"""`orchard eval`: the report of stored rollouts (pass@1, pass@k, the resolved list and a per-task table), from
their outcome rewards or regraded in fresh sandboxes. The rollouts come from a trajectories.jsonl or, with
`--run`, from the experience service; `--gold` grades a task set's own gold patches instead. `--compare` sets
two runs side by side (before and after training). `--best-of N` reranks N candidates per task with the value
service (best_of_n.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module at start: heavy parts are imported when a command runs
    from orchard.cli.tasksets import TaskSet
    from orchard.tasks import GradeResult
    from orchard.types.v1 import types_pb2 as tpb


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "eval",
        help="evaluate stored rollouts (or a task set's gold patches): pass@1, pass@k, resolved ids, per-task table",
    )
    p.add_argument("rollouts", nargs="?", default=None, help="a trajectories.jsonl written by `orchard rollout`")
    p.add_argument("--run", default=None, help="evaluate this run's rollouts as stored in the experience service")
    p.add_argument("--experience-address", default="127.0.0.1:50055", help="the experience service (with --run)")
    p.add_argument(
        "--wait",
        type=float,
        default=60,
        help="with --run: seconds to wait for the service to store every rollout of the run (finished, with its grade)",
    )
    p.add_argument(
        "--compare",
        default=None,
        metavar="BEFORE_RUN",
        help="with --run: then compare the run with "
        "this earlier one (resolved, pass@1, pass@k, mean outcome reward, policy weights)",
    )
    p.add_argument("--tasks", default="toyrepair", help="the task set the rollouts ran on (bundled name or file)")
    p.add_argument("--env-specs", default=None, metavar="FILE", help="environment specs by repo (and version)")
    p.add_argument("--regrade", action="store_true", help="grade the final patches again in fresh sandboxes")
    p.add_argument("--gold", action="store_true", help="grade every task's gold patch (validates a task set)")
    p.add_argument("-k", type=int, default=None, help="k of pass@k (default: samples per task)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--env-address", default=None)
    p.add_argument(
        "--report",
        default=None,
        help="write the JSON report here (default: report.json next to "
        "the rollouts file; not written for --run unless given)",
    )
    from orchard.cli import best_of_n

    best_of_n.add_arguments(p)
    p.set_defaults(func=cmd_eval)


def format_comparison(
    before: dict[str, object],
    after: dict[str, object],
    before_rollouts: list[tpb.Trajectory],
    after_rollouts: list[tpb.Trajectory],
    k: int,
) -> str:
    """Two runs' reports side by side: resolved, pass@1, pass@k, mean outcome reward and the policy's weights."""

    from orchard.cli.runs import mean_outcome_reward

    def figures(report: dict[str, object], rollouts: list[tpb.Trajectory]) -> list[str]:
        at_k, reward = report.get(f"pass@{k}"), mean_outcome_reward(rollouts)
        weights = sorted({t.policy.weights_version or "(none)" for t in rollouts})
        return [
            f"{report['resolved_instances']}/{report['submitted_instances']}",
            f"{report['pass@1']:.3f}",
            "-" if at_k is None else f"{at_k:.3f}",
            "-" if reward is None else f"{reward:.3f}",
            ", ".join(weights),
        ]

    names = ["resolved", "pass@1", f"pass@{k}", "mean reward", "weights"]
    old, new = figures(before, before_rollouts), figures(after, after_rollouts)
    lines = [f"before/after: run {before['run_id']} -> run {after['run_id']}"]
    lines += [f"  {name:<12} {a} -> {b}" for name, a, b in zip(names, old, new, strict=True)]
    return "\n".join(lines)


def report_of(
    trajectories: list[tpb.Trajectory],
    grades: list[GradeResult],
    task_set: TaskSet,
    k: int | None = None,
) -> tuple[dict[str, Any], str]:
    """The report of graded rollouts (and its text), over the tasks they ran on in the task set's order, named
    after the rollouts' run and model (as `orchard rollout` reports it)."""
    first = trajectories[0] if trajectories else None
    return task_set.report(
        grades, run_id=first.run_id if first else "", model=first.policy.model if first else "gold", k=k
    )


async def evaluate(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from orchard.cli import tasksets
    from orchard.cli.runs import grade_from_trajectory, stored_run
    from orchard.errors import FailedPrecondition, InvalidArgument
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import grade
    from orchard.types.v1 import types_pb2 as tpb

    if args.best_of is not None:
        from orchard.cli import best_of_n

        return await best_of_n.evaluate(args)
    if sum(bool(x) for x in (args.rollouts, args.run, args.gold)) != 1:
        raise InvalidArgument(
            "give exactly one of a trajectories.jsonl (from `orchard rollout`), "
            "--run RUN_ID (from the experience service) or --gold"
        )
    if args.compare and not args.run:
        raise InvalidArgument(
            "--compare BEFORE_RUN compares two runs of the experience service: give the later one with --run"
        )
    task_set = tasksets.load(args.tasks, args.ids, env_specs=args.env_specs)
    if not task_set.regradable and (args.gold or args.regrade):
        raise InvalidArgument(
            f"{task_set.kind} tasks are judged on the live sandbox when a rollout ends (the page, or the "
            "mailbox, calendar and files), and the stored rollouts carry that grade: --gold and "
            "--regrade do not apply to them"
        )
    instances = task_set.by_id

    def checked(stored: list[tpb.Trajectory]) -> list[tpb.Trajectory]:
        unknown = sorted({t.task_id for t in stored} - set(instances))
        if unknown:
            raise InvalidArgument(f"tasks {unknown} are not in {args.tasks}; pass the task set with --tasks")
        return stored

    async def grades(stored: list[tpb.Trajectory]) -> list[GradeResult]:
        """The rollouts' grades: stored with them, or new ones from fresh sandboxes (--gold, --regrade)."""
        if not (args.gold or args.regrade):
            graded = [grade_from_trajectory(t) for t in stored]
            if None in graded:
                raise FailedPrecondition("some rollouts carry no outcome reward; rerun with --regrade")
            return [g for g in graded if g is not None]
        pairs = (
            [(i, i.patch, 0) for i in instances.values()]
            if args.gold
            else [(instances[t.task_id], t.final_patch, t.sample_index) for t in stored]
        )
        slots = asyncio.Semaphore(args.concurrency)
        async with AsyncSandboxClient(args.env_address) as client:

            async def one(instance, patch, sample):  # type: ignore[no-untyped-def]
                async with slots:
                    return await grade(client, instance, patch, sample_index=sample)

            return list(await asyncio.gather(*(one(*p) for p in pairs)))

    if args.gold:
        stored = []
    elif args.run:
        stored = checked(await stored_run(args.experience_address, args.run, wait_s=args.wait, graded=not args.regrade))
    else:
        stored = checked(
            [
                json_format.Parse(line, tpb.Trajectory())
                for line in Path(args.rollouts).read_text().splitlines()
                if line.strip()
            ]
        )
    report, text = report_of(stored, await grades(stored), task_set, k=args.k)
    print(text)
    if args.run:
        print(
            f"read {len(stored)} rollouts of run {args.run} back from the experience service at "
            f"{args.experience_address}"
        )
    target = (
        Path(args.report)
        if args.report
        else Path(args.rollouts).with_name("report.json")
        if args.rollouts
        else None
        if args.run
        else Path("report.json")
    )
    if target is not None:
        target.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {target}")
    if args.compare:
        before = checked(
            await stored_run(args.experience_address, args.compare, wait_s=args.wait, graded=not args.regrade)
        )
        k = args.k or int(report["samples_per_instance"])
        before_report, _ = report_of(before, await grades(before), task_set, k=k)
        print(format_comparison(before_report, report, before, stored, k))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    return asyncio.run(evaluate(args))
