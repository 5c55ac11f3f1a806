"""Build the python:3.11-slim image for real (debootstrap, ~1 min, ~350 MB) into the default store.

It goes to the default root on purpose: later integration tests and the quick start reuse the cache,
and when the image is already there build() returns at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from orchard.services.env.images import BuildProgress, ImageStore, default_images_dir

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("debootstrap") and shutil.which("bwrap")),
        reason="needs root, debootstrap and bubblewrap (apt-get install debootstrap bubblewrap)",
    ),
]


def run_in_image(rootfs: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run argv in the image under bubblewrap, with no capabilities, network or host environment."""
    return subprocess.run(
        [
            "bwrap",
            "--ro-bind",
            str(rootfs),
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--chdir",
            "/workspace",
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            "/root",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_build_python_image_and_run_it() -> None:
    store = ImageStore(default_images_dir())
    steps: list[BuildProgress] = []
    image = await store.build("python:3.11-slim", progress=steps.append)
    assert not steps or steps[-1].stage == "done"  # no steps when an earlier run left it built
    assert store.resolve("python:3.11-slim") == image
    assert image.name in [listed.name for listed in store.list()]
    rootfs = image.rootfs
    assert (rootfs / "usr/bin/python3").exists() and (rootfs / "usr/bin/git").exists()
    assert (rootfs / "usr/lib/python3/dist-packages/pytest").is_dir()
    assert (rootfs / "workspace").stat().st_mode & 0o777 == 0o755
    assert "localhost" in (rootfs / "etc/hosts").read_text()
    assert "nameserver" not in (rootfs / "etc/resolv.conf").read_text()
    assert not list((rootfs / "var/cache/apt/archives").glob("*.deb"))
    assert 200e6 < image.size_bytes < 600e6

    version = run_in_image(rootfs, "python3", "-c", "import sys; print(sys.version.split()[0])")
    assert version.returncode == 0 and version.stdout.startswith("3.11."), version
    for argv in (["python3", "-m", "pytest", "--version"], ["git", "--version"], ["python3", "-m", "venv", "--help"]):
        assert run_in_image(rootfs, *argv).returncode == 0, argv
    # Non-interactive bash reads only $BASH_ENV: nothing may be set, and it must print nothing extra.
    bash = run_in_image(rootfs, "bash", "-c", 'echo "[${BASH_ENV-}]"')
    assert (bash.returncode, bash.stdout, bash.stderr) == (0, "[]\n", "")

    started = time.monotonic()
    again = await store.build("python:3.11-slim")
    assert time.monotonic() - started < 10  # from the cache (a build takes a minute)
    assert again == image
