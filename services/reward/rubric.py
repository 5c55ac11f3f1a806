"""Judge rubrics as data: a YAML file (or the request's criteria) → a validated `Rubric` of weighted criteria, with
the test-evidence guards (docs/training.md §2.5 [I]) the file sets."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

BUNDLED_RUBRIC = Path(__file__).resolve().parent / "rubrics" / "swe.yaml"
"""The seven-criterion SWE rubric (R1 fix quality to R7 verification integrity, docs/training.md §2.5)."""
WEIGHT_TOLERANCE = 1e-6
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_CRITERION_KEYS = ("id", "name", "weight", "description")

# Parts of the default test commands: a Python interpreter with its flags, a script whose name holds "test" or
# "repro", and the end of a command word.
_PY = r"(?:\S*/)?python[\d.]*\s+(?:-\S+\s+)*"
_SCRIPT = r"(?:\S*/)?[^\s/]*(?:test|repro)[^\s/]*"
_END = r"""(?=[\s)'"]|$)"""
DEFAULT_TEST_COMMANDS: tuple[str, ...] = (
    rf"(?:{_PY}-m\s+)?(?:pytest|py\.test){_END}",  # pytest, python -m pytest
    rf"{_PY}-m\s+(?:unittest|nose2?|tox|nox){_END}",  # python -m unittest ...
    rf"(?:tox|nox|ctest){_END}",
    rf"(?:npm|yarn|pnpm)\s+(?:run\s+)?test(?::\S*)?{_END}",  # npm test, yarn run test:unit
    rf"(?:npx\s+)?(?:jest|vitest|mocha){_END}",
    rf"go\s+test{_END}",
    rf"cargo\s+(?:test|nextest){_END}",
    rf"(?:mvn|\./mvnw|gradle|\./gradlew)\s+(?:-\S+\s+)*test{_END}",
    rf"make\s+(?:-\S+\s+)*(?:test|tests|check){_END}",
    rf"{_PY}(?:\S*/)?manage\.py\s+test{_END}",  # Django's runner
    r"(?:\S*/)?run_?tests?\b",  # run_tests, ./run_tests.sh, a run_tests tool
    rf"(?:{_PY}|node\s+){_SCRIPT}\.(?:py|js|mjs|ts){_END}",  # python reproduce_bug.py, python tests/t.py
    rf"(?:bash|sh|zsh)\s+(?:-\S+\s+)*{_SCRIPT}{_END}",  # bash run_test.sh, sh repro.sh
    rf"\.{{0,2}}/{_SCRIPT}{_END}",  # ./test.sh, /tmp/repro
)
"""What counts as running a test when a rubric's `test_evidence` lists no `commands`: regexes matched,
case-insensitively, at the start of each shell command of a step (see guards.py for how a step is split)."""


class RubricError(ValueError):
    """A rubric is malformed; the message names the file or field and the criterion."""


@dataclass(frozen=True)
class Criterion:
    """One rubric criterion: the id the judge's JSON uses, a short name, its weight and what to score."""

    id: str
    name: str
    weight: float
    description: str
    needs_test_evidence: bool = False
    """A score above the rubric's `criterion_cap` needs a step that ran a test (and was cited, when the judge
    cites steps); without one it is clamped to the cap."""


def _default_commands() -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(c, re.IGNORECASE) for c in DEFAULT_TEST_COMMANDS)


@dataclass(frozen=True)
class EvidencePolicy:
    """A rubric's test-evidence guards (docs/training.md §2.5 [I]): what counts as a test run, and the caps."""

    commands: tuple[re.Pattern[str], ...] = field(default_factory=_default_commands)
    """Regexes matched at the start of each shell command of a step; one match means the step ran a test."""
    criterion_cap: float = 0.5
    """The most a `needs_test_evidence` criterion may score without a (cited) step that ran a test: 0.5 is
    "no evidence either way" on the 0-1 scale, so the guard never pushes a score below neutral."""
    no_test_cap: float = 0.3
    """The most J may be when no step ran a test at all. A choice: with the default alpha 0.5 an untested
    trajectory earns at most +0.15, under the +0.25 of a tested one scored at a middling 0.5."""


@dataclass(frozen=True)
class Rubric:
    """Weighted criteria whose weights sum to 1, in the order the judge sees and the scores are reported."""

    name: str
    criteria: tuple[Criterion, ...]
    test_evidence: EvidencePolicy | None = None
    """The test-evidence guards; None judges unguarded (request rubrics, files that set no guards)."""

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.criteria]

    @property
    def evidence_ids(self) -> list[str]:
        """The criteria that need test evidence."""
        return [c.id for c in self.criteria if c.needs_test_evidence]


def aggregate(scores: dict[str, float], rubric: Rubric) -> float:
    """J: the weighted mean of the (snapped) scores, clamped to [0, 1]."""
    total = sum(c.weight * scores[c.id] for c in rubric.criteria)
    return min(1.0, max(0.0, round(total, 9)))


def build_rubric(name: str, criteria: Sequence[Criterion], test_evidence: EvidencePolicy | None = None) -> Rubric:
    """A validated rubric; raises RubricError naming the criterion at fault."""
    if not criteria:
        raise RubricError("the rubric has no criteria; give at least one")
    seen: set[str] = set()
    for i, c in enumerate(criteria):
        where = f"criteria[{i}]" + (f" ({c.id})" if c.id else "")
        if not _ID.match(c.id):
            raise RubricError(f"{where}: id {c.id!r} must be a short identifier such as 'R1'")
        if c.id.upper() in seen:
            raise RubricError(f"{where}: id {c.id!r} is used twice (ids are matched case-insensitively)")
        seen.add(c.id.upper())
        if not c.name.strip():
            raise RubricError(f"{where}: name is empty")
        if not c.description.strip():
            raise RubricError(f"{where}: description is empty; say what the judge scores")
        if not c.weight > 0:
            raise RubricError(f"{where}: weight must be positive; got {c.weight!r}")
    total = sum(c.weight for c in criteria)
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        weights = ", ".join(f"{c.id}={c.weight:g}" for c in criteria)
        raise RubricError(f"the weights sum to {total:g}, not 1 ({weights})")
    if test_evidence is None and any(c.needs_test_evidence for c in criteria):
        test_evidence = EvidencePolicy()  # marking a criterion turns the guards on with their defaults
    return Rubric(name=name, criteria=tuple(criteria), test_evidence=test_evidence)


def _cap(data: dict[str, object], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise RubricError(f"test_evidence.{key} must be a number in [0, 1]; got {value!r}")
    return float(value)


def parse_evidence(data: object) -> EvidencePolicy:
    """The guards of a rubric file: `{commands: [regex, ...], criterion_cap: 0.5, no_test_cap: 0.3}`, each
    optional."""
    if not isinstance(data, dict):
        raise RubricError(
            f"test_evidence must be a mapping (commands, criterion_cap, no_test_cap); got {type(data).__name__}"
        )
    unknown = set(data) - {"commands", "criterion_cap", "no_test_cap"}
    if unknown:
        raise RubricError(
            f"test_evidence has unknown keys {sorted(unknown)}; expected commands, criterion_cap and no_test_cap"
        )
    policy = EvidencePolicy(criterion_cap=_cap(data, "criterion_cap", 0.5), no_test_cap=_cap(data, "no_test_cap", 0.3))
    if "commands" not in data:
        return policy
    commands = data["commands"]
    if not isinstance(commands, list) or not commands:
        raise RubricError("test_evidence.commands must be a non-empty list of regexes (omit it for the defaults)")
    compiled = []
    for i, c in enumerate(commands):
        try:
            compiled.append(re.compile(str(c), re.IGNORECASE))
        except re.error as err:
            raise RubricError(f"test_evidence.commands[{i}] {c!r} is not a valid regex: {err}") from None
    return EvidencePolicy(commands=tuple(compiled), criterion_cap=policy.criterion_cap, no_test_cap=policy.no_test_cap)


def parse_rubric(data: object, source: str) -> Rubric:
    """A rubric from parsed YAML: `{name: str, criteria: [{id, name, weight, description, needs_test_evidence},
    ...], test_evidence: {...}}` (needs_test_evidence and test_evidence optional)."""
    if not isinstance(data, dict):
        raise RubricError(f"{source}: expected a mapping with 'criteria'; got {type(data).__name__}")
    unknown = set(data) - {"name", "criteria", "test_evidence"}
    if unknown:
        raise RubricError(f"{source}: unknown keys {sorted(unknown)}; expected 'name', 'criteria' and 'test_evidence'")
    items = data.get("criteria")
    if not isinstance(items, list):
        raise RubricError(f"{source}: 'criteria' must be a list of {{id, name, weight, description}}")
    criteria = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RubricError(f"{source}: criteria[{i}] must be a mapping; got {type(item).__name__}")
        missing = [k for k in _CRITERION_KEYS if k not in item]
        extra = set(item) - {*_CRITERION_KEYS, "needs_test_evidence"}
        if missing:
            raise RubricError(
                f"{source}: criteria[{i}] lacks {missing}; each criterion has id, name, weight and description"
            )
        if extra:
            raise RubricError(f"{source}: criteria[{i}] has unknown keys {sorted(extra)}")
        weight = item["weight"]
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise RubricError(f"{source}: criteria[{i}] ({item['id']}): weight must be a number; got {weight!r}")
        needs = item.get("needs_test_evidence", False)
        if not isinstance(needs, bool):
            raise RubricError(
                f"{source}: criteria[{i}] ({item['id']}): needs_test_evidence must be true or false; got {needs!r}"
            )
        criteria.append(
            Criterion(
                id=str(item["id"]),
                name=str(item["name"]),
                weight=float(weight),
                description=" ".join(str(item["description"]).split()),
                needs_test_evidence=needs,
            )
        )
    try:
        evidence = parse_evidence(data["test_evidence"]) if "test_evidence" in data else None
        return build_rubric(str(data.get("name", "custom")), criteria, evidence)
    except RubricError as err:
        raise RubricError(f"{source}: {err}") from None


def load_rubric(path: Path) -> Rubric:
    """Load and validate a rubric YAML file."""
    try:
        text = path.read_text()
    except OSError as err:
        raise RubricError(f"cannot read rubric file {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RubricError(f"{path}: not valid YAML: {err}") from None
    return parse_rubric(data, str(path))
