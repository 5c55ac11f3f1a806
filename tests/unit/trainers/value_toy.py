"""The value-model toy (docs/training.md §2.6, CPU toy test): historical runs of five policies of different skill on the
tabular ToyRepair (toy.py beside it), rendered as text; a logistic regression over a hashed bag of tokens trained
with `value_loss` (BCE + beta = 1 within-task pairwise); best-of-8 reranking of a middling policy's fresh candidates
on held-out tasks. Shared by tests/unit/trainers/test_value_learning.py and bench/value_proofs.py; no I/O, no
download.

Choices [I]:
- A policy of skill s puts logit s on the competent action of each state (run the tests, open the failing file,
  edit it, submit) and 0 on the others: skill 1 resolves 5% of its rollouts, 2.5 33%, 4 65% (at most 75% can: see
  EDGE_CASE). The store's five experiments ran in order of skill (like checkpoints of an improving RL run), one run
  of 24 tasks x 8 rollouts each; the evaluation policy has skill 2.5 and its tasks are new.
- The text is what an agent's log shows: each command and its output (`cat` of the buggy file shows the bug unless
  it is fixed; `run_tests` names the failing test, as in the toy, even after a fix) and the final patch (the files
  edited, so equal edits form one patch cluster). Two things keep it from giving the outcome away: on SUBTLE tasks
  the bug reads like correct code (only the failing test's name tells which file to fix, the agent as the model:
  see `rollout`), and on EDGE_CASE tasks the hidden tests fail every fix. Both are fixed per task, as grading is a
  function of the patch.
- Tokens are the words of the text and its ordered line pairs at any distance, hashed into FEATURES buckets
  (crc32, stable across processes); a feature is present or not. With consecutive line pairs only, a linear model
  cannot relate the failing test to the edited file, and best@8 fell as the strong policies' runs came in
  (0.731 after 3 experiments, 0.723 after 5, 5 seeds).
- Training draws batches of whole tasks, so each batch has within-task (resolved, unresolved) pairs; Adam, 30
  rounds over the store (after 10, best@8 was 0.006 lower with 5 experiments than with 3).
- No candidate is excluded before ranking (no empty-patch filter), so best@N measures the model alone; equal
  scores (the constant model) fall to the majority patch cluster: a majority vote, the second baseline.
"""

from __future__ import annotations

import bisect
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import toy

from orchard.errors import FailedPrecondition
from orchard.trainers.value_loss import value_loss
from orchard.value.metrics import TIE_MARGIN, Candidate, best_of_n_report, sigmoid

SKILLS = (1.0, 1.75, 2.5, 3.25, 4.0)
"""The five historical experiments' policies, in the order they ran."""
EVAL_SKILL = 2.5
N_CANDIDATES = 8
SUBTLE = 0.3
"""The share of tasks whose bug does not show when the file is read."""
EDGE_CASE = 0.25
"""The share of tasks whose hidden tests cover an edge case the obvious fix misses: no candidate resolves them,
and nothing in the text says which they are."""
FEATURES = 4096


# 1. Policies and the experience store.


def competent_action(state: int) -> int:
    """The action a careful agent takes in a policy state (decoded as in `toy.state_id`)."""
    edited, opened, known = state % 2, state // 2 % 3, state // 6 - 1
    if edited:
        return toy.SUBMIT
    if opened == 1:
        return toy.EDIT
    return toy.CAT + known if known >= 0 else toy.RUN_TESTS


def skilled_policy(skill: float) -> toy.TabularPolicy:
    """A tabular policy with logit `skill` on every state's competent action."""
    policy = toy.TabularPolicy()
    for state in range(toy.N_STATES):
        policy.logits.data[state, competent_action(state)] = skill
    return policy


def is_subtle(task: toy.Task) -> bool:
    """Whether the task's bug reads like correct code (fixed by its id, so every run of the task agrees)."""
    return _hashed_share(f"subtle/{task.task_id}") < SUBTLE


def _hashed_share(key: str) -> float:
    """A number in [0, 1) fixed by `key` (stable across processes)."""
    return zlib.crc32(key.encode()) % 10_000 / 10_000


def rollout(task: toy.Task, cumulative: list[list[float]], rng: random.Random) -> toy.Episode:
    """`TabularPolicy.rollout`, except that the agent sees what the log shows: reading a subtle bug does not tell
    it which file is buggy (else it would act on what the value model cannot see)."""
    actions: list[int] = []
    w, subtle = toy.World(task.buggy), is_subtle(task)
    while len(actions) < toy.STEP_BUDGET and (not actions or actions[-1] != toy.SUBMIT):
        actions.append(min(bisect.bisect(cumulative[toy.state_id(w)], rng.random()), toy.N_ACTIONS - 1))
        seen = toy.transition(w, actions[-1])
        w = replace(seen, known=w.known) if subtle and toy.CAT <= actions[-1] < toy.RUN_TESTS else seen
    return toy.play(task, actions)


def render(episode: toy.Episode) -> tuple[str, str]:
    """(text, patch): the value model's input (the issue, each command and its output, the final patch) and the
    final patch alone (the files the episode edited)."""
    task, w = episode.task, toy.World(episode.task.buggy)
    lines, edited = ["issue: a test fails"], []
    for a in episode.actions:
        lines.append(f"$ {toy.ACTIONS[a]}" + (f" {toy.FILES[w.open]}" if a == toy.EDIT and w.open >= 0 else ""))
        if toy.CAT <= a < toy.RUN_TESTS:
            shows_bug = a - toy.CAT == w.buggy and not w.fixed and not is_subtle(task)
            lines.append("return xs[: n - 1]" if shows_bug else "return xs[:n]")
        elif a == toy.RUN_TESTS:
            lines.append(f"FAILED test_{toy.FILES[w.buggy]}")
        elif a == toy.LS:
            lines.append(" ".join(toy.FILES))
        elif a == toy.EDIT:
            lines.append("edited" if w.open >= 0 else "error: no file open")
            if w.open >= 0 and toy.FILES[w.open] not in edited:
                edited.append(toy.FILES[w.open])
        if a != toy.SUBMIT:
            w = toy.transition(w, a)
    # The agent's edit is the same wherever it makes it: the patch tells which files it touched.
    patch = "\n".join(f"--- a/{f}\n+++ b/{f}\n@@\n-return xs[: n - 1]\n+return xs[:n]" for f in sorted(edited))
    return "\n".join([*lines, "patch:", patch or "(empty)"]), patch


@dataclass(frozen=True)
class Record:
    """A rollout as the experience store keeps it, reduced to what the value model needs."""

    task_id: str
    run_id: str
    text: str
    patch: str
    resolved: bool


def sample_run(run_id: str, skill: float, tasks: int, samples: int, rng: random.Random) -> list[Record]:
    """One run: `samples` rollouts of a skill-`skill` policy on each of `tasks` new tasks (ids under `run_id`)."""
    policy = skilled_policy(skill)
    cumulative, records = policy.sampler(), []
    for i in range(tasks):
        task = toy.Task(f"{run_id}/t{i}", rng.randrange(len(toy.FILES)))
        edge = _hashed_share(f"edge/{task.task_id}") < EDGE_CASE
        for _ in range(samples):
            episode = rollout(task, cumulative, rng)
            text, patch = render(episode)
            records.append(Record(task.task_id, run_id, text, patch, episode.resolved and not edge))
    return records


def history(seed: int, experiments: int = len(SKILLS), tasks: int = 24, samples: int = 8) -> list[Record]:
    """The store after the first `experiments` experiments (one run each). An experiment's rollouts depend only
    on (seed, experiment), so a smaller store is a prefix of a larger one."""
    return [
        r
        for e in range(experiments)
        for r in sample_run(f"s{seed}/exp{e}", SKILLS[e], tasks, samples, random.Random(f"history/{seed}/{e}"))
    ]


def eval_candidates(seed: int, tasks: int = 64, n: int = N_CANDIDATES) -> list[Record]:
    """Fresh candidates on held-out tasks: n rollouts each of the middling evaluation policy."""
    return sample_run(f"s{seed}/eval", EVAL_SKILL, tasks, n, random.Random(f"eval/{seed}"))


def check_decontaminated(train_task_ids: Sequence[str], eval_task_ids: Sequence[str]) -> None:
    """Raise FailedPrecondition when a training record's task is an evaluation task (the real value job has the
    same guard in trainers/data.py, `decontaminate`)."""
    leaked = sorted(set(train_task_ids) & set(eval_task_ids))
    if leaked:
        raise FailedPrecondition(
            f"{len(leaked)} task(s) of the training history are evaluation tasks: {leaked[:5]}; a value model "
            "trained on them would be scored on tasks it has seen. Drop those records from the history."
        )


# 2. The value model: features, training, scoring.


def featurise(texts: Sequence[str]) -> torch.Tensor:
    """A (len(texts), FEATURES) 0/1 matrix: the hashed words and ordered line pairs of each text."""
    x = torch.zeros(len(texts), FEATURES)
    for row, text in enumerate(texts):
        lines = text.splitlines()
        tokens = [*text.split(), *(f"{a}\n{b}" for i, a in enumerate(lines) for b in lines[i + 1 :])]
        x[row, [zlib.crc32(t.encode()) % FEATURES for t in tokens]] = 1.0
    return x


def new_model(seed: int) -> torch.nn.Linear:
    """A logistic regression with random initial weights (the untrained control)."""
    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, 1)


def train(
    records: Sequence[Record],
    seed: int,
    epochs: int = 30,
    tasks_per_batch: int = 8,
    lr: float = 0.05,
    pairwise_weight: float = 1.0,
) -> torch.nn.Linear:
    """A logistic regression trained on the store with value_loss, in batches of whole tasks."""
    model, rng = new_model(seed), random.Random(f"train/{seed}")
    x = featurise([r.text for r in records])
    by_task: dict[str, list[int]] = {}
    for i, r in enumerate(records):
        by_task.setdefault(r.task_id, []).append(i)
    tasks = list(by_task)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(epochs):
        rng.shuffle(tasks)
        for start in range(0, len(tasks), tasks_per_batch):
            rows = [i for t in tasks[start : start + tasks_per_batch] for i in by_task[t]]
            loss, _ = value_loss(
                model(x[rows]).squeeze(-1),
                [records[i].resolved for i in rows],
                [records[i].task_id for i in rows],
                pairwise_weight,
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def score(model: torch.nn.Linear | None, records: Sequence[Record]) -> list[Candidate]:
    """The records as scored candidates (P(resolved)); with no model every score is 0.5 (ties: majority vote)."""
    if model is None:
        probs = [0.5] * len(records)
    else:
        with torch.no_grad():
            probs = [sigmoid(float(v)) for v in model(featurise([r.text for r in records])).squeeze(-1)]
    return [Candidate(r.task_id, p, r.resolved, r.patch) for r, p in zip(records, probs, strict=True)]


# 3. The proof: train on the store, rerank held-out candidates.


def proof(
    seed: int,
    experiments: int = len(SKILLS),
    tasks: int = 24,
    eval_tasks: int = 128,
    epochs: int = 30,
    pairwise_weight: float = 1.0,
) -> dict[str, object]:
    """The best-of-N report (metrics.best_of_n_report) of a value model trained on the store after `experiments`
    experiments, on fresh candidates of held-out tasks; the store is checked for contamination first."""
    store, candidates = history(seed, experiments, tasks), eval_candidates(seed, eval_tasks)
    check_decontaminated([r.task_id for r in store], [c.task_id for c in candidates])
    return best_of_n_report(score(train(store, seed, epochs, pairwise_weight=pairwise_weight), candidates))


def figures(report: dict[str, Any], n: int = N_CANDIDATES) -> dict[str, float | None]:
    """The headline figures of a best-of-N report: pass@1, random@n, best@n, pass@n, AUC and ECE."""
    row = next(r for r in report["curve"] if r["n"] == n)
    return {
        "pass@1": report["pass@1"],
        f"random@{n}": row["random"],
        f"best@{n}": row["best"],
        f"pass@{n}": row["pass"],
        f"vote@{n}": row["vote"],
        "auc": report["auc"],
        "ece": report["ece"],
    }


def untrained(init: int, seed: int, eval_tasks: int = 128, tie_margin: float = TIE_MARGIN) -> dict[str, object]:
    """The control: the best-of-N report of a model with random weights (torch seed `init`) on the same held-out
    candidates as `proof(seed)`. One random direction can rank well by chance; average many."""
    return best_of_n_report(score(new_model(init), eval_candidates(seed, eval_tasks)), tie_margin=tie_margin)


def majority_vote(seed: int, eval_tasks: int = 128) -> dict[str, object]:
    """The no-model baseline: equal scores, so each task's pick is its largest patch cluster."""
    return best_of_n_report(score(None, eval_candidates(seed, eval_tasks)))
