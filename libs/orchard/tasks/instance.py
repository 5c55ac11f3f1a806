"""SWE-bench task instances: the model, and loading them from JSON or JSON-lines files with clear errors.

The fields are SWE-bench's. Orchard adds how to set the repository up in a sandbox: `image`, and either
`repo_dir` (a local folder holding the repository at its base state, which becomes a git repo inside the
sandbox) or nothing (the image already holds the repository at `workdir`, as SWE-bench images do).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchard.errors import InvalidArgument, NotFound

_TOYREPAIR = Path(__file__).resolve().parent / "toyrepair"
BUNDLED = {"toyrepair": (_TOYREPAIR / "tasks.jsonl",),
           "toyrepair-extended": (_TOYREPAIR / "tasks.jsonl", _TOYREPAIR / "extended.jsonl")}
"""Task sets shipped with Orchard, by name, each the task files it is made of: ToyRepair's 8 quick tasks, and
those with 16 more (the value model's real-run bench needs more tasks to train on than 8 give)."""
DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider"


class TaskInstance(BaseModel):
    """One SWE-bench-style task: a repository at a base commit, a problem, the gold patch and its tests."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    instance_id: str = Field(min_length=1)
    """Unique id, e.g. "astropy__astropy-12907" or "toyrepair-chunks-off-by-one"."""
    repo: str = Field(min_length=1)
    """The repository's name ("owner/name")."""
    base_commit: str = ""
    """The commit the task starts from; for a local repo_dir, the commit its files make (checked when set)."""
    problem_statement: str = Field(min_length=1)
    """The issue text the agent gets."""
    patch: str = ""
    """The gold patch (a unified diff) that fixes the issue."""
    test_patch: str = ""
    """The diff adding the hidden tests; applied only when grading."""
    fail_to_pass: list[str] = Field(alias="FAIL_TO_PASS", min_length=1)
    """Test ids the fix must make pass."""
    pass_to_pass: list[str] = Field(alias="PASS_TO_PASS", default_factory=list)
    """Test ids that pass before the fix and must keep passing."""
    version: str = ""
    hints_text: str = ""
    image: str = "python:3.11-slim"
    """The sandbox image the repository runs in."""
    repo_dir: Path | None = None
    """A local folder with the repository's files at base state; None when the image already holds them."""
    workdir: str = "/testbed"
    """Where the repository lives inside the sandbox."""
    setup_commands: list[str] = Field(default_factory=list)
    """Shell lines run in workdir after the files are in place and before the base commit (e.g. installs)."""
    test_cmd: str = DEFAULT_TEST_CMD
    """The test command; the test files named by FAIL_TO_PASS and PASS_TO_PASS are appended."""

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, value: object) -> object:
        # SWE-bench's Hugging Face datasets store these lists as JSON text.
        return json.loads(value) if isinstance(value, str) else value

    @property
    def test_files(self) -> list[str]:
        """The test files the graded tests live in, in first-seen order (what SWE-bench's test directives are)."""
        return list(dict.fromkeys(test_id.split("::", 1)[0] for test_id in self.fail_to_pass + self.pass_to_pass))


def resolve_source(source: str | Path) -> tuple[Path, ...]:
    """The task files of a source: a bundled task set's name ("toyrepair") or a path."""
    if str(source) in BUNDLED:
        return BUNDLED[str(source)]
    path = Path(source)
    if not path.is_file():
        raise NotFound(f"task source {str(source)!r} is neither a file nor a bundled task set "
                       f"({', '.join(sorted(BUNDLED))})")
    return (path,)


def load_instances(source: str | Path, ids: list[str] | None = None) -> list[TaskInstance]:
    """Load instances from a JSON list or a JSON-lines file (or a bundled task set), optionally only `ids`.

    A relative `repo_dir` is taken relative to the file's folder. Raises InvalidArgument naming the line
    and field at fault.
    """
    paths = resolve_source(source)
    instances = [i for path in paths for i in _read_instances(path)]
    seen: set[str] = set()
    for instance in instances:
        if instance.instance_id in seen:
            raise InvalidArgument(f"{' + '.join(map(str, paths))}: instance id {instance.instance_id!r} appears "
                                  "twice")
        seen.add(instance.instance_id)
    if ids:
        known = {i.instance_id: i for i in instances}
        missing = [i for i in ids if i not in known]
        if missing:
            raise NotFound(f"{source} has no instances {missing}; it has {sorted(known)}")
        return [known[i] for i in ids]
    return instances


def _read_instances(path: Path) -> list[TaskInstance]:
    """The instances of one JSON or JSON-lines file, a relative `repo_dir` made relative to its folder."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        try:
            records = [(i + 1, r) for i, r in enumerate(json.loads(text))]
        except json.JSONDecodeError as err:
            raise InvalidArgument(f"{path}: not valid JSON ({err})") from None
        where = "item"
    else:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise InvalidArgument(f"{path}:{number}: not valid JSON ({err})") from None
        where = "line"
    instances: list[TaskInstance] = []
    for number, record in records:
        try:
            instance = TaskInstance.model_validate(record)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}"
                                 for e in err.errors())
            raise InvalidArgument(f"{path} {where} {number}: not a valid task instance ({problems})") from None
        if instance.repo_dir is not None and not instance.repo_dir.is_absolute():
            instance = instance.model_copy(update={"repo_dir": path.parent / instance.repo_dir})
        instances.append(instance)
    return instances
