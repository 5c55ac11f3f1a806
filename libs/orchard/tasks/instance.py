"""SWE-bench task instances: the model, and loading them from JSON, JSON-lines or Parquet files with clear errors.

The fields are SWE-bench's (SWE-Gym's are the same). Orchard adds how to set the repository up in a sandbox:
`image`, and either `repo_dir` (a local folder or git repository holding the repository at its base state) or
nothing (the image already holds the repository at `workdir`, as SWE-bench images do); and, for a repository
whose dependencies must be installed, an `environment` spec (envspec.py), which may also come from SWE-rebench's
`install_config` or a specs file. SWE-smith's per-instance `image_name` is taken as `image`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchard.errors import InvalidArgument, NotFound
from orchard.tasks.envspec import EnvSpec, EnvSpecs

_TOYREPAIR = Path(__file__).resolve().parent / "toyrepair"
BUNDLED = {
    "toyrepair": (_TOYREPAIR / "tasks.jsonl",),
    "toyrepair-extended": (_TOYREPAIR / "tasks.jsonl", _TOYREPAIR / "extended.jsonl"),
}
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
    environment: EnvSpec | None = None
    """How to install the repository's dependencies (a Python, Debian and Python packages, an install
    command); the instance then runs in an environment built once and forked (orchard env build)."""

    @model_validator(mode="before")
    @classmethod
    def _other_formats(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "install_config" in data and "environment" not in data:  # SWE-rebench
            config = data.pop("install_config")
            data["environment"] = json.loads(config) if isinstance(config, str) else config
        if data.get("image_name") and "image" not in data:  # SWE-smith: one image per repository
            data["image"] = data["image_name"]
        if isinstance(data.get("environment"), str):
            data["environment"] = json.loads(data["environment"])
        return data

    @field_validator("fail_to_pass", "pass_to_pass", mode="before")
    @classmethod
    def _json_list(cls, value: object) -> object:
        # SWE-bench's Hugging Face datasets store these lists as JSON text.
        return json.loads(value) if isinstance(value, str) else value

    @property
    def command(self) -> str:
        """The test command the environment sets, else the instance's."""
        return self.environment.test_cmd if self.environment and self.environment.test_cmd else self.test_cmd

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
        raise NotFound(
            f"task source {str(source)!r} is neither a file nor a bundled task set ({', '.join(sorted(BUNDLED))})"
        )
    return (path,)


def load_instances(
    source: str | Path, ids: list[str] | None = None, env_specs: str | Path | EnvSpecs | None = None
) -> list[TaskInstance]:
    """Load instances from a JSON list, a JSON-lines or a Parquet file (or a bundled task set), optionally only
    `ids`, giving each without an `environment` the one `env_specs` (a specs file) has for its repo and version.

    A relative `repo_dir` is taken relative to the file's folder. Raises InvalidArgument naming the line
    and field at fault.
    """
    paths = resolve_source(source)
    instances = [i for path in paths for i in _read_instances(path)]
    if env_specs is not None:
        specs = env_specs if isinstance(env_specs, EnvSpecs) else EnvSpecs.load(env_specs)
        instances = [
            i
            if i.environment is not None or (spec := specs.get(i.repo, i.version)) is None
            else i.model_copy(update={"environment": spec})
            for i in instances
        ]
    seen: set[str] = set()
    for instance in instances:
        if instance.instance_id in seen:
            raise InvalidArgument(f"{' + '.join(map(str, paths))}: instance id {instance.instance_id!r} appears twice")
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
    if path.suffix == ".parquet":
        records, where = _parquet_records(path), "row"
        return _validated(path, records, where)
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
    return _validated(path, records, where)


def _parquet_records(path: Path) -> list[tuple[int, object]]:
    """The rows of a Parquet export of a Hugging Face dataset (SWE-bench, SWE-Gym, SWE-smith, SWE-rebench)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidArgument("Parquet task files need pyarrow: pip install 'orchard[experience]'") from None
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # pyarrow's errors: a file that is not Parquet
        raise InvalidArgument(f"{path}: not a readable Parquet file ({err})") from None
    return [(i + 1, row) for i, row in enumerate(rows)]


def _validated(path: Path, records: list[tuple[int, object]], where: str) -> list[TaskInstance]:
    instances: list[TaskInstance] = []
    for number, record in records:
        try:
            instance = TaskInstance.model_validate(record)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in err.errors())
            raise InvalidArgument(f"{path} {where} {number}: not a valid task instance ({problems})") from None
        if instance.repo_dir is not None and not instance.repo_dir.is_absolute():
            instance = instance.model_copy(update={"repo_dir": path.parent / instance.repo_dir})
        instances.append(instance)
    return instances


def eval_task_ids(source: str) -> set[str]:
    """The task ids of an evaluation set: a task file (or bundled set), or a .txt list of ids, one per line, "#"
    starting a comment (the experience service's format)."""
    if source.endswith(".txt"):
        [path] = resolve_source(source)  # a .txt is a file, never a bundled set
        lines = path.read_text(encoding="utf-8").splitlines()
        return {task for line in lines if (task := line.split("#", 1)[0].strip())}
    return {i.instance_id for i in load_instances(source)}
