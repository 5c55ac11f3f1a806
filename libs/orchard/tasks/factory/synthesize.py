"""The task factory: SWE-bench-style tasks from a repository, by injecting bugs and keeping those tests catch.

    source (sdist or git) -> environment built once (snapshot) -> the test suite run twice at base (stable tests)
      -> candidate bugs (mutations.py), round-robin over functions, in a seeded order
        -> each tried in a fork of the base snapshot, a few at a time, within a time budget: the test files that
           name the changed function run with the bug
          -> kept: some stable test fails (FAIL_TO_PASS), the rest of those files' stable tests pass (PASS_TO_PASS);
             deduplicated, capped per function -> a parentless commit with the bug, the revert as gold patch,
             a statement from the failing tests' output

Which candidates are kept is decided in candidate order, never in the order trials finish, so the same source,
options and seed make the same set (as long as the budget lets the same candidates run).
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import random
import re
import shlex
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchard.errors import FailedPrecondition, OrchardError
from orchard.sdk import AsyncSandboxClient
from orchard.tasks.environments import builder_for
from orchard.tasks.envspec import EnvSpec
from orchard.tasks.factory import statements
from orchard.tasks.factory.mutations import MODEL_STRATEGY, STRATEGIES, Mutation, functions, mutations
from orchard.tasks.factory.rewrites import ModelRewriter
from orchard.tasks.factory.source import Source, files_at, read_at, task_commit
from orchard.tasks.grading import file_diffs
from orchard.tasks.instance import DEFAULT_TEST_CMD, TaskInstance, eval_task_ids, load_instances
from orchard.tasks.logparse import parse_log_pytest_v2, passed
from orchard.tasks.repo import SANDBOX_ENV

Progress = Callable[[str], None]
_TEST_FILE = re.compile(r"(^|/)(test_[^/]*|[^/]*_test)\.py$")
_NOT_SOURCE = re.compile(
    r"(^|/)(tests?|testing|docs?|examples?|benchmarks?|\.[^/]+)/|(^|/)(setup|conftest|versioneer|_version)\.py$"
)
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@(.*)$", re.MULTILINE)
SANDBOX_TTL_S = 3600.0
TRIAL_TIMEOUT_FACTOR = 5.0
TRIAL_TIMEOUT_FLOOR_S = 20.0


@dataclass(frozen=True)
class Options:
    strategies: tuple[str, ...] = STRATEGIES
    max_candidates: int = 0
    """Try at most this many candidates (0: as many as the budget allows)."""
    budget_s: float = 1800.0
    """No trial starts after this many seconds (the running ones finish)."""
    concurrency: int = 2
    max_per_function: int = 3
    seed: int = 0
    test_timeout_s: float = 300.0
    """The most one test run may take: the base runs', and a trial's cap (a trial gets TRIAL_TIMEOUT_FACTOR times the
    base run's time, at least TRIAL_TIMEOUT_FLOOR_S: a bug that loops forever must not hold a slot for minutes)."""
    exclude_tasks: tuple[str, ...] = ()
    """Evaluation sets whose functions and tests stay out (decontamination)."""
    model_rewrites: int = 8
    """With the model_rewrite strategy: how many functions the model is asked to put a bug in."""


@dataclass(frozen=True)
class _Plan:
    order: list[tuple[str, str]]
    """(file, function) in the seeded order."""
    by_function: dict[tuple[str, str], list[Mutation]]
    scoped: dict[tuple[str, str], tuple[str, ...]]
    """The test files that name each function (a function without any is never tried)."""


@dataclass(frozen=True)
class Candidate:
    index: int
    mutation: Mutation
    test_files: tuple[str, ...]


@dataclass
class Trial:
    candidate: Candidate
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    log: str = ""
    seconds: float = 0.0
    ran: bool = False
    """False for a candidate skipped without a sandbox (its function had its tasks already)."""
    reason: str = ""
    """Why it is not a task ("" when it is one)."""


@dataclass
class Result:
    """What a synthesis made: the task records (SWE-bench fields, Orchard's repo_dir and environment) and a summary."""

    records: list[dict[str, Any]]
    summary: dict[str, Any]


def classify_base(logs: list[str]) -> tuple[set[str], dict[str, Any]]:
    """The tests that passed in every base run (stable), and the figures: how many, which were flaky (passed in
    some runs only) and how many failed in all. Only stable tests are ever graded."""
    runs = [parse_log_pytest_v2(log) for log in logs]
    names = set().union(*runs)
    stable = {t for t in names if all(passed(t, r) for r in runs)}
    flaky = sorted(t for t in names if t not in stable and any(passed(t, r) for r in runs))
    failing = len(names) - len(stable) - len(flaky)
    return stable, {"stable": len(stable), "flaky": flaky, "failing": failing}


def is_test_file(path: str) -> bool:
    return bool(_TEST_FILE.search(path))


def is_source_file(path: str) -> bool:
    return path.endswith(".py") and not is_test_file(path) and not _NOT_SOURCE.search(path)


class Synthesizer:
    """One synthesis on one env service."""

    def __init__(
        self,
        client: AsyncSandboxClient,
        source: Source,
        spec: EnvSpec,
        options: Options,
        *,
        progress: Progress | None = None,
        writer: statements.ModelWriter | None = None,  # None: the template writes the statements
        rewriter: ModelRewriter | None = None,
    ) -> None:
        if (rewriter is None) == (MODEL_STRATEGY in options.strategies):
            raise ValueError(f"the {MODEL_STRATEGY} strategy needs a ModelRewriter, and only it does")
        self.writer = writer
        self.rewriter = rewriter
        self.rewrites: dict[str, int] = {}
        self.client = client
        self.source = source
        self.spec = spec
        self.options = options
        self.progress = progress or (lambda message: None)
        self.command = spec.test_cmd or DEFAULT_TEST_CMD
        self.base = TaskInstance(
            instance_id=f"{source.name}-base",
            repo=source.name,
            base_commit=source.base_commit,
            problem_statement="(the base state a synthesis starts from)",
            FAIL_TO_PASS=["(none)"],
            repo_dir=source.repo_dir,
            environment=spec,
        )
        self.discarded: Counter[str] = Counter()
        self.trial_timeout_s = options.test_timeout_s

    # ---- the base ----

    async def _run_tests(
        self, snapshot: str, files: list[str], mutation: Mutation | None = None, timeout_s: float | None = None
    ) -> tuple[str, bool]:
        """Run the test command on `files` in a fork of the snapshot (with the mutation's file in place)."""
        sandbox = await self.client.create_sandbox(
            from_snapshot=snapshot, env=SANDBOX_ENV, timeout=SANDBOX_TTL_S, labels={"orchard.role": "synthesis"}
        )
        async with sandbox:
            if mutation is not None:
                await sandbox.upload_content(mutation.source, f"{self.base.workdir}/{mutation.path}")
            command = f"{self.command} {' '.join(shlex.quote(f) for f in files)}"
            run = await sandbox.exec(
                command, cwd=self.base.workdir, env=SANDBOX_ENV, timeout=timeout_s or self.options.test_timeout_s
            )
        return run.stdout + run.stderr, run.timed_out

    async def base_tests(self, snapshot: str, test_files: list[str]) -> tuple[set[str], dict[str, Any]]:
        """The tests that pass at base in two runs (the others are flaky or failing, and never graded)."""
        self.progress(f"running the {len(test_files)} test files at base, twice")
        started = time.monotonic()
        (first, late1), (second, late2) = await asyncio.gather(
            self._run_tests(snapshot, test_files), self._run_tests(snapshot, test_files)
        )
        if late1 or late2:
            raise FailedPrecondition(
                f"the test suite ran past {self.options.test_timeout_s:g}s at base; raise --test-timeout"
            )
        if not parse_log_pytest_v2(first):
            raise FailedPrecondition(
                f"`{self.command}` printed no test results at base (the command needs pytest's -rA): {first[-1500:]}"
            )
        self.trial_timeout_s = min(
            self.options.test_timeout_s, max(TRIAL_TIMEOUT_FLOOR_S, TRIAL_TIMEOUT_FACTOR * (time.monotonic() - started))
        )
        stable, figures = classify_base([first, second])
        return stable, {
            **figures,
            "seconds": round(time.monotonic() - started, 2),
            "trial_timeout_s": self.trial_timeout_s,
        }

    # ---- candidates ----

    def excluded(self) -> tuple[set[tuple[str, str]], set[str], set[str]]:
        """What the evaluation sets hold: (file, function) pairs their gold patches change, the tests that check
        those fixes (FAIL_TO_PASS), and their ids."""
        functions_out: set[tuple[str, str]] = set()
        tests_out: set[str] = set()
        ids_out: set[str] = set()
        for path in self.options.exclude_tasks:
            ids_out |= eval_task_ids(path)
            if path.endswith(".txt"):
                continue
            for instance in load_instances(path):
                tests_out |= set(instance.fail_to_pass)  # the tests that check its fix (PASS_TO_PASS only guard)
                functions_out |= self._patched_functions(instance.patch)
        return functions_out, tests_out, ids_out

    def _patched_functions(self, patch: str) -> set[tuple[str, str]]:
        """The (file, function) pairs of this repository a patch changes: by the lines its hunks replace, and by the
        function git names in each hunk's header."""
        found: set[tuple[str, str]] = set()
        for path, body in file_diffs(patch):
            try:
                tree = ast.parse(read_at(self.source, path))
            except (OrchardError, SyntaxError):
                continue
            spans = {name: (node.lineno, node.end_lineno or node.lineno) for name, node in functions(tree)}
            for start, count, header in _HUNK.findall(body):
                first, last = int(start), int(start) + max(int(count or 1), 1) - 1
                for name, (lo, hi) in spans.items():
                    if lo <= last and first <= hi or re.search(rf"\bdef {re.escape(name.split('.')[-1])}\b", header):
                        found.add((path, name))
        return found

    def candidates(self, files: list[str], functions_out: set[tuple[str, str]]) -> list[Candidate]:
        """Every mutation of the source files whose function some test file names, round-robin over functions in
        a seeded order (so a budget cut still spreads over the repository)."""
        return self._round_robin(self._plan(files, functions_out))

    def _plan(self, files: list[str], functions_out: set[tuple[str, str]]) -> _Plan:
        """The functions in a seeded order, each with its bugs (in a seeded order) and the test files naming it."""
        tests = {f: read_at(self.source, f) for f in files if is_test_file(f)}
        by_function: dict[tuple[str, str], list[Mutation]] = defaultdict(list)
        for path in sorted(f for f in files if is_source_file(f)):
            text = read_at(self.source, path)
            try:
                for name, _ in functions(ast.parse(text)):  # every function, for the model too: not only those
                    by_function[(path, name)] = []  # a procedural strategy has a bug for
            except SyntaxError:
                continue
            for mutation in mutations(path, text, self.options.strategies):
                by_function[(path, mutation.function)].append(mutation)
        rng = random.Random(self.options.seed)
        order = sorted(by_function)
        rng.shuffle(order)
        scoped: dict[tuple[str, str], tuple[str, ...]] = {}
        for key in order:
            path, function = key
            if key in functions_out:
                if by_function[key]:
                    self.discarded["in an evaluation set's gold patch (decontaminated)"] += len(by_function[key])
                continue
            names = [function.split(".")[-1], function.split(".")[0]] if "." in function else [function]
            for name in names:
                pattern = re.compile(rf"\b{re.escape(name)}\b")
                found = tuple(f for f, text in tests.items() if pattern.search(text))
                if found:
                    scoped[key] = found
                    break
            else:
                if by_function[key]:
                    self.discarded["no test file names the function"] += len(by_function[key])
            rng.shuffle(by_function[key])
        return _Plan(order, by_function, scoped)

    async def _ask_for_rewrites(self, plan: _Plan) -> dict[str, int]:
        """The model's bugs for the first `model_rewrites` functions of the plan, each first in its function's list
        (so it is tried before the procedural ones); returns how many replies were usable and why the rest were not."""
        assert self.rewriter is not None
        outcome: Counter[str] = Counter()
        targets = [key for key in plan.order if key in plan.scoped][: self.options.model_rewrites]
        for n, (path, function) in enumerate(targets):
            self.progress(f"asking the model for a bug in {path}:{function} ({n + 1}/{len(targets)})")
            proposal = await self.rewriter.propose(path, read_at(self.source, path), function, n)
            if isinstance(proposal, Mutation):
                if proposal.source in {m.source for m in plan.by_function[(path, function)]}:
                    outcome["the same as a procedural bug"] += 1
                    continue
                plan.by_function[(path, function)].insert(0, proposal)
                outcome["usable"] += 1
            else:
                outcome[proposal] += 1
        return dict(outcome)

    def _round_robin(self, plan: _Plan) -> list[Candidate]:
        result: list[Candidate] = []
        rank = 0
        while True:
            added = False
            for key in plan.order:
                if key in plan.scoped and rank < len(plan.by_function[key]):
                    result.append(Candidate(len(result), plan.by_function[key][rank], plan.scoped[key]))
                    added = True
            if not added:
                return result
            rank += 1

    # ---- trials ----

    async def trial(self, snapshot: str, candidate: Candidate, stable: set[str]) -> Trial:
        started = time.monotonic()
        result = Trial(candidate, ran=True)
        try:
            log, late = await self._run_tests(
                snapshot, list(candidate.test_files), candidate.mutation, timeout_s=self.trial_timeout_s
            )
        except OrchardError as err:
            result.reason = f"sandbox error ({type(err).__name__})"
            result.log = str(err)
            return result
        result.seconds = time.monotonic() - started
        result.log = log
        if late:
            result.reason = "the tests ran past the trial timeout (a loop that never ends?)"
            return result
        statuses = parse_log_pytest_v2(log)
        scoped = sorted(t for t in stable if t.split("::", 1)[0] in candidate.test_files)
        result.fail_to_pass = [t for t in scoped if not passed(t, statuses)]
        result.pass_to_pass = [t for t in scoped if passed(t, statuses)]
        if not result.fail_to_pass:
            result.reason = "no test caught it"
        return result

    async def run(self) -> Result:
        started = time.monotonic()
        options = self.options
        self.progress(f"building the environment of {self.source.origin}")
        prepared = await builder_for(self.client).prepare(self.base)
        files = files_at(self.source)
        test_files = [f for f in files if is_test_file(f)]
        if not test_files:
            raise FailedPrecondition(f"{self.source.origin} has no test files (test_*.py or *_test.py)")
        functions_out, tests_out, ids_out = self.excluded()
        stable, base_figures = await self.base_tests(prepared.snapshot_id, test_files)
        stable -= tests_out
        if not stable:
            raise FailedPrecondition(f"no test of {self.source.origin} passes twice at base; nothing can catch a bug")
        plan = self._plan(files, functions_out)
        if self.rewriter is not None:
            self.rewrites = await self._ask_for_rewrites(plan)
        candidates = self._round_robin(plan)
        if options.max_candidates:
            candidates = candidates[: options.max_candidates]
        self.progress(
            f"{len(stable)} stable tests at base; trying up to {len(candidates)} candidate bugs, "
            f"{options.concurrency} at a time"
        )
        trials: dict[int, Trial] = {}
        kept_so_far: Counter[tuple[str, str]] = Counter()
        slots = asyncio.Semaphore(options.concurrency)
        deadline = started + options.budget_s
        of_function: dict[tuple[str, str], list[int]] = defaultdict(list)  # candidate indices, in order
        for c in candidates:
            of_function[(c.mutation.path, c.mutation.function)].append(c.index)

        async def one(candidate: Candidate) -> None:
            async with slots:
                key = (candidate.mutation.path, candidate.mutation.function)
                if time.monotonic() > deadline:
                    return
                earlier = (i for i in of_function[key] if i < candidate.index)
                if all(i in trials for i in earlier) and kept_so_far[key] >= options.max_per_function:
                    trials[candidate.index] = Trial(candidate, reason=f"function cap ({options.max_per_function})")
                    return
                done = await self.trial(prepared.snapshot_id, candidate, stable)
                trials[candidate.index] = done
                if not done.reason:
                    kept_so_far[key] += 1
                tried = len(trials)
                self.progress(
                    f"tried {tried}/{len(candidates)} candidates, {sum(not t.reason for t in trials.values())} "
                    f"caught by tests, {time.monotonic() - started:.0f}s"
                )

        async with asyncio.TaskGroup() as group:
            for candidate in candidates:
                group.create_task(one(candidate))
        selected = self._select(candidates, trials, ids_out)
        if self.writer is not None:
            await self._write_statements(selected)
        records = sorted((record for record, _ in selected), key=lambda r: str(r["instance_id"]))
        return Result(records, self._summary(candidates, trials, records, base_figures, time.monotonic() - started))

    async def _write_statements(self, selected: list[tuple[dict[str, Any], Trial]]) -> None:
        """The model's statements in place of the template's, where the model's text is usable."""
        assert self.writer is not None
        for n, (record, trial) in enumerate(selected, 1):
            self.progress(f"writing problem statements with the model: {n}/{len(selected)}")
            mutation = trial.candidate.mutation
            text = await self.writer.write(
                self.source.name,
                trial.fail_to_pass,
                trial.log,
                mutation.removed + mutation.added,
                trial.candidate.index,
            )
            if text is None:
                record["synthesis"]["writer"] = "template (the model's text quoted the change or said nothing)"
            else:
                record["problem_statement"] = text
                record["synthesis"]["writer"] = "model"

    # ---- selection and output ----

    def _select(
        self, candidates: list[Candidate], trials: dict[int, Trial], ids_out: set[str]
    ) -> list[tuple[dict[str, Any], Trial]]:
        """The tasks, decided in candidate order: caught, not a duplicate, under the function's cap."""
        per_function: Counter[tuple[str, str]] = Counter()
        seen: set[tuple[str, str, frozenset[str]]] = set()
        records: list[tuple[dict[str, Any], Trial]] = []
        for candidate in candidates:
            trial = trials.get(candidate.index)
            if trial is None:
                self.discarded["not tried (budget spent)"] += 1
                continue
            mutation = candidate.mutation
            key = (mutation.path, mutation.function)
            if not trial.reason and (*key, frozenset(trial.fail_to_pass)) in seen:
                trial.reason = "same failing tests as another bug in the function"
            elif not trial.reason and per_function[key] >= self.options.max_per_function:
                trial.reason = f"function cap ({self.options.max_per_function})"
            task_id = self.task_id(mutation)
            if not trial.reason and task_id in ids_out:
                trial.reason = "its id is in an evaluation set (decontaminated)"
            statement = ""
            if not trial.reason:
                try:
                    statement = statements.template(
                        self.source.name, trial.fail_to_pass, trial.log, mutation.removed + mutation.added
                    )
                except ValueError:
                    trial.reason = "a statement would quote the change"
            if trial.reason:
                self.discarded[trial.reason] += 1
                continue
            seen.add((*key, frozenset(trial.fail_to_pass)))
            per_function[key] += 1
            commit, patch = task_commit(self.source, task_id, mutation.path, mutation.source)
            records.append(
                (
                    {
                        "instance_id": task_id,
                        "repo": self.source.name,
                        "base_commit": commit,
                        "problem_statement": statement,
                        "patch": patch,
                        "test_patch": "",
                        "FAIL_TO_PASS": trial.fail_to_pass,
                        "PASS_TO_PASS": trial.pass_to_pass,
                        "version": self.source.base_commit[:12],
                        "environment": self.spec.model_dump(mode="json"),
                        "test_cmd": self.command,
                        "synthesis": {
                            "source": self.source.origin,
                            "base_commit": self.source.base_commit,
                            "strategy": mutation.strategy,
                            "file": mutation.path,
                            "function": mutation.function,
                            "line": mutation.line,
                            "seed": self.options.seed,
                            "candidate": candidate.index,
                            "writer": "template",
                        },
                    },
                    trial,
                )
            )
        return records

    def task_id(self, mutation: Mutation) -> str:
        function = re.sub(r"[^A-Za-z0-9_]+", "-", mutation.function).strip("-")
        return f"{self.source.name}-{function}-{mutation.strategy.replace('_', '-')}-{mutation.key[:8]}"

    def _summary(
        self,
        candidates: list[Candidate],
        trials: dict[int, Trial],
        records: list[dict[str, Any]],
        base: dict[str, Any],
        seconds: float,
    ) -> dict[str, Any]:
        tried = [t for t in trials.values() if t.ran]
        tried_by = Counter(t.candidate.mutation.strategy for t in tried)
        kept_by = Counter(r["synthesis"]["strategy"] for r in records)
        failing = [len(r["FAIL_TO_PASS"]) for r in records]
        return {
            "source": self.source.origin,
            "base_commit": self.source.base_commit,
            "environment": self.spec.key(),
            "options": {**asdict(self.options), "strategies": list(self.options.strategies)},
            "tests_at_base": base,
            "candidates": len(candidates),
            "tried": len(tried),
            "kept": len(records),
            "discarded": dict(sorted(self.discarded.items(), key=lambda kv: -kv[1])),
            "per_strategy": {
                s: {
                    "tried": tried_by[s],
                    "kept": kept_by[s],
                    "kept_fraction": round(kept_by[s] / tried_by[s], 3) if tried_by[s] else None,
                }
                for s in self.options.strategies
            },
            "model_rewrites": self.rewrites,
            "statements": dict(Counter(str(r["synthesis"]["writer"]) for r in records)),
            "per_file": dict(sorted(Counter(r["synthesis"]["file"] for r in records).items())),
            "seconds": round(seconds, 1),
            "seconds_per_task": round(seconds / len(records), 1) if records else None,
            "trial_seconds_median": _median(t.seconds for t in tried if t.seconds),
            "kept_trial_seconds_median": _median(t.seconds for t in tried if not t.reason),
            "difficulty": {
                "fail_to_pass_median": statistics.median(failing) if failing else None,
                "fail_to_pass_1": sum(n == 1 for n in failing),
                "fail_to_pass_2_to_5": sum(2 <= n <= 5 for n in failing),
                "fail_to_pass_over_5": sum(n > 5 for n in failing),
            },
        }


def _median(values: Iterable[float]) -> float | None:
    found = list(values)
    return round(statistics.median(found), 2) if found else None


def write(result: Result, out: Path, source: Source) -> Path:
    """The task file (JSON lines, `repo_dir` relative to it) and its summary beside it (<out>.summary.json)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    repo_dir = os.path.relpath(source.repo_dir.resolve(), out.parent.resolve())
    lines = [json.dumps({**r, "repo_dir": repo_dir}, sort_keys=False) for r in result.records]
    out.write_text("".join(line + "\n" for line in lines))
    summary = out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")
    summary.write_text(json.dumps(result.summary, indent=2) + "\n")
    return summary
