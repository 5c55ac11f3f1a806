"""The repository a task set is made from, as git: a package's source distribution fetched through pip and
committed once, or a copy of a local git repository; and the commits of its tasks.

Every commit here is made with a fixed author, committer and date, so the same source makes the same hashes (a
regenerated set is identical). A task's commit has no parent: its history shows the buggy state and nothing of
how it was made (a parent would hold the fix, one `git diff HEAD~1` away).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import FailedPrecondition, InvalidArgument

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "orchard",
    "GIT_AUTHOR_EMAIL": "tasks@orchard.invalid",
    "GIT_COMMITTER_NAME": "orchard",
    "GIT_COMMITTER_EMAIL": "tasks@orchard.invalid",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
TASK_REFS = "refs/orchard/tasks"
"""Each task's commit is kept at a ref (the env service fetches what a ref names, and gc keeps it)."""


@dataclass(frozen=True)
class Source:
    """A repository to synthesize from: a git repository, the commit to start at, and how it was got."""

    repo_dir: Path
    base_commit: str
    name: str
    """The task set's `repo` field ("toolz", or the local repository's folder name)."""
    origin: str
    """"sdist toolz==1.0.0" or "repo /path/to/it"."""


def git(repo: Path, *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> str:
    """Run git in `repo` with the fixed identity and dates; FailedPrecondition with its stderr when it fails."""
    done = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **_GIT_ENV, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})},
        check=False,
    )
    if done.returncode != 0:
        raise FailedPrecondition(f"git {' '.join(args[:3])} failed in {repo}: {done.stderr.decode().strip()[-800:]}")
    return done.stdout.decode()


def from_sdist(pin: str, dest: Path) -> Source:
    """`NAME==VERSION`'s source distribution, downloaded through pip (this machine's index settings), unpacked
    into dest/<name>-<version> and committed as one base commit. Kept when it is there already."""
    match = _PIN.match(pin.strip())
    if match is None:
        raise InvalidArgument(f"--sdist takes NAME==VERSION (a pinned package), not {pin!r}", field="sdist")
    name, version = match.groups()
    folder = dest / f"{name}-{version}"
    if (folder / ".git").is_dir():
        return Source(folder, git(folder, "rev-parse", "HEAD").strip(), name, f"sdist {pin}")
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--disable-pip-version-check",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                tmp,
                pin,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        archives = [p for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip", ".tgz"))]
        if done.returncode != 0 or not archives:
            raise FailedPrecondition(
                f"pip could not download the source distribution of {pin}: {(done.stdout + done.stderr)[-1500:]}"
            )
        unpacked = Path(tmp) / "unpacked"
        _extract(archives[0], unpacked)
        roots = [p for p in unpacked.iterdir() if p.is_dir()]
        root = roots[0] if len(roots) == 1 else unpacked
        staging = dest / f".{name}-{version}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        # An sdist's *.egg-info is build output (the install rewrites it); it is no part of the sources.
        shutil.copytree(root, staging, symlinks=True, ignore=shutil.ignore_patterns("*.egg-info"))
    git(staging, "init", "-q", "-b", "main")
    git(staging, "add", "-A", "-f")
    git(staging, "commit", "-q", "-m", f"{name} {version} (source distribution)")
    staging.rename(folder)
    return Source(folder, git(folder, "rev-parse", "HEAD").strip(), name, f"sdist {pin}")


def _extract(archive: Path, into: Path) -> None:
    into.mkdir()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(into)
        return
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")  # no absolute paths, no links out of the folder


def from_repo(path: Path, dest: Path, base: str = "") -> Source:
    """A copy of a local git repository (the tasks' commits go into the copy, never into the user's repository),
    starting at `base` (default: its HEAD)."""
    if not (path / ".git").exists() and not (path / "HEAD").is_file():
        raise InvalidArgument(f"--repo {path} is not a git repository (give a folder with .git)", field="repo")
    commit = git(path, "rev-parse", "--verify", f"{base or 'HEAD'}^{{commit}}").strip()
    folder = dest / f"{path.resolve().name}-{commit[:12]}"
    if not (folder / ".git").is_dir():
        staging = dest / f".{folder.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(path.resolve()), str(staging)], check=True)
        git(staging, "checkout", "-q", "-B", "main", commit)
        staging.rename(folder)
    return Source(folder, commit, path.resolve().name, f"repo {path.resolve()}")


def files_at(source: Source) -> list[str]:
    """The repository's files at its base commit (paths relative to it)."""
    return [p for p in git(source.repo_dir, "ls-tree", "-r", "--name-only", source.base_commit).splitlines() if p]


def read_at(source: Source, path: str) -> str:
    return git(source.repo_dir, "show", f"{source.base_commit}:{path}")


def task_commit(source: Source, task_id: str, path: str, content: str) -> tuple[str, str]:
    """A parentless commit of the base tree with `path` replaced by `content`, kept at a ref; returns its hash and
    the gold patch (the diff from it back to the base)."""
    repo = source.repo_dir
    mode = git(repo, "ls-tree", source.base_commit, "--", path).split()[0]
    blob = git(repo, "hash-object", "-w", "--stdin", stdin=content.encode()).strip()
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}  # a scratch index: the work tree is never touched
        git(repo, "read-tree", source.base_commit, env=index)
        git(repo, "update-index", "--cacheinfo", f"{mode},{blob},{path}", env=index)
        tree = git(repo, "write-tree", env=index).strip()
    commit = git(repo, "commit-tree", tree, "-m", f"{source.name}: task {task_id}").strip()
    git(repo, "update-ref", f"{TASK_REFS}/{task_id}", commit)
    patch = git(repo, "diff", "--no-color", "--no-ext-diff", "--full-index", commit, source.base_commit, "--", path)
    return commit, patch
