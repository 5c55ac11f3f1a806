"""The value model's training set: dedupe on (task, patch hash), the refusal when no task has both outcomes, the
task-level held-out split, per-epoch balance within tasks drawn across runs, batches that keep a task together,
and the loss (BCE + within-task pairs only)."""

from __future__ import annotations

import pytest
import torch

from orchard.errors import FailedPrecondition
from orchard.trainers import value_data
from orchard.trainers.value_loss import value_loss
from orchard.types.v1 import types_pb2 as tpb


def traj(task: str, run: str, n: int, resolved: bool | None, patch: str | None = None) -> tpb.Trajectory:
    t = tpb.Trajectory(
        trajectory_id=f"{run}-{task}-{n}",
        task_id=task,
        run_id=run,
        final_patch=patch if patch is not None else f"--- a/x.py\n+++ b/x.py\n+v = {n}\n",
        messages=[tpb.Message(role=tpb.ROLE_USER, content=f"Fix {task}.")],
    )
    if resolved is not None:
        status = tpb.OUTCOME_STATUS_RESOLVED if resolved else tpb.OUTCOME_STATUS_UNRESOLVED
        t.rewards.append(tpb.Reward(kind=tpb.REWARD_KIND_OUTCOME, outcome=tpb.OutcomeDetails(status=status)))
    return t


def test_build_dedupes_leaves_out_ungraded_and_renders_like_the_judge() -> None:
    same = "--- a/x.py\n+++ b/x.py\n+fixed = True\n"
    data = value_data.build(
        [
            traj("a", "r1", 0, True, same),
            traj("a", "r2", 1, True, same),  # one patch, twice
            traj("a", "r1", 2, False),
            traj("a", "r1", 3, None),
        ],
        eval_fraction=0,
        seed=0,
    )
    assert [e.trajectory_id for e in data.train] == ["r1-a-0", "r1-a-2"]
    assert data.stats["duplicates_left_out"] == 1 and data.stats["ungraded_left_out"] == 1
    assert data.train[0].text.startswith("## Task\nFix a.") and "## Final patch (files: x.py)" in data.train[0].text


def test_stored_patch_hash_is_the_dedupe_key_when_present() -> None:
    a, b = traj("a", "r1", 0, True), traj("a", "r1", 1, False)
    a.patch_hash = b.patch_hash = "h1"  # the experience store's hash says they are the same patch
    with pytest.raises(FailedPrecondition, match="both a resolved and an unresolved"):
        value_data.build([a, b], eval_fraction=0, seed=0)


def test_no_task_with_both_outcomes_is_refused_with_the_counts() -> None:
    with pytest.raises(FailedPrecondition) as err:
        value_data.build([traj("a", "r", 0, False), traj("b", "r", 1, False)], eval_fraction=0.1, seed=0)
    assert "2 distinct graded candidates over 2 tasks, outcomes: unresolved" in err.value.message


def test_held_out_tasks_are_whole_mixed_tasks_and_at_least_one_stays_for_training() -> None:
    store = [traj(task, "r", n, n % 2 == 0) for task in "abcd" for n in range(4)] + [traj("e", "r", 9, False)]
    data = value_data.build(store, eval_fraction=0.5, seed=1)
    held = {e.task_id for e in data.held_out}
    assert len(held) == 2 and "e" not in held  # drawn from tasks with both outcomes only
    assert not held & {e.task_id for e in data.train}
    everything = value_data.build(store, eval_fraction=0.99, seed=1)
    assert len({e.task_id for e in everything.held_out}) == 3  # never every mixed task
    assert value_data.build(store, eval_fraction=0, seed=1).held_out == []


def test_epochs_balance_each_task_and_spread_over_runs() -> None:
    # Task a: 6 negatives in run r1, 2 in r2, and 2 positives; task b only negatives.
    store = (
        [traj("a", "r1", n, False) for n in range(6)]
        + [traj("a", "r2", n + 10, False) for n in range(2)]
        + [traj("a", "r1", 20, True), traj("a", "r2", 21, True)]
        + [traj("b", "r1", n + 30, False) for n in range(5)]
    )
    data = value_data.build(store, eval_fraction=0, seed=0)
    seen_negatives = set()
    for epoch in range(4):
        groups = value_data.epoch_sample(data, epoch, seed=7)
        by_task = {g[0].task_id: g for g in groups}
        a, b = by_task["a"], by_task["b"]
        assert sum(e.resolved for e in a) == 2 and sum(not e.resolved for e in a) == 2
        assert {e.run_id for e in a if not e.resolved} == {"r1", "r2"}  # round-robin over runs
        assert len(b) == value_data.SINGLE_OUTCOME_PER_EPOCH
        seen_negatives |= {e.trajectory_id for e in a if not e.resolved}
    assert len(seen_negatives) > 2  # later epochs draw other negatives
    assert value_data.epoch_sample(data, 1, seed=7) == value_data.epoch_sample(data, 1, seed=7)  # resumable


def test_batches_keep_a_task_together_when_it_fits() -> None:
    def group(task: str, n: int) -> list[value_data.Example]:
        return [value_data.Example(task, "r", f"{task}{i}", "", i == 0, "") for i in range(n)]

    out = value_data.batches([group("a", 3), group("b", 3), group("c", 5)], size=4)
    assert [[e.task_id for e in b] for b in out] == [["a"] * 3, ["b"] * 3, ["c"] * 4, ["c"]]


def test_value_loss_pairs_only_within_a_task() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0], requires_grad=True)
    loss, parts = value_loss(logits, [True, False, True, False], ["a", "a", "b", "c"], pairwise_weight=1.0)
    assert parts["pairs"] == 1  # (0, 1) only: tasks b and c have one outcome each
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0, 0.0, 1.0, 0.0]))
    pair = torch.nn.functional.softplus(torch.tensor(-3.0))
    assert float(loss.detach()) == pytest.approx(float((bce + pair).detach()))
    loss.backward()
    assert logits.grad is not None and logits.grad[0] < 0 < logits.grad[1]  # pushes the pair apart
    no_pairs, parts = value_loss(logits[:2], [True, False], ["x", "y"], 1.0)
    assert parts["pairs"] == 0 and float(no_pairs.detach()) == pytest.approx(
        float(torch.nn.functional.binary_cross_entropy_with_logits(logits[:2].detach(), torch.tensor([1.0, 0.0])))
    )
