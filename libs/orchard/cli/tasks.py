"""`orchard env build` (build the environments of a task file, once) and `orchard tasks validate` (grade every
instance's gold patch and its empty patch: gold must resolve, empty must not)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from orchard.progress import ProgressLine

if TYPE_CHECKING:
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks import GradeResult, TaskInstance


def add_task_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that takes a task file shares."""
    p.add_argument(
        "--tasks",
        required=True,
        help="a task file: SWE-bench-style JSON, JSON lines or Parquet (or a bundled task set's name)",
    )
    p.add_argument("--ids", nargs="*", default=None, help="only these instance ids")
    p.add_argument(
        "--env-specs",
        default=None,
        metavar="FILE",
        help="environment specs by repo (and version), for instances that carry none",
    )
    p.add_argument(
        "--env-address", default=None, help="the env service (default: ORCHARD_ENV_ADDRESS or 127.0.0.1:50051)"
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    env = sub.add_parser("env", help="build the environments real repositories need (cached, forked per rollout)")
    esub = env.add_subparsers(dest="action", required=True)
    p = esub.add_parser("build", help="build every environment and instance state a task file needs, once")
    add_task_arguments(p)
    p.set_defaults(func=cmd_env_build)

    tasks = sub.add_parser("tasks", help="check task sets, and synthesize them from repositories")
    tsub = tasks.add_subparsers(dest="action", required=True)
    p = tsub.add_parser(
        "validate",
        help="grade every instance's gold and empty patch: gold must resolve, empty must not (exit 1 otherwise)",
    )
    add_task_arguments(p)
    p.add_argument("--report", default=None, help="write the JSON report here")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--test-timeout", type=float, default=600.0, help="seconds the tests of one grade may run")
    p.add_argument("--grade-timeout", type=float, default=900.0, help="seconds one grade may take in all")
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        help="retries of a grade that failed for the infrastructure (a sandbox or the service), not for the patch",
    )
    p.set_defaults(func=cmd_validate)
    from orchard.cli.synthesize import add_parser as add_synthesize

    add_synthesize(tsub)


def load(args: argparse.Namespace) -> list[TaskInstance]:
    from orchard.tasks import load_instances

    return load_instances(args.tasks, args.ids, env_specs=args.env_specs)


# ---- orchard env build ----


async def env_build(args: argparse.Namespace) -> int:
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks.environments import builder_for

    instances = load(args)
    with_env = [i for i in instances if i.environment is not None]
    if not with_env:
        print(
            f"orchard env build: none of the {len(instances)} instances has an environment spec (give "
            "`environment`, `install_config` or --env-specs); nothing to build",
            file=sys.stderr,
        )
        return 1
    line = ProgressLine()
    specs = list(dict.fromkeys(i.environment for i in with_env if i.environment is not None))
    async with AsyncSandboxClient(args.env_address) as client:
        builder = builder_for(client)
        builder._progress = line.update
        rows = []
        for n, spec in enumerate(specs, 1):
            started = time.monotonic()
            await builder.environment(spec)
            line.line(
                f"environment {n}/{len(specs)} {spec.key()} (Python {spec.python}, image {spec.image}): ready "
                f"in {time.monotonic() - started:.0f}s"
            )
        for n, instance in enumerate(with_env, 1):
            prepared = await builder.prepare(instance)
            rows.append((instance.instance_id, prepared))
            line.line(
                f"instance {n}/{len(with_env)} {instance.instance_id}: {'cached' if prepared.reused else 'built'}"
                f" at {prepared.head[:12]} ({prepared.seconds:.0f}s) -> snapshot {prepared.snapshot_id}"
            )
    line.finish()
    built = sum(not p.reused for _, p in rows)
    print(
        f"{len(rows)} instances ready in {len(specs)} environments ({built} built now, {len(rows) - built} cached); "
        f"build logs under {builder._logs}"
    )
    return 0


def cmd_env_build(args: argparse.Namespace) -> int:
    return asyncio.run(env_build(args))


# ---- orchard tasks validate ----


async def grade_retried(
    client: AsyncSandboxClient, instance: TaskInstance, patch: str, args: argparse.Namespace
) -> tuple[GradeResult, int]:
    """A grade, tried again (up to --retries) while it failed for the infrastructure; the result and its tries."""
    from orchard.tasks.grading import grade

    for attempt in range(args.retries + 1):
        result = await grade(client, instance, patch, test_timeout_s=args.test_timeout, timeout_s=args.grade_timeout)
        if not result.error or "ran past" in result.error:  # a test run past its timeout is the patch's doing
            return result, attempt + 1
        await asyncio.sleep(2**attempt)
    return result, args.retries + 1


def row_of(instance: TaskInstance, gold: GradeResult, empty: GradeResult) -> dict[str, object]:
    f2p, p2p = gold.fail_to_pass, gold.pass_to_pass
    ok = gold.resolved and not empty.resolved and not gold.error and not empty.error
    return {
        "instance_id": instance.instance_id,
        "ok": ok,
        "gold_resolved": gold.resolved,
        "empty_resolved": empty.resolved,
        "fail_to_pass": f"{len(f2p['success'])}/{len(f2p['success']) + len(f2p['failure'])}",
        "pass_to_pass": f"{len(p2p['success'])}/{len(p2p['success']) + len(p2p['failure'])}",
        "gold_seconds": round(gold.duration_s, 1),
        "empty_seconds": round(empty.duration_s, 1),
        "gold_error": gold.error,
        "empty_error": empty.error,
        **({} if ok else {"gold_log_tail": gold.log_tail, "empty_log_tail": empty.log_tail}),
    }


async def validate(args: argparse.Namespace) -> int:
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks.environments import builder_for

    instances = load(args)
    line = ProgressLine()
    slots = asyncio.Semaphore(max(1, args.concurrency))
    rows: list[dict[str, object]] = []
    started = time.monotonic()
    async with AsyncSandboxClient(args.env_address) as client:
        builder_for(client)._progress = line.update
        for instance in instances:  # builds first, one at a time (a build uses both cores)
            if instance.environment is not None:
                await builder_for(client).prepare(instance)

        async def one(instance: TaskInstance) -> None:
            async with slots:
                (gold, _), (empty, _) = await asyncio.gather(
                    grade_retried(client, instance, instance.patch, args), grade_retried(client, instance, "", args)
                )
            rows.append(row_of(instance, gold, empty))
            line.update(f"validated {len(rows)}/{len(instances)} ({sum(bool(r['ok']) for r in rows)} ok)")

        await asyncio.gather(*(one(i) for i in instances))
    line.finish()
    order = {i.instance_id: n for n, i in enumerate(instances)}
    rows.sort(key=lambda r: order[str(r["instance_id"])])
    width = max([len("INSTANCE"), *(len(str(r["instance_id"])) for r in rows)])
    print(f"{'INSTANCE':<{width}}  {'GOLD':<10} {'EMPTY':<10} {'F2P':>7} {'P2P':>7} {'GOLD s':>7} {'EMPTY s':>7}")
    for r in rows:
        gold = "ERROR" if r["gold_error"] else "resolved" if r["gold_resolved"] else "unresolved"
        empty = "ERROR" if r["empty_error"] else "resolved" if r["empty_resolved"] else "unresolved"
        print(
            f"{r['instance_id']:<{width}}  {gold:<10} {empty:<10} {r['fail_to_pass']:>7} {r['pass_to_pass']:>7} "
            f"{r['gold_seconds']:>7} {r['empty_seconds']:>7}"
        )
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        print(
            f"\n--- {r['instance_id']}: gold {'resolved' if r['gold_resolved'] else 'NOT resolved'}, empty "
            f"{'RESOLVED' if r['empty_resolved'] else 'unresolved'} {r['gold_error'] or r['empty_error'] or ''}"
        )
        tail = r["gold_log_tail"] if not r["gold_resolved"] or r["gold_error"] else r["empty_log_tail"]
        print(str(tail)[-2000:])
    print(
        f"\n{len(rows) - len(bad)}/{len(rows)} instances valid (gold resolved, empty unresolved) in "
        f"{time.monotonic() - started:.0f}s"
    )
    if args.report:
        Path(args.report).write_text(json.dumps({"tasks": str(args.tasks), "instances": rows}, indent=2) + "\n")
    return 1 if bad else 0


def cmd_validate(args: argparse.Namespace) -> int:
    return asyncio.run(validate(args))
