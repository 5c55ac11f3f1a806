"""`orchard rollout`: run k samples of a model on a task set in sandboxes, grade each one, store every
trajectory (JSON lines of types.v1.Trajectory, and as rollout events on NATS for the experience service) and
print a SWE-bench-style report, with a live progress line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.progress import ProgressLine

if TYPE_CHECKING:
    from orchard.events import EventPublisher
    from orchard.harness.runner import RolloutResult
    from orchard.sdk import AsyncSandboxClient


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("rollout", help="run a model on a task set (k samples each), grade and store every rollout")
    p.add_argument(
        "--tasks",
        default="toyrepair",
        help="a bundled task set's name, a JSON/JSONL file of "
        'SWE-bench instances; web tasks in browser sandboxes: "web" (the bundled sites), '
        '"web:miniwob" or "web:FILE.jsonl" (WebVoyager-style rows); personal-assistant tasks '
        'with mail, calendar and files: "claw" (the bundled 200) or "claw:FILE.jsonl" '
        "(default: toyrepair)",
    )
    p.add_argument("--ids", nargs="*", default=None, help="only these instance ids")
    p.add_argument(
        "--env-specs",
        default=None,
        metavar="FILE",
        help="environment specs by repo (and version), for "
        "instances that carry none (built once with `orchard env build`, else on first use)",
    )
    p.add_argument("--model", default="", help="the served model (default: the inference service's default)")
    p.add_argument(
        "--policy",
        type=policy_choice,
        default=None,
        metavar="reference:Q|expert|scripted",
        help="web and claw tasks: `scripted` follows each task's bundled solution. SWE tasks: "
        "instead of a served model, run a synthetic reference policy built from the task set's gold "
        "patches: each rollout submits the gold patch with probability Q in [0, 1], else a flawed one, "
        "through the real sandboxes and grader (trajectories name it e.g. reference-q0.50; --seed makes its "
        "choices repeat). It exercises value training and best-of-N without a capable model; `expert` writes "
        "the gold patch as the shortest trajectory (one editor call a hunk, then submit), the teacher to "
        "distil from. No inference service is needed",
    )
    p.add_argument("-n", "--samples", type=int, default=1, help="rollouts per task (k)")
    p.add_argument("--concurrency", type=int, default=4, help="rollouts in flight at once (each holds a sandbox)")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="token budget of a whole rollout (default 8192; "
        "32768 with --policy reference:Q and 262144 with --policy scripted, whose tokens are bytes)",
    )
    p.add_argument(
        "--max-step-tokens", type=int, default=None, help="tokens per model reply (default 256; 8192 with --policy)"
    )
    p.add_argument("--wall-clock", type=float, default=1800, help="seconds per rollout")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--env-address", default=None, help="env service (default: ORCHARD_ENV_ADDRESS or 127.0.0.1:50051)")
    p.add_argument("--inference-address", default="127.0.0.1:50052")
    p.add_argument("--run-id", default="", help="default: a new random id")
    p.add_argument(
        "--out", default="runs", help="folder; the run writes <out>/<run_id>/{trajectories.jsonl,report.json}"
    )
    p.add_argument("--no-grade", action="store_true", help="store rollouts without grading them")
    p.add_argument(
        "--nats-url",
        default="nats://127.0.0.1:4222",
        help="publish every rollout's events here, for the experience service (default: the NATS `orchard up` starts)",
    )
    p.add_argument("--no-events", action="store_true", help="do not publish events (only the local JSONL)")
    p.add_argument(
        "--observe",
        choices=["text", "screenshot", "both"],
        default="text",
        help="web tasks: what the agent sees after each action: the URL, title and accessibility tree "
        "(text), a screenshot (needs a vision-language model, e.g. on the vLLM engine), or both",
    )
    p.add_argument(
        "--site",
        default=None,
        help="web tasks: the base URL of a server already serving the bundled "
        "sites (default: serve them on a loopback port for this run)",
    )
    p.add_argument(
        "--harness",
        choices=["orchard", "mini-swe-agent"],
        default="orchard",
        help="SWE tasks: the agent: Orchard's own loop, or mini-swe-agent's DefaultAgent (its stock "
        "SWE-bench prompts, the model behind --openai-base) with the same task setup, grading and storage",
    )
    p.add_argument(
        "--openai-base",
        default="http://127.0.0.1:50080/v1",
        help="--harness mini-swe-agent: the "
        "OpenAI-compatible endpoint of the model (orchard up serves the embedded one here)",
    )
    p.add_argument(
        "--textbased",
        action="store_true",
        help="--harness mini-swe-agent: actions in bash blocks "
        "instead of tool calls (for models that do not emit tool calls reliably)",
    )
    p.set_defaults(func=cmd_rollout)


SCRIPTED_POLICIES = ("scripted", "expert")
"""The --policy values that are names: a web or claw task's bundled solution, and the SWE expert."""


def policy_choice(text: str) -> float | str:
    """The --policy value: "scripted" (web tasks), "expert", or the Q of reference:Q (SWE tasks)."""
    return text if text in SCRIPTED_POLICIES else reference_quality(text)


def reference_quality(text: str) -> float:
    """The Q of `--policy reference:Q`."""
    kind, _, quality = text.partition(":")
    try:
        value = float(quality)
    except ValueError:
        value = float("nan")
    if kind != "reference" or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a policy: give reference:Q with Q a number in [0, 1] (e.g. reference:0.5), "
            "expert or scripted"
        )
    return value


NATS_CONNECT_TIMEOUT_S = 5.0
"""How long to try reaching NATS at start before telling the user to start the stack."""


async def connect_events(stack: contextlib.AsyncExitStack, url: str) -> EventPublisher:
    """An EventPublisher on `url`, closed (flushed) with `stack`; Unavailable naming the fix when NATS is down."""
    from orchard.errors import Unavailable
    from orchard.events import EventPublisher

    hint = "start the stack with `orchard up` (or point --nats-url at a running NATS), or pass --no-events"
    try:
        # nats-py keeps retrying a first connect to an unreachable server forever: bound it here.
        async with asyncio.timeout(NATS_CONNECT_TIMEOUT_S):
            return await stack.enter_async_context(EventPublisher.connect(url))
    except TimeoutError:
        raise Unavailable(
            f"cannot publish rollout events: no NATS server answered at {url} within "
            f"{NATS_CONNECT_TIMEOUT_S:.0f}s; {hint}"
        ) from None
    except Unavailable as err:
        raise Unavailable(f"cannot publish rollout events: {err.message}; {hint}") from err


def progress(done: int, total: int, resolved: int, graded: int, started: float, outcome: str = "resolved") -> str:
    """One progress line: a bar, counts, the live resolve (or success) rate and the rate of rollouts."""
    width = 30
    filled = width * done // max(total, 1)
    rate = f"{100 * resolved / graded:.0f}%" if graded else "-"
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} rollouts  {outcome} {resolved}/{graded} "
        f"({rate})  {done / max(time.monotonic() - started, 1e-9):.2f}/s"
    )


def checked_run_id(run_id: str) -> str:
    """The run id given, or a new one; InvalidArgument when it cannot name a run on the event bus."""
    from orchard import events
    from orchard.errors import InvalidArgument
    from orchard.types.v1 import types_pb2 as tpb

    run_id = run_id or uuid.uuid4().hex[:12]
    try:
        events.subject_of(events.started(tpb.Trajectory(run_id=run_id, trajectory_id=run_id)))
    except ValueError as err:
        raise InvalidArgument(f"--run-id {run_id!r} cannot name a run: {err}") from None
    return run_id


class RunLog:
    """A run's trajectories.jsonl, written as each rollout ends, and its live progress line on stderr (redrawn on
    a terminal, a plain line every few seconds in a log)."""

    def __init__(
        self,
        stack: contextlib.ExitStack | contextlib.AsyncExitStack,
        folder: Path,
        total: int,
        outcome: str = "resolved",
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "trajectories.jsonl"
        self._file = stack.enter_context(self.path.open("a"))
        self.total, self.outcome = total, outcome
        self.done = self.resolved = self.graded = 0
        self.started = time.monotonic()
        self._line = ProgressLine()

    def __call__(self, result: RolloutResult) -> None:
        from google.protobuf import json_format

        self._file.write(json_format.MessageToJson(result.trajectory, indent=None) + "\n")
        self._file.flush()
        self.done += 1
        if result.grade is not None:
            self.graded += 1
            self.resolved += result.grade.resolved
        self._line.update(progress(self.done, self.total, self.resolved, self.graded, self.started, self.outcome))

    def finish(self) -> None:
        """Leave the progress line with the run's final counts."""
        self._line.finish()


async def rollout(args: argparse.Namespace) -> int:
    """The one rollout path of every task set: check everything the run needs, run k samples of each task with
    the agent loop (or mini-swe-agent's), store and publish each one as it ends, then report."""
    from orchard.cli import tasksets
    from orchard.errors import InvalidArgument
    from orchard.harness import AgentLoop, InferenceModel, Limits, Model, SamplingConfig, run_rollouts
    from orchard.sdk import AsyncSandboxClient

    task_set = tasksets.load(args.tasks, args.ids, env_specs=args.env_specs)
    if args.harness == "mini-swe-agent":
        if task_set.kind != "swe":
            raise InvalidArgument(f"--harness mini-swe-agent runs SWE tasks, not {task_set.kind} tasks")
        if args.policy is not None:
            raise InvalidArgument(
                "--harness mini-swe-agent runs a served model (--openai-base); --policy is for Orchard's own loop"
            )
    task_set.check_policy(args.policy)
    run_id = checked_run_id(args.run_id)
    folder = Path(args.out) / run_id
    tasks = list(task_set.by_id.values())
    max_tokens, max_step_tokens = task_set.budgets(args.policy)
    sampling = SamplingConfig(
        temperature=args.temperature, seed=args.seed, max_step_tokens=args.max_step_tokens or max_step_tokens
    )
    async with contextlib.AsyncExitStack() as stack:
        # 1. Everything this run needs, checked before the first rollout starts.
        publisher = None if args.no_events else await connect_events(stack, args.nats_url)
        described = await task_set.open(stack, args)
        client = await stack.enter_async_context(AsyncSandboxClient(args.env_address))
        model: Model | None = None
        if args.harness == "mini-swe-agent":
            name = await _served_model(args)
        elif args.policy is None:
            model = InferenceModel(args.inference_address, args.model, sampling)
            await model.connect()
            stack.push_async_callback(model.close)
            name = model.name
        else:
            model = task_set.scripted(args.policy)
            name = model.name
        log = RunLog(stack, folder, len(tasks) * args.samples, outcome=task_set.outcome)
        agent = "mini-swe-agent with " if model is None else ""
        noun = "tasks" if task_set.kind == "swe" else f"{task_set.kind} tasks"
        print(
            f"run {run_id}: {agent}{name} on {len(tasks)} {noun} x {args.samples} samples"
            + (f" {described}" if described else "")
            + f" -> {folder}"
            + ("" if publisher is None else f" and {args.nats_url}"),
            file=sys.stderr,
        )
        # 2. The rollouts, graded and stored as each one ends.
        if model is None:
            results = await _mini_rollouts(args, tasks, client, publisher, log, model=name, run_id=run_id)
        else:
            loop = AgentLoop(
                model,
                Limits(
                    max_steps=args.max_steps, max_tokens=args.max_tokens or max_tokens, wall_clock_s=args.wall_clock
                ),
                sampling,
                sink=publisher,
                run_id=run_id,
            )
            results = await run_rollouts(
                tasks,
                args.samples,
                loop=loop,
                client=client,
                make_harness=lambda task: task_set.harness(task, client, args),
                concurrency=args.concurrency,
                grade_patches=not args.no_grade,
                on_result=log,
            )
        elapsed = time.monotonic() - log.started
        log.finish()
    # 3. Leaving the block flushed every event to the bus (or raised Unavailable naming how many were not):
    # the experience service can now serve the whole run.
    grades = [r.grade for r in results if r.grade is not None]
    if grades:
        report, text = task_set.report(grades, run_id=run_id, model=name)
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        print(text)
    print(
        f"stored {len(results)} rollouts in {log.path} "
        f"({elapsed:.0f}s, {len(results) / max(elapsed, 1e-9):.2f} rollouts/s)"
    )
    if publisher is not None:
        again = f"orchard eval --run {run_id}" + ("" if args.tasks == "toyrepair" else f" --tasks {args.tasks}")
        print(
            f"published {publisher.stats.published} events for run {run_id} to {args.nats_url}; "
            f"read them back with `{again}`"
        )
    return 0


async def _served_model(args: argparse.Namespace) -> str:
    """--model, or the model the OpenAI-compatible endpoint serves (for mini-swe-agent)."""
    import urllib.request

    from orchard.errors import Unavailable

    if args.model:
        return str(args.model)
    try:
        with urllib.request.urlopen(f"{args.openai_base.rstrip('/')}/models", timeout=10) as answer:
            return str(json.loads(answer.read())["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise Unavailable(
            f"cannot ask {args.openai_base} which model it serves ({err}); start the stack with "
            "`orchard up`, or give --model and --openai-base"
        ) from None


async def _mini_rollouts(
    args: argparse.Namespace,
    instances: list[Any],
    client: AsyncSandboxClient,
    publisher: EventPublisher | None,
    log: RunLog,
    *,
    model: str,
    run_id: str,
) -> list[RolloutResult]:
    """`--harness mini-swe-agent`: mini's agent on every task, k samples, at most --concurrency at once, each
    graded, stored and published like a rollout of Orchard's own loop."""
    from orchard import events
    from orchard.integrations.mini_swe_agent import mini_config, mini_rollout

    task_set = args.tasks if "/" not in str(args.tasks) else Path(args.tasks).stem
    slots = asyncio.Semaphore(max(1, args.concurrency))

    async def one(instance: Any, sample: int) -> RolloutResult:
        config = mini_config(
            model,
            args.openai_base,
            textbased=args.textbased,
            cwd=instance.workdir,
            address=args.env_address,
            step_limit=args.max_steps,
        )
        async with slots:
            done = await mini_rollout(client, instance, sample, run_id=run_id, task_set=task_set, config=config)
        if publisher is not None:
            for event in (events.started(done.trajectory), events.finished(done.trajectory)):
                await publisher.publish(event)
        log(done)
        return done

    return list(await asyncio.gather(*(one(i, s) for i in instances for s in range(args.samples))))


def cmd_rollout(args: argparse.Namespace) -> int:
    return asyncio.run(rollout(args))
