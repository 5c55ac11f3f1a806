"""Real repositories end to end: environments built from specs with real packages fetched through pip (pinned),
kept and forked; the traps a new user hit, each checked: a system copy of a package that shadows the project's
(tomli), a missing binary (less), a reinstall per grade, a later commit reachable with `git log --all`; two Python
versions; `orchard env build`, `orchard tasks validate`, `orchard rollout` and `orchard eval` on the same file.

The repositories are made here, as git repositories with a base commit and a later fix commit. The env service
runs in a process of its own for the module, on one state dir: its kept snapshots are the build cache.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_helpers import needs_sandboxes, orchard, served_env

from orchard import AsyncSandboxClient
from orchard.tasks import load_instances
from orchard.tasks.environments import builder_for, task_sandbox
from orchard.tasks.grading import grade

pytestmark = [needs_sandboxes, pytest.mark.slow, pytest.mark.timeout(900)]

GIT = ["git", "-c", "user.email=dev@example.com", "-c", "user.name=dev"]

CFGREAD = {
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "cfgread"\nversion = "0.1.0"\ndependencies = ["tomli==2.2.1"]\n',
    "cfgread/__init__.py": 'import tomli\n\n\ndef port(text):\n    """The server port of a TOML config, 8080 when '
    'unset."""\n    return tomli.loads(text).get("server", {}).get("port", 8000)\n',
    "tests/test_cfg.py": "import tomli\nfrom cfgread import port\n\n\ndef test_explicit_port():\n    assert port("
    '"[server]\\nport = 9000\\n") == 9000\n\n\ndef test_tomli_is_the_pinned_one():\n'
    '    assert tomli.__file__.startswith("/opt/orchard/venv/")  # not Debian\'s 2.0.1\n',
    "CHANGES.rst": "Changes\n=======\n",
}
CFGREAD_FIX = ("cfgread/__init__.py", '.get("port", 8000)', '.get("port", 8080)')
CFGREAD_TEST = (
    "tests/test_default.py",
    "from cfgread import port\n\n\ndef test_default_port():\n    assert port('') == 8080\n",
)

PAGER = {  # Python 3.9, and a test that needs the `less` binary (as click's pager tests do)
    "setup.py": "from setuptools import setup\n\nsetup(name='pagerkit', version='0.1', packages=['pagerkit'])\n",
    "pagerkit/__init__.py": "import shutil\n\n\ndef pager():\n    return shutil.which('more')\n",
    "tests/test_env.py": "import shutil\nimport sys\n\n\ndef test_python_39():\n    assert sys.version_info[:2] == "
    "(3, 9)\n\n\ndef test_less_is_installed():\n    assert shutil.which('less')\n",
}
PAGER_FIX = ("pagerkit/__init__.py", "shutil.which('more')", "shutil.which('less')")
PAGER_TEST = (
    "tests/test_pager.py",
    "from pagerkit import pager\n\n\ndef test_pager_is_less():\n    assert pager().endswith('/less')\n",
)

SPECS = {
    "local/cfgread": {"python": "3.11", "pip_packages": ["pytest==8.3.4"], "install": "pip install -e ."},
    "local/pagerkit": {
        "0.1": {"python": "3.9", "packages": ["less"], "pip_packages": ["pytest==8.3.4"], "install": "pip install -e ."}
    },
}


def git_repo(
    root: Path, files: dict[str, str], fix: tuple[str, str, str], test: tuple[str, str], changelog: bool = False
) -> dict[str, str]:
    """A git repository with a base commit and a later one that fixes the bug; returns the instance fields."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "base"], check=True)
    base = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path, old, new = fix
    (root / path).write_text((root / path).read_text().replace(old, new))
    if changelog:
        (root / "CHANGES.rst").write_text("Changes\n=======\n\n- the default port is 8080 again\n")
    subprocess.run([*GIT, "-C", str(root), "commit", "-qam", "the fix"], check=True)
    gold = subprocess.run(
        ["git", "-C", str(root), "diff", "HEAD~1", "HEAD"], capture_output=True, text=True, check=True
    ).stdout
    test_path, test_text = test
    lines = test_text.splitlines()
    test_patch = (
        f"diff --git a/{test_path} b/{test_path}\nnew file mode 100644\n--- /dev/null\n+++ b/{test_path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)
    )
    return {"base_commit": base, "patch": gold, "test_patch": test_patch}


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """Two repositories (three instances) and their specs file; returns (tasks, specs, fix commit by repo)."""
    root = tmp_path_factory.mktemp("repos")
    cfg = git_repo(root / "cfgread", CFGREAD, CFGREAD_FIX, CFGREAD_TEST, changelog=True)
    pager = git_repo(root / "pagerkit", PAGER, PAGER_FIX, PAGER_TEST)
    fixes = {
        repo: subprocess.run(
            ["git", "-C", str(root / repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for repo in ("cfgread", "pagerkit")
    }
    rows = [
        {
            "instance_id": "cfgread-default-port",
            "repo": "local/cfgread",
            "repo_dir": "cfgread",
            "problem_statement": "port() returns 8000 for a config without a port; the default is 8080.",
            "FAIL_TO_PASS": json.dumps(["tests/test_default.py::test_default_port"]),
            "PASS_TO_PASS": json.dumps(
                ["tests/test_cfg.py::test_explicit_port", "tests/test_cfg.py::test_tomli_is_the_pinned_one"]
            ),
            **cfg,
        },
        {
            "instance_id": "pagerkit-less",
            "repo": "local/pagerkit",
            "version": "0.1",
            "repo_dir": "pagerkit",
            "problem_statement": "pager() should find less, not more.",
            "FAIL_TO_PASS": ["tests/test_pager.py::test_pager_is_less"],
            "PASS_TO_PASS": ["tests/test_env.py::test_python_39", "tests/test_env.py::test_less_is_installed"],
            **pager,
        },
    ]
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    specs = root / "specs.json"
    specs.write_text(json.dumps(SPECS))
    return tasks, specs, fixes


@pytest.fixture(scope="module")
def env_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`orchard serve env` for the module, on one state dir (its kept snapshots are the build cache)."""
    with served_env(tmp_path_factory.mktemp("env-state")) as address:
        yield address


def test_env_build_then_validate(
    task_file: tuple[Path, Path, dict[str, str]], env_address: str, tmp_path: Path
) -> None:
    """`orchard env build` builds every environment once (a second run finds them all); `orchard tasks validate`
    resolves every gold patch and no empty one, and writes its report."""
    tasks, specs, _ = task_file
    built = orchard("env", "build", "--tasks", str(tasks), "--env-specs", str(specs), "--env-address", env_address)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "2 instances ready in 2 environments (2 built now, 0 cached)" in built.stdout, built.stdout
    again = orchard(
        "env", "build", "--tasks", str(tasks), "--env-specs", str(specs), "--env-address", env_address, timeout=120
    )
    assert "(0 built now, 2 cached)" in again.stdout, again.stdout + again.stderr
    report = tmp_path / "validate.json"
    checked = orchard(
        "tasks",
        "validate",
        "--tasks",
        str(tasks),
        "--env-specs",
        str(specs),
        "--env-address",
        env_address,
        "--report",
        str(report),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2/2 instances valid" in checked.stdout
    rows = {r["instance_id"]: r for r in json.loads(report.read_text())["instances"]}
    assert rows["cfgread-default-port"]["fail_to_pass"] == "1/1" and rows["pagerkit-less"]["pass_to_pass"] == "2/2"
    assert all(r["gold_resolved"] and not r["empty_resolved"] for r in rows.values())


async def test_traps_are_closed(task_file: tuple[Path, Path, dict[str, str]], env_address: str) -> None:
    """The venv is the sandbox's python, pip and pytest (the image's tomli and pytest do not shadow it); less is
    there for the repository that needs it; the history stops at base_commit; a grade forks, never reinstalls."""
    tasks, specs, fixes = task_file
    cfg, pager = load_instances(tasks, env_specs=specs)
    async with AsyncSandboxClient(target=env_address) as client:
        prepared = await builder_for(client).prepare(cfg)
        sandbox, head = await task_sandbox(client, cfg, labels={}, timeout=600)
        async with sandbox:
            seen = await sandbox.exec(
                "python -c 'import tomli, sys; print(tomli.__file__); print(sys.prefix)'; "
                "which python pytest pip; pytest --version; git log --all --format=%H; "
                "git status --porcelain; python3 -c 'import tomli; print(tomli.__file__)'",
                cwd=cfg.workdir,
            )
        assert seen.exit_code == 0, seen.stderr
        out = seen.stdout.splitlines()
        assert out[0].startswith("/opt/orchard/venv/") and out[1] == "/opt/orchard/venv"
        assert out[2:5] == ["/usr/local/bin/python", "/usr/local/bin/pytest", "/usr/local/bin/pip"]
        assert "pytest 8.3.4" in seen.stdout + seen.stderr
        assert head == cfg.base_commit and cfg.base_commit in out and fixes["cfgread"] not in seen.stdout
        assert out[-1].startswith("/opt/orchard/venv/")  # python3 too (the agent's own python is /usr/bin's)
        sandbox, _ = await task_sandbox(client, pager, labels={}, timeout=600)
        async with sandbox:
            tools = await sandbox.exec("command -v less; python -c 'import sys; print(sys.version_info[:2])'")
        assert tools.stdout.splitlines()[0].endswith("/less") and "(3, 9)" in tools.stdout
        # A grade forks the built state: its time is the tests' own plus the sandbox, never an install.
        again = await builder_for(client).prepare(cfg)
        assert again.reused and again.snapshot_id == prepared.snapshot_id
        started = time.monotonic()
        gold = await grade(client, cfg, cfg.patch)
        assert gold.resolved and time.monotonic() - started < 30, gold
        log = builder_for(client)._logs
        stamps = {p.name: p.stat().st_mtime for p in log.glob("instance-*.log")}
        await grade(client, cfg, "")
        assert {p.name: p.stat().st_mtime for p in log.glob("instance-*.log")} == stamps  # nothing rebuilt


def test_rollout_and_eval_on_the_same_file(
    task_file: tuple[Path, Path, dict[str, str]], env_address: str, tmp_path: Path
) -> None:
    """`orchard rollout` (the reference policy: at 1.0 it resolves, at 0.0 never, though one gold patch also edits
    a changelog) and `orchard eval` of the rollouts file, on the built environments."""
    tasks, specs, _ = task_file
    for quality, expected in (("1.0", "resolved 2/2"), ("0.0", "resolved 0/2")):
        run = orchard(
            "rollout",
            "--tasks",
            str(tasks),
            "--env-specs",
            str(specs),
            "--policy",
            f"reference:{quality}",
            "-n",
            "1",
            "--seed",
            "3",
            "--no-events",
            "--env-address",
            env_address,
            "--run-id",
            f"real-q{quality.replace('.', '')}",
            "--out",
            str(tmp_path),
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert expected in run.stdout, run.stdout
    evaluated = orchard(
        "eval",
        str(tmp_path / "real-q10" / "trajectories.jsonl"),
        "--tasks",
        str(tasks),
        "--env-specs",
        str(specs),
        "--env-address",
        env_address,
        "--regrade",
    )
    assert evaluated.returncode == 0 and "resolved 2/2" in evaluated.stdout, evaluated.stdout + evaluated.stderr
    gold_one = orchard(
        "eval",
        "--gold",
        "--tasks",
        str(tasks),
        "--env-specs",
        str(specs),
        "--ids",
        "pagerkit-less",
        "--env-address",
        env_address,
        "--report",
        str(tmp_path / "gold-report.json"),
    )
    assert gold_one.returncode == 0 and "resolved 1/1" in gold_one.stdout, gold_one.stdout + gold_one.stderr
