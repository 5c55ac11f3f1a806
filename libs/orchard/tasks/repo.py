"""Setting a task's repository up in a sandbox at its base commit: from local files (made a git repo with a
deterministic commit, so `base_commit` is checkable) or from the image (reset to `base_commit`)."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from orchard.errors import FailedPrecondition
from orchard.sdk import AsyncSandbox
from orchard.tasks.instance import TaskInstance

SANDBOX_ENV = {
    "GIT_AUTHOR_NAME": "orchard",
    "GIT_AUTHOR_EMAIL": "orchard@localhost",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "orchard",
    "GIT_COMMITTER_EMAIL": "orchard@localhost",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""Environment of task sandboxes: a fixed git identity and date (the base commit's hash depends only on the
files), no pagers, and no bytecode files to pollute `git diff`."""
SETUP_TIMEOUT_S = 300.0
UPLOAD_CONCURRENCY = 8


def repo_files(repo_dir: Path) -> list[Path]:
    """The files of a local repository folder, sorted, without caches or a .git folder."""
    skip = {".git", "__pycache__", ".pytest_cache"}
    return sorted(p for p in repo_dir.rglob("*") if p.is_file() and not skip & set(p.relative_to(repo_dir).parts))


async def setup_repo(sandbox: AsyncSandbox, instance: TaskInstance, timeout_s: float = SETUP_TIMEOUT_S) -> str:
    """Put the repository at its base state into `instance.workdir` and return the HEAD commit.

    Raises FailedPrecondition when the files are missing, a setup command fails, or the commit differs
    from `instance.base_commit`.
    """
    workdir = shlex.quote(instance.workdir)
    if instance.repo_dir is not None:
        files = repo_files(instance.repo_dir)
        if not files:
            raise FailedPrecondition(f"task {instance.instance_id}: repo_dir {instance.repo_dir} holds no files")
        slots = asyncio.Semaphore(UPLOAD_CONCURRENCY)

        async def upload(path: Path) -> None:
            async with slots:
                relative = path.relative_to(instance.repo_dir).as_posix()  # type: ignore[arg-type]
                await sandbox.upload_file(path, f"{instance.workdir}/{relative}", mode=0o644)

        await asyncio.gather(*(upload(p) for p in files))
        script = (
            f"set -e; cd {workdir}; git init -q; git add -A; git commit -q -m base; "
            f"{'; '.join(instance.setup_commands) + ';' if instance.setup_commands else ''} git rev-parse HEAD"
        )
    else:
        if not instance.base_commit:
            raise FailedPrecondition(f"task {instance.instance_id} has neither repo_dir nor base_commit; give one")
        script = (
            f"set -e; cd {workdir}; git reset -q --hard {shlex.quote(instance.base_commit)}; git clean -fdq; "
            f"{'; '.join(instance.setup_commands) + ';' if instance.setup_commands else ''} git rev-parse HEAD"
        )
    result = await sandbox.exec(script, timeout=timeout_s, env=SANDBOX_ENV)
    if not result.succeeded:
        raise FailedPrecondition(
            f"task {instance.instance_id}: repository setup failed ({result.status}, exit "
            f"{result.exit_code}): {(result.stdout + result.stderr)[-2000:]}"
        )
    head = result.stdout.strip().splitlines()[-1]
    if instance.base_commit and head != instance.base_commit:
        raise FailedPrecondition(
            f"task {instance.instance_id}: the repository files make commit {head}, not "
            f"base_commit {instance.base_commit}; the files changed since the task was "
            f"written: restore them or update base_commit"
        )
    return head
