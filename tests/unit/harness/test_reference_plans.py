"""The reference policy's logic without sandboxes: patch surgery (flawed patches of the bundled tasks and of a
multi-hunk patch), plans drawn per rollout (quality, reproducibility, variety), and the `--policy` value."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from orchard.cli.rollout import reference_quality
from orchard.errors import InvalidArgument
from orchard.harness import ModelError, ReferenceModel, SWEHarness
from orchard.harness.model import step_seed
from orchard.harness.reference import (
    FLAWS,
    deletion,
    join_patch,
    last_exit_code,
    mutations,
    partials,
    split_patch,
)
from orchard.harness.scripted import decode
from orchard.tasks import load_instances

pytestmark = pytest.mark.timeout(30)

TASKS = load_instances("toyrepair-extended")
TWO_FILES = """\
diff --git a/m.py b/m.py
index 7eeab3a..cf7b483 100644
--- a/m.py
+++ b/m.py
@@ -1,5 +1,6 @@
 a = 1
-b = 2
+b = 20
+bb = 21
 c = 3
 d = 4
 e = 5
@@ -8,5 +9,5 @@ g = 7
 h = 8
 i = 9
 j = 10
-k = 11
+k = 110
 l = 12
diff --git a/o.py b/o.py
new file mode 100644
index 0000000..4f8736c
--- /dev/null
+++ b/o.py
@@ -0,0 +1 @@
+new = 1
"""
"""A git diff with three hunks in two files, one of them new."""


def changes(patch: str) -> list[str]:
    return [line for line in patch.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.parametrize("patch", [t.patch for t in TASKS] + [TWO_FILES])
def test_patches_survive_a_split_and_join(patch: str) -> None:
    assert join_patch(split_patch(patch)) == patch


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.instance_id)
def test_flawed_patches_of_the_bundled_tasks(task) -> None:  # type: ignore[no-untyped-def]
    """Each mutation changes one added line of the gold patch, never into a line it removes (no change at all);
    the deletion keeps only the removed lines. (That each fails the task's tests is checked in sandboxes.)"""
    gold = changes(task.patch)
    for mutated in mutations(task.patch):
        diff = [(a, b) for a, b in zip(gold, changes(mutated), strict=True) if a != b]
        assert len(diff) == 1 and diff[0][0].startswith("+") and diff[0][1].startswith("+")
        assert "-" + diff[0][1][1:] not in gold
    assert changes(deletion(task.patch)) == [line for line in gold if line.startswith("-")]
    hunks = sum(len(h) for _, h in split_patch(task.patch))
    assert len(partials(task.patch)) == (hunks if hunks > 1 else 0)  # single-hunk patches have no partial version


def test_clamp_has_no_mutation_that_changes_anything() -> None:
    """`x > hi` flipped is the bug itself, and `>=` would pass: the clamp task only gets the other flaws."""
    clamp = next(t for t in TASKS if t.instance_id == "toyrepair-clamp-wrong-comparison")
    assert mutations(clamp.patch) == []


def test_partials_drop_one_hunk_and_remake_the_headers() -> None:
    first, second, third = partials(TWO_FILES)
    assert "@@ -8,5 +8,5 @@ g = 7" in first and "b = 20" not in first and "+new = 1" in first
    assert "@@ -1,5 +1,6 @@" in second and "k = 110" not in second and "+new = 1" in second
    assert "+++ b/o.py" not in third and "new file mode" not in third and "@@ -8,5 +9,5 @@" in third


def test_deletion_of_a_multi_file_patch() -> None:
    deleted = deletion(TWO_FILES)
    assert changes(deleted) == ["-b = 2", "-k = 11"] and "o.py" not in deleted
    assert "@@ -1,5 +1,4 @@" in deleted and "@@ -8,5 +7,4 @@ g = 7" in deleted


def test_mutations_of_a_multi_file_patch() -> None:
    mutated = {next(c for c in changes(m) if c not in changes(TWO_FILES)) for m in mutations(TWO_FILES)}
    assert mutated == {"+b = 21", "+bb = 22", "+k = 111", "+new = 2"}


@pytest.mark.parametrize("quality", [0.0, 0.5, 1.0])
def test_plans_solve_at_the_chosen_rate(quality: float) -> None:
    model = ReferenceModel(TASKS, quality, seed=1)
    plans = [model.plan(t, f"sample {i}") for t in TASKS for i in range(100)]
    solved = sum(p.flaw == "" for p in plans) / len(plans)
    assert abs(solved - quality) < 0.05
    assert {p.flaw for p in plans if p.flaw} <= set(FLAWS)
    if quality < 1:
        kinds = Counter(p.flaw for p in plans if p.flaw)
        assert kinds["mutated"] > kinds["deleted"] > kinds["unchanged"] > 0


def test_better_policies_run_tests_and_retry_more_often() -> None:
    def rates(quality: float) -> tuple[float, float]:
        plans = [ReferenceModel(TASKS, quality).plan(t, str(i)) for t in TASKS for i in range(100)]
        return sum(bool(p.tests) for p in plans) / len(plans), sum(p.retry for p in plans) / len(plans)

    (tests_low, retry_low), (tests_high, retry_high) = rates(0.0), rates(1.0)
    assert tests_low < 0.35 and tests_high > 0.85 and retry_low == 0.0 and retry_high == 1.0


def test_plans_repeat_per_seed_and_rollout_and_vary_otherwise() -> None:
    task = TASKS[0]
    model = ReferenceModel(TASKS, 0.5, seed=3)
    assert model.plan(task, "sample 7") == ReferenceModel(TASKS, 0.5, seed=3).plan(task, "sample 7")
    assert len({str(model.plan(task, f"sample {i}")) for i in range(10)}) > 5
    assert len({str(ReferenceModel(TASKS, 0.5, seed=s).plan(task, "sample 7")) for s in range(10)}) > 5


def test_a_rollout_that_solves_at_some_quality_solves_at_every_higher_one() -> None:
    keys = [(t, str(i)) for t in TASKS for i in range(50)]
    low, high = ReferenceModel(TASKS, 0.3), ReferenceModel(TASKS, 0.6)
    assert all(high.plan(t, k).flaw == "" for t, k in keys if low.plan(t, k).flaw == "")


async def test_generate_follows_one_plan_per_rollout() -> None:
    """Step s of sample i in a seeded run comes with seed step_seed(base, task, i, s): every step reads one plan."""
    task = TASKS[1]
    model = ReferenceModel(TASKS, 0.5)
    harness = SWEHarness(task, client=None)  # type: ignore[arg-type]  # only its prompt is used
    prompt = await model.render(harness.initial_messages(), harness.tools, add_generation_prompt=True)
    for sample in range(3):
        plan = model.plan(task, f"sample {step_seed(7, task.instance_id, sample, 0)}")
        for step in range(2):
            seed = step_seed(7, task.instance_id, sample, step)
            reply = await model.generate(prompt.token_ids, 8192, seed, {"trajectory_id": "t", "step": str(step)})
            assert decode(reply.token_ids[:-1]) == plan.replies[step] and reply.weights_version == "reference-q0.50"
    unseeded = await model.generate(prompt.token_ids, 8192, None, {"trajectory_id": "run-x-0", "step": "0"})
    assert decode(unseeded.token_ids[:-1]) == model.plan(task, "run-x-0").replies[0]


async def test_a_prompt_of_an_unknown_task_is_a_model_error() -> None:
    model = ReferenceModel(TASKS[:1], 1.0)
    harness = SWEHarness(TASKS[2], client=None)  # type: ignore[arg-type]
    prompt = await model.render(harness.initial_messages(), harness.tools, add_generation_prompt=True)
    with pytest.raises(ModelError, match="does not know the task in this prompt"):
        await model.generate(prompt.token_ids, 8192, None, {"trajectory_id": "t", "step": "0"})


def test_last_exit_code() -> None:
    turn = "<|im_start|>{}\n{}<|im_end|>\n"
    prompt = (
        turn.format("user", "x\n[exit code 0]")
        + turn.format("assistant", "y")
        + turn.format("tool", "1 failed\n\n[exit code 1]")
        + "<|im_start|>assistant\n"
    )
    assert last_exit_code(prompt) == 1
    assert last_exit_code(prompt.replace("[exit code 1]", "[the command timed out]")) is None


@pytest.mark.parametrize("quality", [-0.1, 1.5, float("nan")])
def test_quality_must_be_a_probability(quality: float) -> None:
    with pytest.raises(InvalidArgument, match=r"quality must be in \[0, 1\]"):
        ReferenceModel(TASKS, quality)


@pytest.mark.parametrize(("text", "quality"), [("reference:0", 0.0), ("reference:0.25", 0.25), ("reference:1", 1.0)])
def test_policy_flag_values(text: str, quality: float) -> None:
    assert reference_quality(text) == quality


@pytest.mark.parametrize(
    "text", ["reference:1.5", "reference:-1", "reference:", "reference:half", "oracle:0.5", "0.5", "reference:nan"]
)
def test_bad_policy_flag_values(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"give reference:Q with Q a number in \[0, 1\]"):
        reference_quality(text)


CODE_AND_CHANGELOG = """diff --git a/CHANGES.rst b/CHANGES.rst
--- a/CHANGES.rst
+++ b/CHANGES.rst
@@ -1,2 +1,3 @@
 Changes
+- Fix the default port (was 8000, now 8080).
 0.1.0
diff --git a/cfgread/__init__.py b/cfgread/__init__.py
--- a/cfgread/__init__.py
+++ b/cfgread/__init__.py
@@ -3,4 +3,4 @@ import tomli

 def port(text):
-    return tomli.loads(text).get("server", {}).get("port", 8000)
+    return tomli.loads(text).get("server", {}).get("port", 8080)
"""


def test_flaws_land_in_code_never_only_in_a_changelog() -> None:
    """Every flawed attempt of a fix that also edits a changelog breaks the code: no mutation touches the changelog
    line, no partial keeps the whole code fix, and the deletion removes the code fix (keeping the changelog)."""
    from orchard.harness.reference import deletion, mutations, partials

    fix = '+    return tomli.loads(text).get("server", {}).get("port", 8080)'
    muts = mutations(CODE_AND_CHANGELOG)
    assert muts and all(fix not in m and "+- Fix the default port (was 8000, now 8080)." in m for m in muts)
    parts = partials(CODE_AND_CHANGELOG)
    assert parts and all(fix not in p for p in parts)
    deleted = deletion(CODE_AND_CHANGELOG)
    assert fix not in deleted and "-    return" in deleted and "+- Fix the default port" in deleted
