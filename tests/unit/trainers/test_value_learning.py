"""The value model learns to rerank on the toy (docs/training.md §2.6, CPU toy test; value_toy.py beside it): trained on a
store of five policies' runs, it picks a middling policy's best of 8 fresh candidates on held-out tasks; more runs
in the store do not hurt; an untrained model does not pass the same bar; the store is decontaminated; equal scores
fall to the majority patch cluster."""

from __future__ import annotations

import functools
from statistics import mean

import pytest
import toy
import value_toy

from orchard.errors import FailedPrecondition
from orchard.value.metrics import TIE_MARGIN, Candidate, best_of, rank

SEEDS = range(5)


@functools.cache
def figures(seed: int, experiments: int) -> dict[str, float | None]:
    """The figures of a value model trained on the store after `experiments` experiments (cached across tests)."""
    return value_toy.figures(value_toy.proof(seed, experiments))


def averaged(key: str, experiments: int = len(value_toy.SKILLS)) -> float:
    return mean(float(figures(s, experiments)[key] or 0.0) for s in SEEDS)


def test_reranking_beats_a_random_pick_and_ranks_candidates() -> None:
    """best@8 at least 10 points over random@8 and over the majority vote (no model), AUC over 0.7, averaged over
    seeds; the oracle bounds best@8."""
    best, rand, oracle, auc = averaged("best@8"), averaged("random@8"), averaged("pass@8"), averaged("auc")
    vote = averaged("vote@8")
    print(f"random@8 {rand:.3f}  vote@8 {vote:.3f}  best@8 {best:.3f}  pass@8 {oracle:.3f}  AUC {auc:.3f}")
    assert best >= rand + 0.10
    assert best >= vote + 0.10
    assert auc > 0.7
    assert best <= oracle


def test_more_runs_in_the_store_do_not_reduce_best_at_8() -> None:
    """The store after 1, 2 and all 5 experiments (each a prefix of the next), the same held-out candidates; a
    drop of less than one task in 128 per seed counts as none."""
    curve = [averaged("best@8", experiments) for experiments in (1, 2, len(value_toy.SKILLS))]
    print(f"best@8 after 1, 2, 5 experiments: {[round(b, 3) for b in curve]}")
    assert curve[1] >= curve[0] - 0.005
    assert curve[2] >= curve[1] - 0.005


@pytest.mark.parametrize("tie_margin", [0.0, TIE_MARGIN])
def test_an_untrained_model_ranks_no_better_than_chance(tie_margin: float) -> None:
    """The control: random weights on the same features and candidates, 20 draws (a single random direction can
    reach AUC 0.77 on these structured features), give AUC about 0.5 on average; ranked by score alone they miss
    the best@8 bar, and with the tie margin (near-ties going to the larger patch cluster) they do no better than
    the majority vote without a model."""
    reports = [
        value_toy.figures(value_toy.untrained(init, seed=init % len(SEEDS), tie_margin=tie_margin))
        for init in range(20)
    ]
    auc, best, rand, vote = (mean(float(r[k] or 0.0) for r in reports) for k in ("auc", "best@8", "random@8", "vote@8"))
    print(
        f"untrained, tie margin {tie_margin}: AUC {auc:.3f}  best@8 {best:.3f}  random@8 {rand:.3f}  vote@8 {vote:.3f}"
    )
    assert abs(auc - 0.5) < 0.1
    assert best < (rand + 0.10 if tie_margin == 0 else vote)


def test_the_store_is_decontaminated_against_the_evaluation_tasks() -> None:
    store, candidates = value_toy.history(0, experiments=1, tasks=2), value_toy.eval_candidates(0, tasks=2)
    train_ids, eval_ids = [r.task_id for r in store], [c.task_id for c in candidates]
    value_toy.check_decontaminated(train_ids, eval_ids)  # disjoint by construction
    with pytest.raises(FailedPrecondition, match=r"1 task\(s\) of the training history are evaluation tasks"):
        value_toy.check_decontaminated([*train_ids, eval_ids[0]], eval_ids)


def test_equal_scores_pick_the_majority_patch_cluster() -> None:
    """Two candidates fix b.py by different paths (one patch cluster), one edits a.py first; equal scores pick the
    pair, a higher score still wins over cluster size."""
    task = toy.Task("t", 1)
    runs = [
        [toy.CAT + 0, toy.EDIT, toy.SUBMIT],
        [toy.RUN_TESTS, toy.CAT + 1, toy.EDIT, toy.SUBMIT],
        [toy.CAT + 1, toy.EDIT, toy.SUBMIT],
    ]
    patches = [value_toy.render(toy.play(task, actions))[1] for actions in runs]
    assert patches[1] == patches[2] != patches[0]
    ranked = rank([0.5, 0.5, 0.5], patches)
    assert [r.index for r in ranked] == [1, 2, 0] and ranked[0].cluster_size == 2
    assert rank([0.6, 0.5, 0.5], patches)[0].index == 0
    candidates = [Candidate("t", 0.5, i > 0, p) for i, p in enumerate(patches)]
    assert best_of(candidates).resolved


@pytest.mark.parametrize(("task_id", "shown"), [("t", "return xs[: n - 1]"), ("d", "return xs[:n]")])
def test_render_shows_the_log_and_the_patch_the_model_reads(task_id: str, shown: str) -> None:
    """Task "d" is subtle: its bug reads like correct code, and reading it does not tell the agent either."""
    task = toy.Task(task_id, 1)
    assert value_toy.is_subtle(task) == (task_id == "d")
    text, patch = value_toy.render(toy.play(task, [toy.RUN_TESTS, toy.CAT + 1, toy.EDIT, toy.SUBMIT]))
    assert text.splitlines() == [
        "issue: a test fails",
        "$ run_tests",
        "FAILED test_b.py",
        "$ cat b.py",
        shown,
        "$ edit b.py",
        "edited",
        "$ submit",
        "patch:",
        *patch.splitlines(),
    ]
    assert patch.startswith("--- a/b.py\n+++ b/b.py")
    empty, no_patch = value_toy.render(toy.play(task, [toy.LS, toy.SUBMIT]))
    assert (no_patch, empty.splitlines()[-2:]) == ("", ["patch:", "(empty)"])
