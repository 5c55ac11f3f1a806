"""`orchard eval`: the report of stored rollouts (pass@1, pass@k, the resolved list and a per-task table), from
their outcome rewards or regraded in fresh sandboxes. The rollouts come from a trajectories.jsonl or, with
`--run`, from the experience service; `--gold` grades a task set's own gold patches instead. `--compare` sets
two runs side by side (before and after training). `--best-of N` reranks N candidates per task with the value
service (best_of_n.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module at start: heavy parts are imported when a command runs
    from orchard.tasks import GradeResult, TaskInstance
    from orchard.types.v1 import types_pb2 as tpb

POLL_S = 0.5
"""How often `--run` asks the experience service again while it still stores the run's events."""


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


def grade_from_trajectory(trajectory: tpb.Trajectory) -> GradeResult | None:
    """The GradeResult an outcome reward stored on a trajectory records; None when it has none."""
    from orchard.tasks import GradeResult
    from orchard.types.v1 import types_pb2 as tpb

    outcomes = [r for r in trajectory.rewards if r.kind == tpb.REWARD_KIND_OUTCOME]
    if not outcomes:
        return None
    details = outcomes[-1].outcome
    groups: dict[int, dict[str, list[str]]] = {
        g: {"success": [], "failure": []} for g in (tpb.TEST_GROUP_FAIL_TO_PASS, tpb.TEST_GROUP_PASS_TO_PASS)
    }
    for test in details.tests:
        groups[test.group]["success" if test.status == tpb.TEST_STATUS_PASSED else "failure"].append(test.test_id)
    return GradeResult(
        instance_id=trajectory.task_id,
        patch_exists=bool(trajectory.final_patch.strip()),
        patch_applied=details.patch_applied,
        resolved=details.status == tpb.OUTCOME_STATUS_RESOLVED,
        fail_to_pass=groups[tpb.TEST_GROUP_FAIL_TO_PASS],
        pass_to_pass=groups[tpb.TEST_GROUP_PASS_TO_PASS],
        log_tail=details.log_tail,
        error=details.error if details.status == tpb.OUTCOME_STATUS_ERROR else "",
        duration_s=details.duration.ToNanoseconds() / 1e9,
        sample_index=trajectory.sample_index,
    )


async def stored_run(
    address: str, run_id: str, *, wait_s: float, graded: bool = True, full: bool = False
) -> list[tpb.Trajectory]:
    """Every rollout of `run_id` in the experience service (patch and rewards; with `full`, its messages, steps and
    tokens too), once it holds them all.

    The service stores events a moment after they were published, so this asks until every rollout is finished
    (and graded, when `graded`) and two looks POLL_S apart agree on the count; after `wait_s` it returns what
    there is if that is complete, else raises FailedPrecondition naming what is missing.
    """
    from orchard import clients
    from orchard.errors import FailedPrecondition, NotFound
    from orchard.experience.v1 import experience_pb2 as epb
    from orchard.types.v1 import types_pb2 as tpb

    request = epb.ListTrajectoriesRequest(
        filter=epb.TrajectoryFilter(run_ids=[run_id], include_unfinished=True),
        view=epb.TRAJECTORY_VIEW_FULL if full else epb.TRAJECTORY_VIEW_BASIC,
        page_size=50 if full else 1000,
    )  # full pages stay under gRPC's 4 MB
    deadline, agreed, told = time.monotonic() + wait_s, -1, False
    async with clients.connect("experience", address, flag="--experience-address") as experience:
        while True:
            found: list[tpb.Trajectory] = []
            request.page_token = ""
            while True:
                page = await experience.unary("ListTrajectories", request, idempotent=True, timeout=30)
                found += page.trajectories
                request.page_token = page.next_page_token
                if not request.page_token:
                    break
            unfinished = [t.trajectory_id for t in found if t.stop_reason == tpb.STOP_REASON_UNSPECIFIED]
            ungraded = [t.trajectory_id for t in found if graded and grade_from_trajectory(t) is None]
            complete = bool(found) and not unfinished and not ungraded
            if complete and (len(found) == agreed or time.monotonic() >= deadline):
                return found
            if time.monotonic() >= deadline:
                if not found:
                    raise NotFound(
                        f"run {run_id!r} has no rollouts in the experience service at {address}; check "
                        "the run id (`orchard rollout` prints it) and that the rollout published events"
                    )
                if unfinished:
                    raise FailedPrecondition(
                        f"run {run_id!r}: {len(unfinished)} of {len(found)} rollouts are still unfinished in the "
                        f"experience service after {wait_s:g}s (e.g. {unfinished[0]}); is `orchard rollout` still "
                        "running? Try again when it ends, or raise --wait"
                    )
                raise FailedPrecondition(
                    f"run {run_id!r}: {len(ungraded)} of {len(found)} rollouts carry no outcome reward (e.g. "
                    f"{ungraded[0]}; was it run with --no-grade?); rerun with --regrade"
                )
            if not complete and not told:
                print(
                    f"waiting up to {wait_s:g}s for the experience service to store run {run_id} ({len(found)} "
                    f"rollouts so far, {len(unfinished)} unfinished)",
                    file=sys.stderr,
                )
                told = True
            agreed = len(found) if complete else -1
            await asyncio.sleep(POLL_S)


def mean_outcome_reward(trajectories: list[tpb.Trajectory]) -> float | None:
    """The mean of the rollouts' latest outcome rewards; None when none has one."""
    from orchard.types.v1 import types_pb2 as tpb

    values = [[r.value for r in t.rewards if r.kind == tpb.REWARD_KIND_OUTCOME] for t in trajectories]
    latest = [v[-1] for v in values if v]
    return sum(latest) / len(latest) if latest else None


def format_comparison(
    before: dict[str, object],
    after: dict[str, object],
    before_rollouts: list[tpb.Trajectory],
    after_rollouts: list[tpb.Trajectory],
    k: int,
) -> str:
    """Two runs' reports side by side: resolved, pass@1, pass@k, mean outcome reward and the policy's weights."""

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
    instances: dict[str, TaskInstance],
    k: int | None = None,
) -> dict[str, Any]:
    """The report of graded rollouts, over the tasks they ran on in the task set's order (as `orchard rollout`)."""
    from orchard.tasks import make_report

    ran = {g.instance_id for g in grades}
    first = trajectories[0] if trajectories else None
    return make_report(
        grades,
        [i for i in instances if i in ran],
        run_id=first.run_id if first else "",
        model=first.policy.model if first else "gold",
        k=k,
    )


async def evaluate(args: argparse.Namespace) -> int:
    from google.protobuf import json_format

    from orchard.errors import FailedPrecondition, InvalidArgument
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import grade, load_instances
    from orchard.tasks.report import format_table
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
    from orchard.cli import tasksets

    kind = tasksets.kind_of(args.tasks)
    if kind and (args.gold or args.regrade):
        raise InvalidArgument(
            f"{kind} tasks are judged on the live sandbox when a rollout ends (the page, or the "
            "mailbox, calendar and files), and the stored rollouts carry that grade: --gold and "
            "--regrade do not apply to them"
        )
    instances = (
        {t.task_id: t for t in tasksets.load(args.tasks, None)}
        if kind  # type: ignore[misc]
        else {i.instance_id: i for i in load_instances(args.tasks, args.ids, env_specs=args.env_specs)}
    )

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
    results = await grades(stored)
    report = report_of(stored, results, instances, k=args.k)
    if kind:
        first = stored[0] if stored else None
        report, text = tasksets.report(
            kind,
            results,
            list(instances.values()),
            k=args.k,
            run_id=first.run_id if first else "",
            model=first.policy.model if first else "",
        )
        print(text)
        print(f"succeeded: {', '.join(report['resolved_ids']) or '(none)'}")
    else:
        print(format_table(report))
        print(f"resolved: {', '.join(report['resolved_ids']) or '(none)'}")  # type: ignore[arg-type]
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
        k = args.k or int(report["samples_per_instance"])  # type: ignore[call-overload]
        print(format_comparison(report_of(before, await grades(before), instances, k=k), report, before, stored, k))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    return asyncio.run(evaluate(args))
