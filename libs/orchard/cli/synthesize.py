"""`orchard tasks synthesize`: SWE-bench-style training tasks from a local git repository or a package's source
distribution, by injecting bugs its own tests catch (orchard.tasks.factory)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from orchard.progress import ProgressLine

if TYPE_CHECKING:
    from orchard.tasks.envspec import EnvSpec


def add_parser(tsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from orchard.tasks.factory.mutations import MODEL_STRATEGY, STRATEGIES

    p = tsub.add_parser(
        "synthesize",
        help="make graded tasks from a repository: inject bugs, keep those its tests catch (SWE-bench format)",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--repo", type=Path, help="a local git repository (copied; tasks start from its HEAD)")
    where.add_argument("--sdist", metavar="NAME==VERSION", help="a package's source distribution, fetched through pip")
    p.add_argument("--base", default="", help="with --repo: the commit to start from (default HEAD)")
    p.add_argument(
        "--env-spec",
        default='{"python": "3.11", "pip_packages": ["pytest==8.3.4"]}',
        help="the environment: a spec as JSON text or a JSON file (keys of docs/real-repos.md's specs)",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="the task file to write (JSON lines); repositories go "
        "into <out>.repos/ beside it, the summary into <out>.summary.json",
    )
    p.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help=f"comma-separated, of: {', '.join(STRATEGIES)} (default all of those), and {MODEL_STRATEGY} (the "
        "served model rewrites a function with a bug in it; needs the inference service)",
    )
    p.add_argument(
        "--model-rewrites", type=int, default=8, help=f"with {MODEL_STRATEGY}: functions the model rewrites (default 8)"
    )
    p.add_argument("--budget", type=float, default=30.0, help="minutes; no trial starts after them (default 30)")
    p.add_argument("--max-candidates", type=int, default=0, help="try at most this many bugs (default: no cap)")
    p.add_argument("--max-per-function", type=int, default=3, help="tasks kept per function (default 3)")
    p.add_argument("--concurrency", type=int, default=2, help="trials at a time, each a sandbox (default 2)")
    p.add_argument("--seed", type=int, default=0, help="the order candidates are tried in (default 0)")
    p.add_argument("--test-timeout", type=float, default=300.0, help="seconds one test run may take (default 300)")
    p.add_argument(
        "--exclude-tasks",
        action="append",
        default=[],
        metavar="FILE",
        help="an evaluation set (task file, or .txt of ids) whose functions, tests and ids stay out; repeatable",
    )
    p.add_argument(
        "--writer",
        choices=["template", "model"],
        default="template",
        help="who writes the problem statements from the failing tests' names and output: a template, or the "
        "model the inference service serves (its text is used only when it quotes no changed line)",
    )
    p.add_argument(
        "--inference-address",
        default="127.0.0.1:50052",
        help="the inference service, for --writer model and the model_rewrite strategy",
    )
    p.add_argument(
        "--env-address", default=None, help="the env service (default: ORCHARD_ENV_ADDRESS or 127.0.0.1:50051)"
    )
    p.set_defaults(func=cmd_synthesize)


def _spec(text: str) -> EnvSpec:
    from orchard.tasks.envspec import parse_spec

    path = Path(text)
    if not text.lstrip().startswith("{") and path.is_file():
        return parse_spec(json.loads(path.read_text()), str(path))
    try:
        return parse_spec(json.loads(text), "--env-spec")
    except json.JSONDecodeError as err:
        raise SystemExit(f"orchard tasks synthesize: --env-spec is neither a JSON object nor a file ({err})") from None


def _check(args: argparse.Namespace) -> str | None:
    from orchard.tasks.factory.mutations import MODEL_STRATEGY, STRATEGIES

    unknown = [s for s in args.strategies.split(",") if s and s not in (*STRATEGIES, MODEL_STRATEGY)]
    if unknown:
        return f"unknown strategies {unknown}; choose from {', '.join((*STRATEGIES, MODEL_STRATEGY))}"
    for name in ("budget", "concurrency", "max_per_function", "test_timeout", "model_rewrites"):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be positive"
    if args.max_candidates < 0:
        return "--max-candidates must be 0 (no cap) or more"
    if args.out.suffix != ".jsonl":
        return f"--out must name a .jsonl file, not {args.out}"
    for path in args.exclude_tasks:
        if not Path(path).is_file():
            return f"--exclude-tasks {path}: no such file"
    return None


async def synthesize(args: argparse.Namespace) -> int:
    from orchard import clients
    from orchard.sdk import AsyncSandboxClient
    from orchard.tasks.factory import source as sources
    from orchard.tasks.factory.mutations import MODEL_STRATEGY
    from orchard.tasks.factory.rewrites import ModelRewriter
    from orchard.tasks.factory.statements import ModelWriter
    from orchard.tasks.factory.synthesize import Options, Synthesizer, write

    problem = _check(args)
    if problem:
        print(f"orchard tasks synthesize: {problem}", file=sys.stderr)
        return 2
    spec = _spec(args.env_spec)
    repos = args.out.with_name(args.out.name.removesuffix(".jsonl") + ".repos")
    line = ProgressLine()
    line.update("fetching the source" if args.sdist else "copying the repository")
    source = sources.from_sdist(args.sdist, repos) if args.sdist else sources.from_repo(args.repo, repos, args.base)
    line.line(f"source: {source.origin} at {source.base_commit[:12]} in {source.repo_dir}")
    options = Options(
        strategies=tuple(s for s in args.strategies.split(",") if s),
        max_candidates=args.max_candidates,
        budget_s=args.budget * 60,
        concurrency=args.concurrency,
        max_per_function=args.max_per_function,
        seed=args.seed,
        test_timeout_s=args.test_timeout,
        exclude_tasks=tuple(args.exclude_tasks),
        model_rewrites=args.model_rewrites,
    )
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(AsyncSandboxClient(args.env_address))
        writer, rewriter = None, None
        if args.writer == "model" or MODEL_STRATEGY in options.strategies:
            inference = await stack.enter_async_context(
                clients.connect("inference", args.inference_address, flag="--inference-address")
            )
            writer = ModelWriter(inference, seed=args.seed) if args.writer == "model" else None
            rewriter = ModelRewriter(inference, seed=args.seed) if MODEL_STRATEGY in options.strategies else None
        synthesizer = Synthesizer(client, source, spec, options, progress=line.update, writer=writer, rewriter=rewriter)
        result = await synthesizer.run()
    line.finish()
    summary_path = write(result, args.out, source)
    s = result.summary
    print(
        f"{s['kept']} tasks from {s['tried']} tried of {s['candidates']} candidate bugs in {s['seconds']:.0f}s "
        f"({s['seconds_per_task'] or '-'} s a task); {s['tests_at_base']['stable']} stable tests at base, "
        f"{len(s['tests_at_base']['flaky'])} flaky left out"
    )
    print(f"{'strategy':<18}{'tried':>7}{'kept':>7}{'kept %':>8}")
    for name, row in s["per_strategy"].items():
        if row["tried"]:
            print(f"{name:<18}{row['tried']:>7}{row['kept']:>7}{100 * row['kept_fraction']:>7.0f}%")
    if s["model_rewrites"]:
        print("model rewrites: " + "; ".join(f"{reason}: {n}" for reason, n in s["model_rewrites"].items()))
    if s["discarded"]:
        print("discarded: " + "; ".join(f"{reason}: {n}" for reason, n in s["discarded"].items()))
    print(
        f"tasks written to {args.out} (summary {summary_path}); check them with: orchard tasks validate --tasks {args.out}"
    )
    return 0 if result.records else 1


def cmd_synthesize(args: argparse.Namespace) -> int:
    return asyncio.run(synthesize(args))
