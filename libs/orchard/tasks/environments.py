"""Environments of real repositories: built once from a spec, kept as snapshots, forked for every rollout and grade.

    image (a Debian suite's Python + the spec's Debian packages; built by the env service)
      -> environment snapshot: a venv that is the sandbox's python, pip and pytest, holding pip_packages
        -> instance snapshot: the repository at base_commit, pre_install and install run in it

Packages come from the registries through this machine: `pip download` here into a wheelhouse (cached under
~/.cache/orchard/wheels), copied into the sandbox, where pip installs from it alone (/etc/pip.conf: no index).
Sandboxes never get network. Both snapshots are kept (they outlive restarts of the env service) and labelled
with a hash of what made them: a build finds and reuses them, and rebuilds only what a changed spec, image or
repository changes. Each build step's output goes to a log; a failure names the step and ends with its log tail.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchard.errors import FailedPrecondition, InvalidArgument
from orchard.sdk import AsyncSandbox, AsyncSandboxClient
from orchard.tasks.envspec import EnvSpec
from orchard.tasks.instance import TaskInstance
from orchard.tasks.repo import SANDBOX_ENV, repo_files

log = logging.getLogger("orchard.tasks.environments")

WHEELS = "/opt/orchard/wheels"
VENV = "/opt/orchard/venv"
VENV_COMMANDS = ("python", "python3", "pip", "pip3", "pytest")
"""Linked into /usr/local/bin (first on the sandbox's PATH): the venv's, not the image's, answer to these."""
LABEL_ENV, LABEL_INSTANCE, LABEL_HEAD = "orchard.env", "orchard.instance", "orchard.head"
BUILD_TOOLS = ("pip", "setuptools", "wheel")
"""Always in the wheelhouse: `pip install -e .` builds the project (offline, so its backend must be there)."""
STEP_TIMEOUT_S = 1800.0
BUILD_SANDBOX_TTL_S = 7200.0
LOG_TAIL = 3000
MAX_FILL_ROUNDS = 12
MISSING = re.compile(r"No matching distribution found for (.+)")

Progress = Callable[[str], None]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "orchard"


@dataclass(frozen=True)
class Prepared:
    """An instance's built state: the snapshot its sandboxes fork, and the commit its repository is at."""

    snapshot_id: str
    head: str
    reused: bool
    """True when it was built before (this call only found it)."""
    seconds: float


class BuildError(FailedPrecondition):
    """A build step failed; the message names the step and ends with its output."""


# ---- the wheelhouse, on this machine ----


def project_requirements(repo_dir: Path) -> list[str]:
    """What installing the project needs besides pip_packages: its build backend (pyproject's build-system) and
    its declared dependencies (PEP 621 `dependencies`, or setup.cfg's install_requires)."""
    needs: list[str] = []
    pyproject = repo_dir / "pyproject.toml"
    if pyproject.is_file():
        data = tomllib.loads(pyproject.read_text())
        needs += data.get("build-system", {}).get("requires", [])
        needs += data.get("project", {}).get("dependencies", [])
    setup_cfg = repo_dir / "setup.cfg"
    if setup_cfg.is_file():
        import configparser

        cfg = configparser.ConfigParser()
        cfg.read_string(setup_cfg.read_text())
        if cfg.has_option("options", "install_requires"):
            needs += [line.strip() for line in cfg.get("options", "install_requires").splitlines() if line.strip()]
    return [n for n in dict.fromkeys(needs) if n]


def wheelhouse(requirements: list[str], python: str, cache: Path) -> Path:
    """Wheels of `requirements` and everything they need, for CPython `python` on this platform, downloaded
    here (through this machine's network and pip settings) once and cached by the requirement list."""
    reqs = sorted(set(requirements) | set(BUILD_TOOLS))
    key = hashlib.sha256(json.dumps([python, reqs]).encode()).hexdigest()[:16]
    target = cache / "wheels" / key
    if (target / ".complete").exists():
        return target
    tmp = Path(
        tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent if target.parent.exists() else _mkdirs(target.parent))
    )
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(tmp),
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--platform",
        "manylinux2014_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
        "--platform",
        "linux_x86_64",
        *reqs,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        raise BuildError(
            f"downloading the Python packages failed (pip download for Python {python}: "
            f"{' '.join(reqs)}): {(done.stdout + done.stderr)[-LOG_TAIL:]}"
        )
    (tmp / ".complete").write_text(json.dumps(reqs))
    tmp.rename(target) if not target.exists() else subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return target


def _mkdirs(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tar_of(folder: Path) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            if not path.name.startswith("."):
                tar.add(path, arcname=path.name)
    return out.getvalue()


def repo_bundle(repo_dir: Path, commit: str) -> tuple[bytes, str]:
    """A git bundle of `commit` and its ancestors only (no later commit, no other ref), and the full hash."""

    def git(*args: str, cwd: Path | None = None) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"git {' '.join(args)} failed for {repo_dir}: {done.stderr.strip()[-1000:]}")
        return done.stdout.strip()

    full = git("-C", str(repo_dir), "rev-parse", "--verify", f"{commit or 'HEAD'}^{{commit}}")
    with tempfile.TemporaryDirectory() as tmp:
        git("init", "-q", "--bare", tmp)
        git("-C", tmp, "fetch", "-q", "--no-tags", str(repo_dir.resolve()), full)
        git("-C", tmp, "update-ref", "refs/heads/main", full)
        bundle = Path(tmp) / "repo.bundle"
        git("-C", tmp, "bundle", "create", "-q", str(bundle), "refs/heads/main")
        return bundle.read_bytes(), full


def is_git_repo(path: Path) -> bool:
    """A work tree with its .git, or a bare repository."""
    return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())


# ---- the builds, through the env service ----


class Builder:
    """Builds (or finds) the environments and instance states of tasks on one env service, one at a time per
    environment: concurrent rollouts of a new instance wait for one build instead of starting several."""

    def __init__(
        self,
        client: AsyncSandboxClient,
        *,
        cache: Path | None = None,
        logs: Path | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._client = client
        self._cache = cache or default_cache_dir()
        self._logs = logs or self._cache / "env-builds"
        self._progress = progress or (lambda message: None)
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def prepare(self, instance: TaskInstance) -> Prepared:
        """The instance's snapshot (repository at base, installed), building what is missing."""
        spec = instance.environment
        if spec is None:
            raise InvalidArgument(
                f"task {instance.instance_id} has no environment spec; give it `environment`, "
                "`install_config` or --env-specs",
                field="environment",
            )
        started = time.monotonic()
        key = instance_key(instance, spec)
        async with self._lock(key):
            found = await self._client.list_snapshots({LABEL_INSTANCE: key})
            if found:
                snap = found[0]
                return Prepared(snap.snapshot_id, snap.labels.get(LABEL_HEAD, ""), True, time.monotonic() - started)
            env_snapshot = await self.environment(spec)
            self._progress(f"{instance.instance_id}: installing the repository into environment {spec.key()}")
            snapshot_id, head = await self._build_instance(instance, spec, env_snapshot, key)
        return Prepared(snapshot_id, head, False, time.monotonic() - started)

    async def environment(self, spec: EnvSpec) -> str:
        """The environment's snapshot id, built (image, wheelhouse, venv) when missing."""
        key = spec.key()
        async with self._lock(f"env-{key}"):
            found = await self._client.list_snapshots({LABEL_ENV: key})
            if found:
                return found[0].snapshot_id
            self._progress(f"environment {key}: image {spec.image}")
            await self._client.build_image(
                spec.image,
                suite=spec.suite if spec.packages else "",
                packages=spec.image_packages,
                description=f"Python {spec.python} ({spec.suite}) with {' '.join(spec.packages)}",
                progress=lambda stage, done, total, message: self._progress(
                    f"environment {key}: image [{stage}] {done}{f'/{total}' if total else ''} {message}"
                ),
            )
            self._progress(f"environment {key}: downloading {len(spec.venv_requirements)} Python packages")
            wheels = await asyncio.to_thread(wheelhouse, list(spec.venv_requirements), spec.python, self._cache)
            self._progress(f"environment {key}: installing them into a venv")
            return await self._build_environment(spec, key, wheels)

    async def _build_environment(self, spec: EnvSpec, key: str, wheels: Path) -> str:
        log_path = self._log(f"env-{key}")
        sandbox = await self._client.create_sandbox(
            spec.image, env=SANDBOX_ENV, timeout=BUILD_SANDBOX_TTL_S, labels={"orchard.role": "env-build"}
        )
        async with sandbox:
            await sandbox.upload_content(_tar_of(wheels), "/tmp/wheels.tar")
            links = " ".join(f"/usr/local/bin/{c}" for c in VENV_COMMANDS)
            requirements = " ".join(shlex.quote(r) for r in spec.venv_requirements)
            await self._step(
                sandbox,
                log_path,
                "unpack the wheelhouse and point pip at it",
                (
                    f"mkdir -p {WHEELS} && tar -xf /tmp/wheels.tar -C {WHEELS} && rm /tmp/wheels.tar && "
                    f"printf '[global]\\nno-index = true\\nfind-links = {WHEELS}\\n' > /etc/pip.conf"
                ),
            )
            # python and python3 are wrappers, not links: Python finds its venv (pyvenv.cfg) next to the path it
            # was started by, so a link elsewhere would run the image's Python with the image's packages.
            wrappers = " && ".join(
                f"printf '#!/bin/sh\\nexec {VENV}/bin/{c} \"$@\"\\n' > /usr/local/bin/{c} && "
                f"chmod 755 /usr/local/bin/{c}"
                for c in ("python", "python3")
            )
            await self._step(
                sandbox,
                log_path,
                f"create the venv (Python {spec.python})",
                (
                    f"python3 -m venv {VENV} && rm -f {links} && {wrappers} && for c in pip pip3 pytest; do "
                    f"ln -s {VENV}/bin/$c /usr/local/bin/$c; done"
                ),
            )
            await self._offline(
                sandbox,
                log_path,
                "install the Python packages",
                spec.python,
                f"{VENV}/bin/pip install -q --upgrade {' '.join(BUILD_TOOLS)} && "
                f"{VENV}/bin/pip install -q {requirements}",
            )
            snap = await sandbox.snapshot({LABEL_ENV: key, "orchard.python": spec.python}, keep=True)
        return snap.snapshot_id

    async def _build_instance(
        self, instance: TaskInstance, spec: EnvSpec, env_snapshot: str, key: str
    ) -> tuple[str, str]:
        log_path = self._log(f"instance-{instance.instance_id}-{key}")
        repo_dir = instance.repo_dir
        extra: list[str] = project_requirements(repo_dir) if repo_dir is not None else []
        sandbox = await self._client.create_sandbox(
            from_snapshot=env_snapshot,
            env=SANDBOX_ENV,
            timeout=BUILD_SANDBOX_TTL_S,
            labels={"orchard.role": "env-build"},
        )
        async with sandbox:
            if extra:
                wheels = await asyncio.to_thread(wheelhouse, extra, spec.python, self._cache)
                await sandbox.upload_content(_tar_of(wheels), "/tmp/wheels.tar")
                await self._step(
                    sandbox,
                    log_path,
                    "add the project's own requirements to the wheelhouse",
                    f"tar -xf /tmp/wheels.tar -C {WHEELS} && rm /tmp/wheels.tar",
                )
            workdir = shlex.quote(instance.workdir)
            if repo_dir is not None and is_git_repo(repo_dir):
                bundle, head = await asyncio.to_thread(repo_bundle, repo_dir, instance.base_commit)
                await sandbox.upload_content(bundle, "/tmp/repo.bundle")
                await self._step(
                    sandbox,
                    log_path,
                    f"check out {head[:12]} (its history only)",
                    (
                        f"rm -rf {workdir} && git clone -q --branch main /tmp/repo.bundle {workdir} && cd {workdir} && "
                        "git remote remove origin && rm /tmp/repo.bundle"
                    ),
                )
            elif repo_dir is not None:
                files = repo_files(repo_dir)
                if not files:
                    raise BuildError(f"task {instance.instance_id}: repo_dir {repo_dir} holds no files")
                tar = io.BytesIO()
                with tarfile.open(fileobj=tar, mode="w") as archive:
                    for path in files:
                        archive.add(path, arcname=path.relative_to(repo_dir).as_posix())
                await sandbox.upload_content(tar.getvalue(), "/tmp/repo.tar")
                await self._step(
                    sandbox,
                    log_path,
                    "put the repository's files in place and commit them",
                    (
                        f"mkdir -p {workdir} && tar -xf /tmp/repo.tar -C {workdir} && rm /tmp/repo.tar && cd {workdir} "
                        "&& git init -q && git add -A && git commit -q -m base"
                    ),
                )
            else:
                if not instance.base_commit:
                    raise BuildError(f"task {instance.instance_id} has neither repo_dir nor base_commit")
                await self._step(
                    sandbox,
                    log_path,
                    f"reset the image's repository to {instance.base_commit[:12]}",
                    f"cd {workdir} && git reset -q --hard {shlex.quote(instance.base_commit)} && git clean -fdq",
                )
            for number, line in enumerate([*spec.pre_install, *instance.setup_commands], 1):
                await self._step(
                    sandbox, log_path, f"pre_install line {number}: {line[:60]}", f"cd {workdir} && {line}"
                )
            await self._offline(
                sandbox, log_path, f"install: {spec.install[:60]}", spec.python, f"cd {workdir} && {spec.install}"
            )
            # What the install wrote into the work tree (an egg-info, a build folder) is no part of any patch.
            head = (
                await self._step(
                    sandbox,
                    log_path,
                    "record the base commit",
                    (
                        f"cd {workdir} && git status --porcelain --untracked-files=all | sed -n 's/^?? //p' "
                        '>> .git/info/exclude && test -z "$(git status --porcelain)" && git rev-parse HEAD'
                    ),
                )
            ).strip()
            head = head.splitlines()[-1]
            if instance.base_commit and head != instance.base_commit:
                raise BuildError(
                    f"task {instance.instance_id}: the repository is at {head}, not base_commit "
                    f"{instance.base_commit}; give repo_dir as a git repository holding it (its history "
                    "is kept), or leave base_commit empty for plain files"
                )
            snap = await sandbox.snapshot(
                {LABEL_INSTANCE: key, LABEL_HEAD: head, "orchard.task": instance.instance_id[:200]}, keep=True
            )
        return snap.snapshot_id, head

    async def _offline(self, sandbox: AsyncSandbox, log_path: Path, step: str, python: str, command: str) -> None:
        """Run a pip command against the sandbox's wheelhouse; a requirement it lacks is downloaded here and
        added, then the command runs again. (pip download evaluates environment markers for this machine's
        Python, so a dependency only an older Python needs, such as exceptiongroup, can be missing.)"""
        for _ in range(MAX_FILL_ROUNDS):
            result = await sandbox.exec(command, timeout=STEP_TIMEOUT_S, env=SANDBOX_ENV)
            with log_path.open("a") as out:
                out.write(f"$ {command}\n{result.stdout}{result.stderr}[exit {result.exit_code}]\n\n")
            missing = MISSING.findall(result.stderr)
            if result.succeeded or not missing:
                break
            requirement = missing[0].split(";", 1)[0].strip()
            self._progress(f"{step}: adding {requirement} to the wheelhouse")
            wheels = await asyncio.to_thread(wheelhouse, [requirement], python, self._cache)
            await sandbox.upload_content(_tar_of(wheels), "/tmp/wheels.tar")
            await self._step(
                sandbox,
                log_path,
                f"add {requirement} to the wheelhouse",
                f"tar -xf /tmp/wheels.tar -C {WHEELS} && rm /tmp/wheels.tar",
            )
        if not result.succeeded:
            raise BuildError(
                f"environment build step {step!r} failed (exit {result.exit_code}; log {log_path}): "
                f"{(result.stdout + result.stderr)[-LOG_TAIL:]}"
            )

    def _log(self, name: str) -> Path:
        self._logs.mkdir(parents=True, exist_ok=True)
        path = self._logs / f"{name}.log"
        path.write_text("")
        return path

    async def _step(self, sandbox: AsyncSandbox, log_path: Path, step: str, command: str) -> str:
        result = await sandbox.exec(command, timeout=STEP_TIMEOUT_S, env=SANDBOX_ENV)
        with log_path.open("a") as out:
            out.write(f"$ {command}\n{result.stdout}{result.stderr}[exit {result.exit_code}]\n\n")
        if not result.succeeded:
            raise BuildError(
                f"environment build step {step!r} failed (exit {result.exit_code}; log {log_path}): "
                f"{(result.stdout + result.stderr)[-LOG_TAIL:]}"
            )
        return result.stdout


def instance_key(instance: TaskInstance, spec: EnvSpec) -> str:
    """A content hash of an instance's built state: its environment, its repository and how it is installed."""
    if instance.repo_dir is not None and is_git_repo(instance.repo_dir):
        done = subprocess.run(
            ["git", "-C", str(instance.repo_dir), "rev-parse", f"{instance.base_commit or 'HEAD'}"],
            capture_output=True,
            text=True,
            check=False,
        )
        source = f"git:{done.stdout.strip() or instance.base_commit}"
    elif instance.repo_dir is not None:
        digest = hashlib.sha256()
        for path in repo_files(instance.repo_dir):
            digest.update(path.relative_to(instance.repo_dir).as_posix().encode() + b"\0" + path.read_bytes())
        source = f"files:{digest.hexdigest()}"
    else:
        source = f"image:{instance.image}:{instance.base_commit}"
    data = [spec.key(), source, instance.workdir, list(spec.pre_install), list(instance.setup_commands), spec.install]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


_builders: dict[int, Builder] = {}


def builder_for(client: AsyncSandboxClient) -> Builder:
    """The Builder of a client (one per client, so concurrent rollouts of a new instance share one build)."""
    found = _builders.get(id(client))
    if found is None or found._client is not client:
        found = _builders[id(client)] = Builder(client)
    return found


async def task_sandbox(
    client: AsyncSandboxClient, instance: TaskInstance, *, labels: dict[str, str], timeout: float
) -> tuple[AsyncSandbox, str]:
    """A sandbox with the instance's repository at its base commit, and that commit: forked from its built state
    when it has an environment (built first if missing), else made from its image and set up (setup_repo)."""
    from orchard.tasks.repo import setup_repo

    if instance.environment is not None:
        prepared = await builder_for(client).prepare(instance)
        sandbox = await client.create_sandbox(
            from_snapshot=prepared.snapshot_id, env=SANDBOX_ENV, timeout=timeout, labels=labels
        )
        return sandbox, prepared.head
    sandbox = await client.create_sandbox(instance.image, env=SANDBOX_ENV, timeout=timeout, labels=labels)
    try:
        return sandbox, await setup_repo(sandbox, instance)
    except BaseException:
        await asyncio.shield(sandbox.delete())
        raise
