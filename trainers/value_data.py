"""The value model's training set from the experience store (docs/training.md §2.6): graded candidates rendered with the
RPR judge's compact renderer, deduplicated on (task, patch hash), split by task into train and held-out, and
sampled each epoch with positives and negatives balanced within each task and spread across runs.

Choices [I]:
- A distinct (task, patch) is one candidate, whichever runs submitted it; each epoch shows it through one of
  the trajectories that reached it, drawn at random (their logs differ: tests run or not, other steps).
- A task with both outcomes gives, each epoch, all of its minority class and as many of its majority class,
  drawn round-robin across runs (so one large run does not crowd out the others); over the epochs every
  candidate is seen.
- A task with one outcome only teaches no ranking; it adds at most SINGLE_OUTCOME_PER_EPOCH candidates per
  epoch (calibration across tasks).
- The held-out tasks are drawn from the tasks with both outcomes (the only ones where best@N can differ from
  random@N); every one of their graded trajectories is kept, duplicates included, unbalanced, as candidates
  come at evaluation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from orchard.errors import FailedPrecondition
from orchard.trainers.data import resolved
from orchard.types.v1 import types_pb2 as tpb
from orchard.value.metrics import cluster_id
from orchard.value.render import render_candidate

SINGLE_OUTCOME_PER_EPOCH = 2


@dataclass(frozen=True)
class Example:
    """One rendered, graded candidate."""

    task_id: str
    run_id: str
    trajectory_id: str
    text: str
    resolved: bool
    patch: str
    variants: tuple[str, ...] = ()
    """The renderings of the other trajectories that submitted the same patch for the task."""

    def drawn(self, rng: random.Random) -> Example:
        """The candidate as one of the trajectories that reached it shows it."""
        if not self.variants:
            return self
        text = rng.choice((self.text, *self.variants))
        return Example(self.task_id, self.run_id, self.trajectory_id, text, self.resolved, self.patch)


@dataclass
class ValueData:
    """The training and held-out candidates, and what was left out on the way."""

    train: list[Example]
    held_out: list[Example]
    stats: dict[str, float]

    def train_tasks(self) -> dict[str, list[Example]]:
        return _by_task(self.train)


def patch_key(traj: tpb.Trajectory) -> str:
    """The dedupe key of a candidate's patch: its stored hash, else its patch cluster (the normalised patch's hash,
    as the reranker's tie-break uses)."""
    return traj.patch_hash or cluster_id(traj.final_patch)


def graded(traj: tpb.Trajectory) -> bool:
    return any(r.kind == tpb.REWARD_KIND_OUTCOME for r in traj.rewards)


def _by_task(examples: Sequence[Example]) -> dict[str, list[Example]]:
    tasks: dict[str, list[Example]] = {}
    for e in examples:
        tasks.setdefault(e.task_id, []).append(e)
    return tasks


def build(trajectories: Sequence[tpb.Trajectory], *, eval_fraction: float, seed: int) -> ValueData:
    """Rendered, deduplicated candidates split by task; FailedPrecondition when nothing can teach a ranking."""
    distinct: dict[tuple[str, str], Example] = {}
    every: list[Example] = []
    ungraded = duplicates = 0
    for traj in trajectories:
        if not graded(traj):
            ungraded += 1
            continue
        example = Example(
            traj.task_id, traj.run_id, traj.trajectory_id, render_candidate(traj), resolved(traj), traj.final_patch
        )
        every.append(example)
        key = (traj.task_id, patch_key(traj))
        first = distinct.get(key)
        if first is None:
            distinct[key] = example
        else:
            duplicates += 1
            distinct[key] = replace(first, variants=(*first.variants, example.text))
    examples = list(distinct.values())
    tasks = _by_task(examples)
    mixed = sorted(t for t, group in tasks.items() if len({e.resolved for e in group}) == 2)
    if not mixed:
        outcomes = sorted({"resolved" if e.resolved else "unresolved" for e in examples}) or ["none"]
        raise FailedPrecondition(
            f"no task of the dataset has both a resolved and an unresolved candidate ({len(examples)} distinct "
            f"graded candidates over {len(tasks)} tasks, outcomes: {', '.join(outcomes)}; {ungraded} ungraded, "
            f"{duplicates} duplicate patches left out): a value model learns to rank from tasks with both outcomes; "
            "add runs of policies that solve some tasks"
        )
    held: set[str] = set()
    if eval_fraction > 0 and len(mixed) >= 2:
        count = min(len(mixed) - 1, max(1, round(eval_fraction * len(mixed))))
        held = set(random.Random(seed).sample(mixed, count))
    train = [e for e in examples if e.task_id not in held]
    held_out = [e for e in every if e.task_id in held]
    stats = {
        "candidates": float(len(examples)),
        "tasks": float(len(tasks)),
        "tasks_mixed": float(len(mixed)),
        "tasks_held_out": float(len(held)),
        "train_candidates": float(len(train)),
        "held_out_candidates": float(len(held_out)),
        "ungraded_left_out": float(ungraded),
        "duplicates_left_out": float(duplicates),
        "runs": float(len({e.run_id for e in examples})),
        "positive_fraction": sum(e.resolved for e in examples) / len(examples),
    }
    return ValueData(train, held_out, stats)


def _round_robin(examples: list[Example], count: int, rng: random.Random) -> list[Example]:
    """`count` of `examples`, taken in turn from each run (each run's own order shuffled)."""
    runs: dict[str, list[Example]] = {}
    for e in examples:
        runs.setdefault(e.run_id, []).append(e)
    queues = [rng.sample(group, len(group)) for _, group in sorted(runs.items())]
    rng.shuffle(queues)
    picked: list[Example] = []
    while len(picked) < count:
        for q in queues:
            if q and len(picked) < count:
                picked.append(q.pop())
    return picked


def epoch_sample(data: ValueData, epoch: int, seed: int) -> list[list[Example]]:
    """The epoch's candidates grouped by task (groups in a shuffled order): balanced within each task with both
    outcomes, at most SINGLE_OUTCOME_PER_EPOCH from the others."""
    rng = random.Random(seed * 1009 + epoch)
    groups = []
    for _, group in sorted(data.train_tasks().items()):
        pos = [e for e in group if e.resolved]
        neg = [e for e in group if not e.resolved]
        if pos and neg:
            n = min(len(pos), len(neg))
            chosen = _round_robin(pos, n, rng) + _round_robin(neg, n, rng)
        else:
            chosen = _round_robin(group, min(len(group), SINGLE_OUTCOME_PER_EPOCH), rng)
        chosen = [e.drawn(rng) for e in chosen]
        rng.shuffle(chosen)
        groups.append(chosen)
    rng.shuffle(groups)
    return groups


def batches(groups: list[list[Example]], size: int) -> list[list[Example]]:
    """Consecutive batches of at most `size` candidates, a task's candidates kept together where they fit (the
    pairwise loss only sees pairs inside a batch)."""
    out: list[list[Example]] = []
    current: list[Example] = []
    for group in groups:
        if current and len(current) + len(group) > size:
            out.append(current)
            current = []
        for e in group:
            current.append(e)
            if len(current) == size:
                out.append(current)
                current = []
    if current:
        out.append(current)
    return out
