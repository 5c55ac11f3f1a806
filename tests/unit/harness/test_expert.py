"""The expert (the distillation teacher) without sandboxes: the gold patch as minimal str_replace edits that
rebuild exactly what the patch makes, and the replies it gives turn by turn (one editor call a hunk, then
submit)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from orchard.errors import InvalidArgument
from orchard.harness import ExpertModel, ModelError, SWEHarness
from orchard.harness.reference import edits
from orchard.harness.scripted import decode
from orchard.tasks import load_instances

pytestmark = pytest.mark.timeout(60)

TASKS = load_instances("toyrepair-extended")


def _edited(task, tmp: Path) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the task's repository with its edits made as the editor makes them (each old_str found once)."""
    assert task.repo_dir is not None
    out = tmp / "edited"
    shutil.copytree(task.repo_dir, out, ignore=shutil.ignore_patterns(".git"))
    for path, old, new in edits(task):
        text = (out / path).read_text()
        assert text.count(old) == 1, (path, old)
        (out / path).write_text(text.replace(old, new))
    return out


@pytest.mark.parametrize("task", TASKS, ids=[t.instance_id for t in TASKS])
def test_edits_rebuild_what_the_gold_patch_makes(task, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    edited = _edited(task, tmp_path)
    assert task.repo_dir is not None
    gold = tmp_path / "gold"
    shutil.copytree(task.repo_dir, gold, ignore=shutil.ignore_patterns(".git"))
    subprocess.run(["git", "apply", "-"], cwd=gold, input=task.patch, text=True, check=True)
    for path in sorted(p.relative_to(gold) for p in gold.rglob("*") if p.is_file()):
        assert (edited / path).read_bytes() == (gold / path).read_bytes(), path
    # Minimal: every edit of a bundled task changes one line and carries no context.
    assert all(len(old.splitlines()) == len(new.splitlines()) == 1 for _, old, new in edits(task))


def test_edits_keep_context_where_the_changed_line_is_not_unique(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "m.py").write_text("def f():\n    return 1\n\n\ndef g():\n    return 1\n")
    patch = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -4,3 +4,3 @@\n \n def g():\n-    return 1\n+    return 2\n"
    task = TASKS[0].model_copy(update={"instance_id": "dup", "patch": patch, "repo_dir": repo})
    assert edits(task) == [("m.py", "def g():\n    return 1", "def g():\n    return 2")]


def test_edits_read_a_git_repository_at_its_base_commit_not_its_work_tree(tmp_path: Path) -> None:
    """A synthesized task's repository has the fixed file in its work tree and the buggy one at base_commit: the
    context that makes an edit unique comes from base_commit's file (there the removed line appears twice)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "m.py").write_text("def f(n):\n    i = 0\n    return i\n    while i < n:\n        i += 1\n    return i\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "buggy"], check=True)
    buggy = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "m.py").write_text("def f(n):\n    i = 0\n    while i < n:\n        i += 1\n    return i\n")
    subprocess.run([*git, "commit", "-q", "-am", "fixed"], check=True)
    patch = (
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,6 +1,5 @@\n def f(n):\n     i = 0\n-    return i\n"
        "     while i < n:\n         i += 1\n     return i\n"
    )
    task = TASKS[0].model_copy(update={"instance_id": "git", "patch": patch, "repo_dir": repo, "base_commit": buggy})
    # From the work tree's file, `    return i` alone would look unique; in the buggy file it is there twice.
    assert edits(task) == [("m.py", "    i = 0\n    return i\n    while i < n:", "    i = 0\n    while i < n:")]


def test_a_patch_that_deletes_a_file_is_refused() -> None:
    patch = "diff --git a/m.py b/m.py\ndeleted file mode 100644\n--- a/m.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x = 1\n"
    task = TASKS[0].model_copy(update={"instance_id": "del", "patch": patch})
    with pytest.raises(InvalidArgument, match="the expert cannot delete files"):
        edits(task)


async def test_replies_are_one_editor_call_a_hunk_then_submit() -> None:
    task = next(t for t in TASKS if t.instance_id.endswith("two-hunks"))
    model = ExpertModel(TASKS)
    harness = SWEHarness(task, client=None)  # type: ignore[arg-type]
    prompt = await model.render(harness.initial_messages(), harness.tools, add_generation_prompt=True)
    calls = []
    for step in range(3):
        reply = await model.generate(prompt.token_ids, 8192, None, {"trajectory_id": "t", "step": str(step)})
        calls += harness.parse(decode(reply.token_ids[:-1])).calls
    assert [(c.name, json.loads(c.arguments).get("command")) for c in calls] == [
        ("editor", "str_replace"),
        ("editor", "str_replace"),
        ("submit", None),
    ]
    assert [tuple(json.loads(c.arguments)[k] for k in ("path", "old_str", "new_str")) for c in calls[:2]] == edits(task)


async def test_a_prompt_of_an_unknown_task_is_a_model_error() -> None:
    model = ExpertModel(TASKS[:1])
    harness = SWEHarness(TASKS[2], client=None)  # type: ignore[arg-type]
    prompt = await model.render(harness.initial_messages(), harness.tools, add_generation_prompt=True)
    with pytest.raises(ModelError, match="does not know the task in this prompt"):
        await model.generate(prompt.token_ids, 8192, None, {"trajectory_id": "t", "step": "0"})
