"""The code's habits, checked on every run: ruff's lint rules and format, and mypy, all configured in
pyproject.toml at the root. A failure lists what to fix (`ruff check --fix .`, `ruff format .`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_ruff_lint_is_clean() -> None:
    done = run("ruff", "check", "--no-cache", ".", timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_ruff_format_is_clean() -> None:
    done = run("ruff", "format", "--check", "--no-cache", ".", timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_types_check() -> None:
    """mypy over the whole tree: source folders, tests, benches, scripts and examples (generated stubs, the bundled
    task repositories and one conftest aside: see pyproject.toml); ~80 s cold on 2 cores, the source folders alone
    ~65 s."""
    done = run("mypy", "libs/orchard", "services", "trainers", "tests", "bench", "scripts", "examples", timeout=580)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Success" in done.stdout
