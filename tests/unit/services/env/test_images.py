"""Image store: names, resolve errors, mirror detection, debootstrap progress parsing, leftover cleanup."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchard.errors import FailedPrecondition, InvalidArgument, Unavailable
from orchard.services.env.images import (
    DEFAULT_MIRROR,
    RECIPES,
    BuildProgress,
    BuildProgressView,
    ImageStore,
    ProgressParser,
    Recipe,
    default_images_dir,
    detect_mirror,
    image_dirname,
    pip_download_args,
    pip_install_args,
    recipe_key,
)

SAMPLE = Path(__file__).with_name("debootstrap_sample.log")
"""Real debootstrap 1.0.128 output (bookworm minbase, python:3.11-slim's packages), trimmed to 12 packages."""


@pytest.mark.parametrize(
    ("name", "folder"),
    [("python:3.11-slim", "python_3.11-slim"), ("a/b c", "a_b_c"), ("..", "_."), (".hidden", "_hidden")],
)
def test_image_dirname(name: str, folder: str) -> None:
    assert image_dirname(name) == folder


def test_default_images_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_images_dir() == tmp_path / "orchard" / "images"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_images_dir() == Path.home() / ".cache" / "orchard" / "images"


def test_recipe_has_python_and_git() -> None:
    assert {"python3", "git"} <= set(RECIPES["python:3.11-slim"].packages)


def test_claw_recipe_extends_the_default_image() -> None:
    claw, base = RECIPES["claw"], RECIPES["python:3.11-slim"]
    assert set(claw.packages) == {*base.packages, "python3-radicale", "python3-aiosmtpd"}
    assert (claw.suite, claw.variant, claw.pip) == (base.suite, base.variant, ("pymap==0.36.7",))


def write_built(root: Path, name: str, recipe: dict[str, object]) -> None:
    """A built-looking image folder whose image.json records `recipe`."""
    folder = root / image_dirname(name)
    (folder / "rootfs").mkdir(parents=True)
    (folder / "image.json").write_text(
        json.dumps({"recipe": recipe, "size_bytes": 1, "build_time": "2025-01-01T00:00:00+00:00"})
    )


def test_image_built_before_recipes_had_pip_stays_valid(tmp_path: Path) -> None:
    old = dataclasses.asdict(RECIPES["python:3.11-slim"])
    del old["pip"]  # what image.json held before the field existed
    write_built(tmp_path, "python:3.11-slim", json.loads(json.dumps(old)))
    assert ImageStore(tmp_path).resolve("python:3.11-slim").rootfs == tmp_path / "python_3.11-slim" / "rootfs"


@pytest.mark.parametrize("change", [{"pip": ["pymap==0.36.6"]}, {"pip": []}, {"packages": ["python3"]}])
def test_changed_recipe_invalidates_the_build(tmp_path: Path, change: dict[str, object]) -> None:
    write_built(tmp_path, "claw", recipe_key(RECIPES["claw"]))
    assert ImageStore(tmp_path).resolve("claw").name == "claw"
    write_built(tmp_path / "changed", "claw", {**recipe_key(RECIPES["claw"]), **change})
    with pytest.raises(FailedPrecondition):
        ImageStore(tmp_path / "changed").resolve("claw")


def test_recipe_key_keeps_pip_only_when_set() -> None:
    recipe = Recipe(suite="bookworm", variant="minbase", packages=("python3",), description="d")
    assert recipe_key(recipe) == {
        "suite": "bookworm",
        "variant": "minbase",
        "packages": ["python3"],
        "description": "d",
    }
    assert recipe_key(dataclasses.replace(recipe, pip=("a==1", "b")))["pip"] == ["a==1", "b"]


def test_pip_commands_use_only_downloaded_wheels_for_the_image_python(tmp_path: Path) -> None:
    recipe = RECIPES["claw"]
    download = pip_download_args(recipe, tmp_path / "w")
    assert download[:4] == [sys.executable, "-m", "pip", "download"]
    assert {"--only-binary=:all:", "pymap==0.36.7"} <= set(download)
    assert download[download.index("--python-version") + 1] == "3.11"
    assert download[download.index("-d") + 1] == str(tmp_path / "w")
    install = pip_install_args(recipe, tmp_path / "rootfs", "/tmp/w")
    assert install[:3] == ["chroot", str(tmp_path / "rootfs"), "python3"]
    assert {"--no-index", "--break-system-packages", "pymap==0.36.7"} <= set(install)
    assert install[install.index("--find-links") + 1] == "/tmp/w"


def test_resolve_host(tmp_path: Path) -> None:
    image = ImageStore(tmp_path).resolve("host")
    assert (image.rootfs, image.is_host, image.size_bytes, image.build_time) == (Path("/"), True, 0, None)


def test_unknown_image_lists_valid_names(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as info:
        ImageStore(tmp_path).resolve("ubuntu:latest")
    assert info.value.field == "image"
    assert "'ubuntu:latest'" in info.value.message
    assert "host" in info.value.message and "python:3.11-slim" in info.value.message


def test_unbuilt_image_says_how_to_build(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition) as info:
        ImageStore(tmp_path).resolve("python:3.11-slim")
    assert info.value.field == "image"
    assert "`orchard image build python:3.11-slim`" in info.value.message
    assert [image.name for image in ImageStore(tmp_path).list()] == ["host"]


def test_progress_from_real_debootstrap_output() -> None:
    parser = ProgressParser()
    steps = [p for line in SAMPLE.read_text().splitlines() if (p := parser.feed(line)) is not None]
    stages = [s.stage for i, s in enumerate(steps) if i == 0 or steps[i - 1].stage != s.stage]
    # debootstrap unpacks and configures twice: the required packages, then the base system.
    assert stages == ["resolve", "download", "extract", "unpack", "configure", "unpack", "configure"]
    last = {s.stage: s for s in steps}
    assert last["download"] == BuildProgress("download", 12, None, "Chosen extractor for .deb packages: dpkg-deb")
    assert (last["extract"].done, last["extract"].total) == (7, None)
    # python3.11-minimal is installed without an Unpacking/Configuring line, so 11 of 12.
    assert (last["unpack"].done, last["unpack"].total) == (11, 12)
    assert last["configure"] == BuildProgress("configure", 11, 12, "Base system installed successfully.")
    assert parser.feed("dpkg: warning: something") is None
    assert parser.feed("W: Failure trying to run: chroot x").message == "W: Failure trying to run: chroot x"


def test_build_progress_in_a_log_prints_one_line_per_stage(capsys: pytest.CaptureFixture[str]) -> None:
    view = BuildProgressView()
    for step in [
        BuildProgress("download", 1, None, "Retrieving a 1"),
        BuildProgress("download", 2, None, "b"),
        BuildProgress("unpack", 1, 2, "Unpacking a..."),
        BuildProgress("done", 1, 1, "built"),
    ]:
        view(step)
    assert capsys.readouterr().err.splitlines() == [
        "[download] 1 Retrieving a 1",
        "[unpack] 1/2 Unpacking a...",
        "[done] 1/1 built",
    ]


DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"sources.list.d/debian.sources": DEB822}, "http://mirror.example/debian"),
        (
            {
                "sources.list.d/a.sources": "Enabled: no\nTypes: deb\nURIs: http://off/debian\nSuites: bookworm\n",
                "sources.list.d/debian.sources": DEB822,
            },
            "http://mirror.example/debian",
        ),
        (
            {
                "sources.list": "# comment\ndeb-src http://src/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://list.example/debian bookworm main\n"
            },
            "http://list.example/debian",
        ),
        ({"sources.list.d/other.sources": "Types: deb\nURIs: http://x/ubuntu\nSuites: jammy\n"}, DEFAULT_MIRROR),
        ({}, DEFAULT_MIRROR),
    ],
)
def test_detect_mirror(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert detect_mirror("bookworm", tmp_path) == expected


needs_debootstrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("debootstrap") is None,
    reason="needs root and debootstrap (apt-get install debootstrap)",
)


@pytest.fixture
def dead_mirror() -> Iterator[str]:
    """A loopback port that is bound but not listening, so debootstrap fails at once (no network used)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/debian"


@needs_debootstrap
async def test_leftover_is_not_resolvable_and_next_build_removes_it(
    tmp_path: Path, dead_mirror: str, request: pytest.FixtureRequest
) -> None:
    """A crashed build's hidden folder (even with complete-looking contents) never resolves.

    The next build cleans it up, unmounting what a killed debootstrap left mounted inside (a tmpfs
    stands in for its /proc), then runs debootstrap, which fails fast against a dead mirror:
    real debootstrap, no network.
    """
    leftover = tmp_path / ".python_3.11-slim.tmp-deadbeef"
    (leftover / "rootfs" / "usr" / "bin").mkdir(parents=True)
    (leftover / "image.json").write_text('{"size_bytes": 1, "build_time": "2025-01-01T00:00:00+00:00"}')
    proc = leftover / "rootfs" / "proc"
    proc.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(proc)], check=True)
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(proc)], capture_output=True, check=False))
    store = ImageStore(tmp_path, mirror=dead_mirror)
    with pytest.raises(FailedPrecondition):
        store.resolve("python:3.11-slim")

    steps: list[BuildProgress] = []
    with pytest.raises(Unavailable) as info:
        await store.build("python:3.11-slim", progress=steps.append)
    log = tmp_path / "python_3.11-slim.build.log"
    assert str(log) in info.value.message
    assert "Failed getting release file" in info.value.message
    assert "Failed getting release file" in log.read_text()
    assert [step.stage for step in steps][0] == "prepare" and steps[-1].stage == "failed"
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".python_3.11-slim.lock", "python_3.11-slim.build.log"]
    with pytest.raises(FailedPrecondition):
        store.resolve("python:3.11-slim")


@needs_debootstrap
async def test_concurrent_builds_of_one_image_are_serialized(tmp_path: Path, dead_mirror: str) -> None:
    store = ImageStore(tmp_path, mirror=dead_mirror)
    events: list[tuple[str, BuildProgress]] = []

    async def build(tag: str) -> None:
        with pytest.raises(Unavailable):
            await store.build("python:3.11-slim", progress=lambda p: events.append((tag, p)))

    await asyncio.gather(build("a"), build("b"))
    first = events[0][0]
    first_failed = next(i for i, (tag, p) in enumerate(events) if tag == first and p.stage == "failed")
    assert {p.stage for tag, p in events[:first_failed] if tag != first} == {"prepare"}
    assert any("waiting for another build" in p.message for tag, p in events if tag != first)
    assert all(tag != first for tag, _ in events[first_failed + 1 :])


async def test_build_host_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        await ImageStore(tmp_path).build("host")


def test_a_recipe_file_makes_a_name_buildable(tmp_path: Path) -> None:
    """A user image is a recipe file under the images folder, not an edit of the source: once added, the store
    knows the name (list, resolve's error says it is not built yet); bad recipes name their field."""
    from orchard.errors import AlreadyExists, InvalidArgument
    from orchard.services.env.images import Recipe

    store = ImageStore(tmp_path)
    recipe = Recipe(suite="bullseye", variant="minbase", packages=("python3", "git", "less"), description="mine")
    store.add_recipe("mine:1", recipe)
    store.add_recipe("mine:1", recipe)  # the same again: fine
    assert store.list_recipes()["mine:1"] == recipe and ImageStore(tmp_path).recipe("mine:1") == recipe
    with pytest.raises(FailedPrecondition, match="not built"):
        store.resolve("mine:1")
    with pytest.raises(AlreadyExists):
        store.add_recipe(
            "mine:1", Recipe(suite="bookworm", variant="minbase", packages=("python3", "git"), description="other")
        )
    store.add_recipe("git-only", Recipe("bookworm", "minbase", ("git",), ""))  # no Python: the agent needs none
    for name, bad, field in (
        ("x", Recipe("sid", "minbase", ("python3", "git"), ""), "suite"),
        ("x", Recipe("bookworm", "minbase", ("python3", "git", "rm -rf /"), ""), "packages"),
        ("x", Recipe("bookworm", "minbase", ("less",), ""), "packages"),  # no git: patches need it
        ("x", Recipe("bookworm", "minbase", ("python3", "git"), "", pip=("a==1",)), "packages"),  # no python3-pip
        ("Bad Name", Recipe("bookworm", "minbase", ("python3", "git"), ""), "name"),
    ):
        with pytest.raises(InvalidArgument) as info:
            store.add_recipe(name, bad)
        assert info.value.field == field
