"""Image store for the `local` backend: Debian root filesystems built on this machine with debootstrap.

Sandboxes mount an image's `rootfs/` read-only as the lower layer of an overlayfs. Layout under the root:
`<folder>/rootfs/`, `<folder>/image.json` (metadata), `<folder>.build.log`, `.<folder>.lock`, and while
a build runs `.<folder>.tmp-<token>/`, renamed to `<folder>/` only once complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import platform
import re
import secrets
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchard.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from orchard.progress import ProgressLine

HOST_IMAGE = "host"
"""The special image that is the machine's own root filesystem."""

DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Recipe:
    """How to build a named image with debootstrap."""

    suite: str
    """Debian suite, e.g. "bookworm"."""
    variant: str
    """debootstrap variant, e.g. "minbase"."""
    packages: tuple[str, ...]
    """Extra packages (`--include`)."""
    description: str
    pip: tuple[str, ...] = ()
    """Python requirement specs (e.g. "pymap==0.36.7") installed system-wide from PyPI wheels, with their
    dependencies, for what Debian does not package. The wheels are downloaded on the build machine."""


PYTHON_PACKAGES = (
    "python3",
    "python-is-python3",
    "python3-pip",
    "python3-venv",
    "python3-pytest",
    "git",
    "ca-certificates",
)
"""python:3.11-slim's packages. git is required in every image: patches are applied with `git apply` (the sandbox
agent is bound in from the host: an image needs no Python for it)."""

PYTHON_SUITES = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
"""The Python of each Debian suite an image can be built from (the version its python3 package gives)."""

RECIPES: dict[str, Recipe] = {
    "python:3.9-slim": Recipe(
        suite="bullseye",
        variant="minbase",
        packages=PYTHON_PACKAGES,
        description="Debian 11 (bullseye) minbase with Python 3.9 (also as `python`), pip, venv, pytest and git",
    ),
    "python:3.13-slim": Recipe(
        suite="trixie",
        variant="minbase",
        packages=PYTHON_PACKAGES,
        description="Debian 13 (trixie) minbase with Python 3.13 (also as `python`), pip, venv, pytest and git",
    ),
    "python:3.11-slim": Recipe(
        suite="bookworm",
        variant="minbase",
        packages=PYTHON_PACKAGES,
        description="Debian 12 (bookworm) minbase with Python 3.11 (also as `python`), pip, venv, pytest and git",
    ),
    # The Claw assistant environment: mail (aiosmtpd + pymap IMAP), CalDAV (radicale) and files,
    # all served inside the sandbox (docs/design/claw-environment.md). Debian has no pymap.
    "claw": Recipe(
        suite="bookworm",
        variant="minbase",
        packages=(*PYTHON_PACKAGES, "python3-radicale", "python3-aiosmtpd"),
        description="python:3.11-slim plus radicale (CalDAV), aiosmtpd (SMTP) and pymap (IMAP) for the Claw "
        "assistant environment",
        pip=("pymap==0.36.7",),
    ),
}


def python_of(recipe: Recipe) -> str:
    """The Python version of a recipe's suite ("3.11" for bookworm); wheels for `Recipe.pip` are chosen for it."""
    for version, suite in PYTHON_SUITES.items():
        if suite == recipe.suite:
            return version
    raise InvalidArgument(f"suite {recipe.suite!r} is not one of {', '.join(PYTHON_SUITES.values())}", field="suite")


CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
"""The environment of commands run in a rootfs being built (none of the host's variables leak in)."""


@dataclass(frozen=True)
class Image:
    """A resolvable image: the host's root or a built root filesystem."""

    name: str
    rootfs: Path
    is_host: bool
    size_bytes: int
    """Disk usage of the rootfs; 0 for the host."""
    build_time: datetime | None
    description: str


@dataclass(frozen=True)
class BuildProgress:
    """One step of a build, parsed from debootstrap's output or reported by the store."""

    stage: str
    """prepare, resolve, download, extract, unpack, configure, pip, finalize, done or failed."""
    done: int
    """Packages handled so far in this stage."""
    total: int | None
    """Packages this stage handles at most, when known (a few are installed without a line)."""
    message: str


HOST = Image(
    name=HOST_IMAGE,
    rootfs=Path("/"),
    is_host=True,
    size_bytes=0,
    build_time=None,
    description="the machine's own root filesystem, read-only",
)


def default_images_dir() -> Path:
    """Where images live by default: $XDG_CACHE_HOME/orchard/images, else ~/.cache/orchard/images."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "orchard" / "images"


def image_dirname(name: str) -> str:
    """The folder name of an image: "python:3.11-slim" -> "python_3.11-slim" (never hidden, never a path)."""
    return re.sub(r"[^A-Za-z0-9._-]|^\.", "_", name)


def detect_mirror(suite: str, apt_dir: Path = Path("/etc/apt")) -> str:
    """The Debian archive URI this machine's apt uses for `suite`, else DEFAULT_MIRROR."""
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in _deb822_stanzas(path.read_text()):
            if stanza.get("enabled", "yes").lower() == "no":
                continue
            uris = stanza.get("uris", "").split()
            if uris and "deb" in stanza.get("types", "").split() and suite in stanza.get("suites", "").split():
                return uris[0].rstrip("/")
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = re.sub(r"\[.*?\]", "", line.split("#", 1)[0]).split()  # drop "[arch=... signed-by=...]"
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1].rstrip("/")
    return DEFAULT_MIRROR


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    """Parse deb822 paragraphs into dicts with lower-case keys (continuation lines joined)."""
    stanzas: list[dict[str, str]] = [{}]
    key = ""
    for line in text.splitlines():
        if not line.strip():
            if stanzas[-1]:
                stanzas.append({})
        elif line.startswith("#"):
            continue
        elif line[0].isspace() and key:
            stanzas[-1][key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            key = key.strip().lower()
            stanzas[-1][key] = value.strip()
    return [s for s in stanzas if s]


class ProgressParser:
    """Turns debootstrap's output lines into BuildProgress, counting distinct packages per stage."""

    # "Retrieving git 1:2.39.5-0+deb12u3", "Unpacking libc6:amd64..." (but not "Unpacking the base system...")
    _PACKAGE = re.compile(
        r"I: (?:(Retrieving|Validating) (\S+) \S+|(Extracting|Unpacking|Configuring) (\S+?)(?::\w+)?\.\.\.)$"
    )
    _STAGES = {
        "Retrieving": "download",
        "Validating": "download",
        "Extracting": "extract",
        "Unpacking": "unpack",
        "Configuring": "configure",
    }

    def __init__(self) -> None:
        self.stage = "resolve"
        self._seen: dict[str, set[str]] = {stage: set() for stage in self._STAGES.values()}

    def feed(self, line: str) -> BuildProgress | None:
        """Parse one line; None for lines that are not debootstrap messages (I:, W:, E:)."""
        line = line.rstrip()
        if not line.startswith(("I: ", "W: ", "E: ")):
            return None
        message = line.removeprefix("I: ")
        match = self._PACKAGE.match(line)
        verb = line[3:].split(" ", 1)[0]
        if match:
            self.stage = self._STAGES[match.group(1) or match.group(3)]
            self._seen[self.stage].add(match.group(2) or match.group(4))
        elif verb in ("Unpacking", "Configuring", "Extracting"):  # "Unpacking the base system..." and the like
            self.stage = self._STAGES[verb]
        downloaded = len(self._seen["download"])
        total = downloaded if self.stage in ("unpack", "configure") else None
        done = len(self._seen.get(self.stage, ()))
        return BuildProgress(self.stage, min(done, total) if total else done, total, message)


class BuildProgressView:
    """Shows a build's progress on stderr: one updating line on a terminal, else a line per stage and one every
    few seconds (a callable for ImageStore.build's `progress`)."""

    def __init__(self) -> None:
        self._line = ProgressLine()
        self._stage: str | None = None

    def __call__(self, p: BuildProgress) -> None:
        count = f"{p.done}/{p.total} " if p.total else f"{p.done} " if p.done else ""
        text = f"[{p.stage}] {count}{p.message}"
        if p.stage in ("done", "failed"):
            self._line.finish(text)
        else:
            self._line.update(text, force=p.stage != self._stage)
        self._stage = p.stage


class ImageStore:
    """Named images on this machine: "host", the RECIPES, and recipes added as files (add_recipe), built under
    `root`."""

    def __init__(self, root: Path, *, mirror: str | None = None) -> None:
        self.root = root
        self._mirror = mirror  # None: the machine's apt sources, looked up per suite at build time

    @property
    def _recipes_dir(self) -> Path:
        return self.root / "recipes"

    def add_recipe(self, name: str, recipe: Recipe) -> None:
        """Make `name` buildable from `recipe` (a file under <root>/recipes, not an edit of RECIPES);
        AlreadyExists when a built-in or another recipe already has that name."""
        check_recipe(name, recipe)
        current = self.recipe(name, missing_ok=True)
        if current is not None:
            if current == recipe:
                return
            raise AlreadyExists(f"image {name!r} already has another recipe; pick another name", field="name")
        self._recipes_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._recipes_dir / f".{image_dirname(name)}.tmp"
        tmp.write_text(json.dumps({"name": name, **asdict(recipe)}, indent=2) + "\n")
        tmp.replace(self._recipes_dir / f"{image_dirname(name)}.json")

    def recipe(self, name: str, *, missing_ok: bool = False) -> Recipe | None:
        """The recipe of image `name`: a built-in or one added as a file; InvalidArgument naming the valid names."""
        if name in RECIPES:
            return RECIPES[name]
        path = self._recipes_dir / f"{image_dirname(name)}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            if data.pop("name", name) == name:
                return Recipe(**{**data, "packages": tuple(data["packages"]), "pip": tuple(data.get("pip", ()))})
        if missing_ok:
            return None
        valid = ", ".join([HOST_IMAGE, *self.list_recipes()])
        raise InvalidArgument(f"unknown image '{name}'; valid images: {valid}", field="image", reason="UNKNOWN_IMAGE")

    def resolve(self, name: str) -> Image:
        """The image to run a sandbox on; FailedPrecondition when it is known but not built here."""
        if name == HOST_IMAGE:
            return HOST
        if (imported := self._imported(name)) is not None:
            return imported
        recipe = self.recipe(name)
        assert recipe is not None
        image = self._built(name, recipe)
        if image is None:
            raise FailedPrecondition(
                f"image '{name}' is not built on this machine (or was built from an older recipe); "
                f"build it with `orchard image build {name}`",
                field="image",
                reason="IMAGE_NOT_BUILT",
            )
        return image

    def list(self) -> list[Image]:
        """The host image, every built image and every imported one."""
        folders = sorted(self.root.iterdir()) if self.root.is_dir() else []
        imported = [image for folder in folders if (image := self._imported_from(folder)) is not None]
        return [
            HOST,
            *(image for name, recipe in self.list_recipes().items() if (image := self._built(name, recipe))),
            *imported,
        ]

    def _imported(self, name: str) -> Image | None:
        image = self._imported_from(self.root / image_dirname(name))
        return image if image is not None and image.name == name else None

    def _imported_from(self, folder: Path) -> Image | None:
        try:
            meta = json.loads((folder / "image.json").read_text())
        except (FileNotFoundError, NotADirectoryError, ValueError):
            return None
        if "imported_from" not in meta:
            return None
        return Image(
            name=meta["name"],
            rootfs=folder / "rootfs",
            is_host=False,
            size_bytes=meta["size_bytes"],
            build_time=datetime.fromisoformat(meta["build_time"]),
            description=f"imported from {meta['imported_from']}",
        )

    async def import_archive(
        self, name: str, archive: Path, progress: Callable[[BuildProgress], None] | None = None
    ) -> Image:
        """Make image `name` from a container image archive (`docker save`, `podman save`, an OCI layout tar):
        its layers unpacked into a root filesystem sandboxes run on, as built images are. The image needs bash
        for commands and git for patches (every backend binds its own agent in). Replaces an earlier import of
        the same name; a built-in or recipe name is refused."""
        from orchard.services.env import oci

        if name == HOST_IMAGE or self.recipe(name, missing_ok=True) is not None:
            raise AlreadyExists(f"image {name!r} is built from a recipe; import under another name", field="name")
        if not IMAGE_NAME.match(name):
            raise InvalidArgument(
                f"image name {name!r} must be 1-128 lowercase letters, digits, '.', '_', ':' or '-'", field="name"
            )
        if not archive.is_file():
            raise NotFound(f"image archive {archive} not found")
        report = progress or (lambda p: None)
        self.root.mkdir(parents=True, exist_ok=True)
        async with self._locked(name, report):
            dirname = image_dirname(name)
            tmp = self.root / f".{dirname}.tmp-{secrets.token_hex(4)}"
            (tmp / "rootfs").mkdir(parents=True)
            started = time.monotonic()
            try:
                report(BuildProgress("extract", 0, None, f"unpacking the layers of {archive.name}"))
                config = await asyncio.to_thread(oci.unpack, archive, tmp / "rootfs")
                report(BuildProgress("finalize", 0, None, "writing image metadata"))
                await asyncio.to_thread(_finish_rootfs, tmp / "rootfs")
                size = await asyncio.to_thread(_disk_usage, tmp / "rootfs")
                meta = {
                    "name": name,
                    "imported_from": str(archive),
                    "build_time": datetime.now(UTC).isoformat(),
                    "build_seconds": round(time.monotonic() - started, 1),
                    "size_bytes": size,
                    "config": {k: config.get(k) for k in ("Env", "WorkingDir", "Cmd", "Entrypoint")},
                }
                (tmp / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
                final = self.root / dirname
                if final.exists():
                    old = self.root / f".{dirname}.old-{secrets.token_hex(4)}"
                    final.rename(old)
                    tmp.rename(final)
                    await asyncio.to_thread(_remove_tree, old)
                else:
                    tmp.rename(final)
            except BaseException:
                if tmp.exists():
                    await asyncio.to_thread(_remove_tree, tmp)
                raise
        image = self._imported(name)
        assert image is not None
        report(
            BuildProgress(
                "done",
                1,
                1,
                f"imported {name} in {meta['build_seconds']:.0f} s ({size / 1e6:.0f} MB) at {image.rootfs}",
            )
        )
        return image

    def list_recipes(self) -> dict[str, Recipe]:
        """Every image name that `build` accepts, built or not."""
        added = {}
        if self._recipes_dir.is_dir():
            for path in sorted(self._recipes_dir.glob("*.json")):
                name = json.loads(path.read_text()).get("name", "")
                if name and (recipe := self.recipe(name, missing_ok=True)) is not None:
                    added[name] = recipe
        return {**RECIPES, **added}

    async def build(
        self, name: str, *, force: bool = False, progress: Callable[[BuildProgress], None] | None = None
    ) -> Image:
        """Build `name` with debootstrap (returns at once when already built, unless `force`).

        Builds of one image are serialized across processes with a lock file. A forced rebuild
        replaces the old rootfs: sandboxes still running on it must be stopped first.
        """
        if name == HOST_IMAGE:
            raise InvalidArgument(
                "image 'host' is the machine's own root filesystem; there is nothing to build", field="image"
            )
        recipe = self.recipe(name)
        assert recipe is not None
        if not force and (image := self._built(name, recipe)):
            return image
        report = progress or (lambda p: None)
        self.root.mkdir(parents=True, exist_ok=True)
        async with self._locked(name, report) as lock_fd:
            if not force and (image := self._built(name, recipe)):
                return image  # another build finished while we waited
            return await self._build_locked(name, recipe, lock_fd, report)

    def _built(self, name: str, recipe: Recipe) -> Image | None:
        folder = self.root / image_dirname(name)
        try:
            meta = json.loads((folder / "image.json").read_text())
        except FileNotFoundError:
            return None
        if meta.get("recipe") != recipe_key(recipe):
            return None  # built from an older recipe: rebuilt by the next `build`
        return Image(
            name=name,
            rootfs=folder / "rootfs",
            is_host=False,
            size_bytes=meta["size_bytes"],
            build_time=datetime.fromisoformat(meta["build_time"]),
            description=recipe.description,
        )

    @contextlib.asynccontextmanager
    async def _locked(self, name: str, report: Callable[[BuildProgress], None]) -> AsyncIterator[int]:
        # flock (not an asyncio.Lock) so builds in other processes wait too; poll so that
        # waiting never blocks the event loop and stays cancellable. Yields the locked fd.
        fd = os.open(self.root / f".{image_dirname(name)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            waiting = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waiting:
                        report(BuildProgress("prepare", 0, None, f"waiting for another build of {name}"))
                        waiting = True
                    await asyncio.sleep(0.2)
            yield fd
        finally:
            os.close(fd)  # releases the lock, unless a debootstrap that outlived us still holds it

    async def _build_locked(
        self, name: str, recipe: Recipe, lock_fd: int, report: Callable[[BuildProgress], None]
    ) -> Image:
        dirname = image_dirname(name)
        if os.geteuid() != 0:
            raise FailedPrecondition(
                f"building image '{name}' needs root (debootstrap); run `sudo orchard image build {name}`",
                reason="IMAGE_BUILD_NEEDS_ROOT",
            )
        if shutil.which("debootstrap") is None:
            raise FailedPrecondition(
                "debootstrap is not installed; run scripts/install.sh or `apt-get install debootstrap`",
                reason="DEBOOTSTRAP_MISSING",
            )
        # 1. A crashed build leaves only hidden siblings; nobody else builds this image while we hold the lock.
        report(BuildProgress("prepare", 0, None, f"preparing to build {name}"))
        for leftover in [*self.root.glob(f".{dirname}.tmp-*"), *self.root.glob(f".{dirname}.old-*")]:
            await asyncio.to_thread(_remove_tree, leftover)
        mirror = self._mirror or detect_mirror(recipe.suite)
        tmp = self.root / f".{dirname}.tmp-{secrets.token_hex(4)}"
        tmp.mkdir()
        log_path = self.root / f"{dirname}.build.log"
        started = time.monotonic()
        try:
            # 2. debootstrap into the hidden folder.
            await _debootstrap(name, recipe, tmp / "rootfs", mirror, log_path, lock_fd, report)
            if recipe.pip:  # before _finish_rootfs, which is the last step that edits the rootfs
                await _install_wheels(name, recipe, tmp / "rootfs", log_path, report)
            # 3. Shrink and adjust the rootfs, then write the metadata that makes it resolvable.
            report(BuildProgress("finalize", 0, None, "removing package caches, writing image metadata"))
            await asyncio.to_thread(_finish_rootfs, tmp / "rootfs")
            size = await asyncio.to_thread(_disk_usage, tmp / "rootfs")
            meta = {
                "name": name,
                "recipe": recipe_key(recipe),
                "build_time": datetime.now(UTC).isoformat(),
                "build_seconds": round(time.monotonic() - started, 1),
                "size_bytes": size,
                "debootstrap_version": await _debootstrap_version(),
                "mirror": mirror,
                "build_log": str(log_path),
            }
            (tmp / "image.json").write_text(json.dumps(meta, indent=2) + "\n")
            # 4. Swap it in with renames, so the image folder is always either absent or complete.
            final = self.root / dirname
            if final.exists():
                old = self.root / f".{dirname}.old-{secrets.token_hex(4)}"
                final.rename(old)
                tmp.rename(final)
                await asyncio.to_thread(_remove_tree, old)
            else:
                tmp.rename(final)
        except BaseException:
            if tmp.exists():
                await asyncio.to_thread(_remove_tree, tmp)
            raise
        image = self._built(name, recipe)
        assert image is not None
        report(
            BuildProgress(
                "done", 1, 1, f"built {name} in {meta['build_seconds']:.0f} s ({size / 1e6:.0f} MB) at {image.rootfs}"
            )
        )
        return image


def recipe_key(recipe: Recipe) -> dict[str, object]:
    """The recipe as stored in image.json and compared by `resolve`: any change means "rebuild".

    An empty `pip` is left out, so images built before that field existed stay valid.
    """
    key: dict[str, object] = json.loads(json.dumps(asdict(recipe)))
    if not recipe.pip:
        del key["pip"]
    return key


def pip_download_args(recipe: Recipe, dest: Path) -> list[str]:
    """The host-side `pip download` of the recipe's wheels (and their dependencies) for the image's python3."""
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--only-binary=:all:",
        "--python-version",
        python_of(recipe),
        "--implementation",
        "cp",
        "--platform",
        f"manylinux2014_{platform.machine()}",
        "-d",
        str(dest),
        *recipe.pip,
    ]


def pip_install_args(recipe: Recipe, rootfs: Path, wheels_in_rootfs: str) -> list[str]:
    """The in-chroot `pip install` from the downloaded wheels only (the chroot needs no network)."""
    return [
        "chroot",
        str(rootfs),
        "python3",
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--break-system-packages",
        "--root-user-action=ignore",
        "--no-index",
        "--find-links",
        wheels_in_rootfs,
        *recipe.pip,
    ]


IMAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9._:-]{0,127}$")
DEBIAN_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")


def check_recipe(name: str, recipe: Recipe) -> None:
    """InvalidArgument naming the field unless the recipe can be built: a plain name, a known suite, package
    names Debian allows (they reach debootstrap's command line)."""
    if not IMAGE_NAME.match(name) or name == HOST_IMAGE:
        raise InvalidArgument(
            f"image name {name!r} must be 1-128 lowercase letters, digits, '.', '_', ':' or '-'", field="name"
        )
    python_of(recipe)
    if recipe.variant not in ("minbase", "buildd"):
        raise InvalidArgument(f"variant {recipe.variant!r} must be minbase or buildd", field="variant")
    for package in recipe.packages:
        if not DEBIAN_PACKAGE.match(package):
            raise InvalidArgument(f"{package!r} is not a Debian package name", field="packages")
    if "git" not in recipe.packages:
        raise InvalidArgument("an image needs the package git (patches are applied with it)", field="packages")
    if recipe.pip and "python3-pip" not in recipe.packages:
        raise InvalidArgument(
            "pip requirements need the package python3-pip (they are installed with it)", field="packages"
        )


async def _debootstrap(
    name: str,
    recipe: Recipe,
    rootfs: Path,
    mirror: str,
    log_path: Path,
    lock_fd: int,
    report: Callable[[BuildProgress], None],
) -> None:
    """Run debootstrap, streaming its output to `log_path` and `report`; raise with the log's tail on failure.

    debootstrap inherits the lock: if this process dies, the next build waits for the orphaned
    debootstrap to finish instead of deleting the folder it is still writing.
    """
    args = [
        "debootstrap",
        f"--variant={recipe.variant}",
        f"--include={','.join(recipe.packages)}",
        recipe.suite,
        str(rootfs),
        mirror,
    ]
    parser = ProgressParser()
    tail: deque[str] = deque(maxlen=20)
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(args)}\n")
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(lock_fd,),
        )
        assert proc.stdout is not None
        try:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\r\n")
                log.write(line + "\n")
                tail.append(line)
                if (step := parser.feed(line)) is not None:
                    report(step)
            returncode = await proc.wait()
        except BaseException:
            await _stop(proc)
            raise
        if returncode == 0:
            return
        # debootstrap's own log of the failed chroot step lives in the folder we are about to delete.
        inner = rootfs / "debootstrap" / "debootstrap.log"
        if inner.is_file():
            log.write(f"\n--- {inner} ---\n{inner.read_text(errors='replace')}")
    unreachable = any("Failed getting release file" in line or "Couldn't download" in line for line in tail)
    error = Unavailable if unreachable else FailedPrecondition
    hint = f"check that the mirror {mirror} is reachable" if unreachable else "fix the cause"
    report(BuildProgress("failed", 0, None, f"debootstrap exited with status {returncode}"))
    last_lines = "\n".join(tail)
    raise error(
        f"building image '{name}' failed: debootstrap exited with status {returncode} (mirror {mirror}); "
        f"{hint} and run `orchard image build {name}` again. Full log: {log_path}\n"
        f"Last lines:\n{last_lines}",
        reason="MIRROR_UNREACHABLE" if unreachable else "IMAGE_BUILD_FAILED",
    )


async def _install_wheels(
    name: str, recipe: Recipe, rootfs: Path, log_path: Path, report: Callable[[BuildProgress], None]
) -> None:
    """Download the recipe's wheels on this machine into the rootfs, pip-install them in a chroot, delete them."""
    wheels = "/tmp/orchard-wheels"
    host_dir = rootfs / wheels.lstrip("/")
    host_dir.mkdir(parents=True)
    try:
        report(BuildProgress("pip", 0, None, f"downloading wheels: {' '.join(recipe.pip)}"))
        await _run_logged(name, pip_download_args(recipe, host_dir), log_path, env=None)  # pip's own config
        report(BuildProgress("pip", 1, 2, f"installing {len(list(host_dir.glob('*.whl')))} wheels"))
        await _run_logged(name, pip_install_args(recipe, rootfs, wheels), log_path, env=CHROOT_ENV)
    finally:
        await asyncio.to_thread(shutil.rmtree, host_dir, True)


async def _run_logged(name: str, args: list[str], log_path: Path, *, env: dict[str, str] | None) -> None:
    """Run one build step (env None: this process's), appending its output to the build log; raise with the
    log's tail on failure."""
    with log_path.open("a") as log:
        log.write(f"\n$ {' '.join(args)}\n")
        log.flush()
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        try:
            returncode = await proc.wait()
        except BaseException:
            await _stop(proc)
            raise
    if returncode != 0:
        last_lines = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise FailedPrecondition(
            f"building image '{name}' failed: `{' '.join(args[:5])} ...` exited with status "
            f"{returncode}; fix the cause and run `orchard image build {name}` again. "
            f"Full log: {log_path}\nLast lines:\n{last_lines}",
            reason="IMAGE_BUILD_FAILED",
        )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Stop a build step's whole process group: SIGTERM, then SIGKILL after 10 s."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        async with asyncio.timeout(10):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def _debootstrap_version() -> str:
    proc = await asyncio.create_subprocess_exec(
        "debootstrap", "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    return out.decode().split()[-1] if out.strip() else "unknown"


def _finish_rootfs(rootfs: Path) -> None:
    """Drop downloaded .debs and apt lists; add /workspace and sandbox-safe resolv.conf, hosts, hostname."""
    for deb in (rootfs / "var/cache/apt/archives").rglob("*.deb"):
        deb.unlink()
    lists = rootfs / "var/lib/apt/lists"
    for entry in lists.iterdir() if lists.is_dir() else ():
        if entry.is_file() and entry.name != "lock":
            entry.unlink()
    (rootfs / "etc").mkdir(exist_ok=True)  # an imported image may have none
    workspace = rootfs / "workspace"
    workspace.mkdir(exist_ok=True)
    workspace.chmod(0o755)
    # debootstrap copies the host's files; replace them (unlink first: never write through a symlink
    # that could point out of the rootfs).
    _replace(
        rootfs / "etc/resolv.conf",
        "# Orchard sandbox placeholder: sandboxes have no network unless their policy allows it;\n"
        "# the backend binds a real resolv.conf over this file when it gives a sandbox DNS.\n",
    )
    _replace(rootfs / "etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    _replace(rootfs / "etc/hostname", "sandbox\n")


def _replace(path: Path, text: str) -> None:
    path.unlink(missing_ok=True)
    with path.open("x") as f:
        f.write(text)


def _disk_usage(path: Path) -> int:
    """Bytes allocated under `path`, like `du -s` (hard links counted once, symlinks not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for entry in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            st = os.lstat(entry)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _remove_tree(path: Path) -> None:
    """rm -rf `path`, first detaching mounts a killed debootstrap may have left inside (/proc, /sys)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for mount in sorted(_mounts_under(path), key=lambda p: len(p.parts), reverse=True):
        if libc.umount2(os.fsencode(mount), 2) != 0:  # 2 = MNT_DETACH
            err = ctypes.get_errno()
            raise OSError(err, f"cannot unmount {mount} before removing {path}: {os.strerror(err)}")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _mounts_under(path: Path) -> list[Path]:
    top = path.resolve()
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if top == Path(point) or top in Path(point).parents:
                mounts.append(Path(point))
    return mounts
