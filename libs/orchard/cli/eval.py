"""`orchard eval`: the report of stored rollouts (pass@1, pass@k, the resolved list and a per-task table), from
their outcome rewards or regraded in fresh sandboxes; `--gold` grades a task set's own gold patches instead."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("eval", help="evaluate stored rollouts (or a task set's gold patches): pass@1, pass@k, "
                       "resolved ids, per-task table")
    p.add_argument("rollouts", nargs="?", default=None, help="a trajectories.jsonl written by `orchard rollout`")
    p.add_argument("--tasks", default="toyrepair", help="the task set the rollouts ran on (bundled name or file)")
    p.add_argument("--regrade", action="store_true", help="grade the final patches again in fresh sandboxes")
    p.add_argument("--gold", action="store_true", help="grade every task's gold patch (validates a task set)")
    p.add_argument("-k", type=int, default=None, help="k of pass@k (default: samples per task)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--env-address", default=None)
    p.add_argument("--report", default=None, help="write the JSON report here (default: report.json next to "
                   "the rollouts)")
    p.set_defaults(func=cmd_eval)


def grade_from_trajectory(trajectory):  # type: ignore[no-untyped-def]
    """The GradeResult an outcome reward stored on a trajectory records; None when it has none."""
    from orchard.tasks import GradeResult
    from orchard.types.v1 import types_pb2 as tpb

    outcomes = [r for r in trajectory.rewards if r.kind == tpb.REWARD_KIND_OUTCOME]
    if not outcomes:
        return None
    details = outcomes[-1].outcome
    groups: dict[int, dict[str, list[str]]] = {g: {"success": [], "failure": []}
                                               for g in (tpb.TEST_GROUP_FAIL_TO_PASS, tpb.TEST_GROUP_PASS_TO_PASS)}
    for test in details.tests:
        groups[test.group]["success" if test.status == tpb.TEST_STATUS_PASSED else "failure"].append(test.test_id)
    return GradeResult(instance_id=trajectory.task_id, patch_exists=bool(trajectory.final_patch.strip()),
                       patch_applied=details.patch_applied, resolved=details.status == tpb.OUTCOME_STATUS_RESOLVED,
                       fail_to_pass=groups[tpb.TEST_GROUP_FAIL_TO_PASS], pass_to_pass=groups[tpb.TEST_GROUP_PASS_TO_PASS],
                       log_tail=details.log_tail,
                       error=details.error if details.status == tpb.OUTCOME_STATUS_ERROR else "",
                       duration_s=details.duration.ToNanoseconds() / 1e9, sample_index=trajectory.sample_index)


async def evaluate(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import grade, load_instances, make_report
    from orchard.tasks.report import format_table
    from orchard.types.v1 import types_pb2 as tpb

    instances = {i.instance_id: i for i in load_instances(args.tasks)}
    if args.gold:
        pairs = [(i, i.patch, 0) for i in instances.values()]
        stored = []
    else:
        if not args.rollouts:
            raise SystemExit("orchard eval: give a trajectories.jsonl (from `orchard rollout`) or --gold")
        stored = [json_format.Parse(line, tpb.Trajectory()) for line in Path(args.rollouts).read_text().splitlines()
                  if line.strip()]
        unknown = sorted({t.task_id for t in stored} - set(instances))
        if unknown:
            raise SystemExit(f"orchard eval: tasks {unknown} are not in {args.tasks}; pass the task set with --tasks")
        pairs = [(instances[t.task_id], t.final_patch, t.sample_index) for t in stored]
    results = []
    if args.gold or args.regrade:
        slots = asyncio.Semaphore(args.concurrency)
        async with AsyncSandboxClient(args.env_address) as client:
            async def one(instance, patch, sample):  # type: ignore[no-untyped-def]
                async with slots:
                    return await grade(client, instance, patch, sample_index=sample)
            results = list(await asyncio.gather(*(one(*p) for p in pairs)))
    else:
        results = [grade_from_trajectory(t) for t in stored]
        if None in results:
            raise SystemExit("orchard eval: some rollouts carry no outcome reward; rerun with --regrade")
    graded_ids = sorted({r.instance_id for r in results})
    report = make_report(results, graded_ids, model=stored[0].policy.model if stored else "gold", k=args.k)
    target = Path(args.report) if args.report else (Path(args.rollouts).with_name("report.json") if args.rollouts
                                                     else Path("report.json"))
    target.write_text(json.dumps(report, indent=2) + "\n")
    print(format_table(report))
    print(f"resolved: {', '.join(report['resolved_ids']) or '(none)'}")  # type: ignore[arg-type]
    print(f"report written to {target}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    return asyncio.run(evaluate(args))
