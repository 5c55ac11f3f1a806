"""Environment specs: how a task's repository gets its dependencies, in the keys of SWE-bench's harness specs
(`python`, `packages`, `pip_packages`, `pre_install`, `install`, `test_cmd`).

An instance carries one as `environment`, or SWE-rebench's `install_config`, or takes one from a specs file
(`--env-specs FILE`): a JSON object keyed by `repo`, its values either a spec or an object keyed by `version`
whose values are specs, as SWE-bench's MAP_REPO_VERSION_TO_SPECS is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from orchard.errors import InvalidArgument, NotFound

PYTHON_IMAGES = {
    "3.9": ("bullseye", "python:3.9-slim"),
    "3.11": ("bookworm", "python:3.11-slim"),
    "3.13": ("trixie", "python:3.13-slim"),
}
"""The Pythons an environment can have: each is a Debian suite's python3, and its built-in image."""
BUILD_LAYOUT = 2
"""The version of how environments are built (environments.py); part of every key, so a change rebuilds."""
BASE_PACKAGES = ("python3", "python-is-python3", "python3-pip", "python3-venv", "git", "ca-certificates")
"""What every environment image holds besides a spec's `packages` (an environment is a Python one; patches need git)."""


class EnvSpec(BaseModel):
    """One environment: a Python, Debian packages, Python packages and the commands that install the project."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    python: str = "3.11"
    """The Python version: 3.9, 3.11 or 3.13 (a Debian suite's python3)."""
    packages: tuple[str, ...] = ()
    """Debian packages the image needs beyond Python and git (e.g. less, libxml2-dev)."""
    pip_packages: tuple[str, ...] = ()
    """Python requirements installed into the environment's venv (pin them: "pytest==8.3.4")."""
    pre_install: tuple[str, ...] = ()
    """Shell lines run in the repository before `install` (offline: no network at install time)."""
    install: str = "pip install -e ."
    """The command that installs the project into the venv, run in the repository."""
    test_cmd: str = ""
    """The test command (the graded test files are appended); the task's own when empty."""

    @field_validator("python", mode="before")
    @classmethod
    def _python(cls, value: object) -> object:
        version = ".".join(str(value).split(".")[:2])
        if version not in PYTHON_IMAGES:
            raise ValueError(
                f"python {value} is not available: environments have Python "
                f"{', '.join(PYTHON_IMAGES)} (each a Debian suite's python3)"
            )
        return version

    @field_validator("packages", "pip_packages", "pre_install", mode="before")
    @classmethod
    def _list(cls, value: object) -> object:
        # SWE-bench writes some of these as one space-separated string ("packages": "less libxml2-dev").
        if isinstance(value, str):
            return tuple(value.split()) if value.strip() else ()
        return value

    @field_validator("install", mode="before")
    @classmethod
    def _install(cls, value: object) -> object:
        return "pip install -e ." if value is None or value == "" else value

    @property
    def suite(self) -> str:
        return PYTHON_IMAGES[self.python][0]

    @property
    def image(self) -> str:
        """The sandbox image this environment builds on: the built-in one of its Python, or one made for its
        Debian packages (named by their hash, so two specs with the same packages share it)."""
        if not self.packages:
            return PYTHON_IMAGES[self.python][1]
        digest = hashlib.sha256(json.dumps([self.suite, sorted(self.packages)]).encode()).hexdigest()[:12]
        return f"env-py{self.python}-{digest}"

    @property
    def image_packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*BASE_PACKAGES, *sorted(self.packages)]))

    @property
    def venv_requirements(self) -> tuple[str, ...]:
        """What goes into the venv: pip_packages, and pytest when they name none (else the image's own pytest,
        run by the image's Python, would test the system's packages instead of the project's)."""
        names = {_requirement_name(r) for r in self.pip_packages}
        return (*self.pip_packages, *(() if "pytest" in names else ("pytest",)))

    def key(self) -> str:
        """A content hash of what the environment's snapshot holds (its image and its venv)."""
        data = {
            "layout": BUILD_LAYOUT,
            "image": self.image,
            "python": self.python,
            "pip": list(self.venv_requirements),
            "pre_install": list(self.pre_install),
        }
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _requirement_name(requirement: str) -> str:
    name = requirement.strip()
    for stop in "<>=!~;[ @":
        name = name.split(stop, 1)[0]
    return name.lower().replace("_", "-")


def parse_spec(data: Any, where: str) -> EnvSpec:
    """A spec from its JSON; InvalidArgument naming `where` and the field at fault."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{where}: an environment spec must be a JSON object, not {type(data).__name__}")
    try:
        return EnvSpec.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in err.errors())
        raise InvalidArgument(f"{where}: not a valid environment spec ({problems})") from None


SPEC_KEYS = frozenset(EnvSpec.model_fields)


class EnvSpecs:
    """A specs file: repo -> spec, or repo -> version -> spec."""

    def __init__(self, by_repo: dict[str, Any], source: str) -> None:
        self._by_repo = by_repo
        self._source = source

    @classmethod
    def load(cls, path: str | Path) -> EnvSpecs:
        file = Path(path)
        if not file.is_file():
            raise NotFound(f"environment specs file {file} not found")
        try:
            data = json.loads(file.read_text())
        except json.JSONDecodeError as err:
            raise InvalidArgument(f"{file}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise InvalidArgument(f'{file}: must be a JSON object keyed by repo ("owner/name")')
        specs = cls(data, str(file))
        for repo in data:  # every entry is checked now, not when a task first needs it
            for version in specs._versions(repo):
                specs.get(repo, version)
        return specs

    def _versions(self, repo: str) -> list[str]:
        entry = self._by_repo[repo]
        return [""] if isinstance(entry, dict) and set(entry) <= SPEC_KEYS else list(entry)

    def get(self, repo: str, version: str) -> EnvSpec | None:
        """The spec of repo at version (a repo-wide spec when the file keys it by repo only); None if absent."""
        entry = self._by_repo.get(repo)
        if entry is None:
            return None
        if isinstance(entry, dict) and set(entry) <= SPEC_KEYS:
            return parse_spec(entry, f"{self._source}: {repo}")
        if not isinstance(entry, dict):
            raise InvalidArgument(f"{self._source}: {repo} must map to a spec or to versions of specs")
        if version not in entry:
            raise NotFound(
                f"{self._source} has no spec for {repo} version {version!r}; it has versions {sorted(entry)}"
            )
        return parse_spec(entry[version], f"{self._source}: {repo} {version}")
