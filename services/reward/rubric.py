"""Judge rubrics as data: a YAML file (or the request's criteria) → a validated `Rubric` of weighted criteria."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

BUNDLED_RUBRIC = Path(__file__).resolve().parent / "rubrics" / "swe.yaml"
"""The seven-criterion SWE rubric (R1 fix quality to R7 verification integrity, recipes §2.5)."""
WEIGHT_TOLERANCE = 1e-6
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")


class RubricError(ValueError):
    """A rubric is malformed; the message names the file or field and the criterion."""


@dataclass(frozen=True)
class Criterion:
    """One rubric criterion: the id the judge's JSON uses, a short name, its weight and what to score."""

    id: str
    name: str
    weight: float
    description: str


@dataclass(frozen=True)
class Rubric:
    """Weighted criteria whose weights sum to 1, in the order the judge sees and the scores are reported."""

    name: str
    criteria: tuple[Criterion, ...]

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.criteria]


def build_rubric(name: str, criteria: Sequence[Criterion]) -> Rubric:
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
    return Rubric(name=name, criteria=tuple(criteria))


def parse_rubric(data: object, source: str) -> Rubric:
    """A rubric from parsed YAML: `{name: str, criteria: [{id, name, weight, description}, ...]}`."""
    if not isinstance(data, dict):
        raise RubricError(f"{source}: expected a mapping with 'criteria'; got {type(data).__name__}")
    unknown = set(data) - {"name", "criteria"}
    if unknown:
        raise RubricError(f"{source}: unknown keys {sorted(unknown)}; expected 'name' and 'criteria'")
    items = data.get("criteria")
    if not isinstance(items, list):
        raise RubricError(f"{source}: 'criteria' must be a list of {{id, name, weight, description}}")
    criteria = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RubricError(f"{source}: criteria[{i}] must be a mapping; got {type(item).__name__}")
        missing = [k for k in ("id", "name", "weight", "description") if k not in item]
        extra = set(item) - {"id", "name", "weight", "description"}
        if missing:
            raise RubricError(f"{source}: criteria[{i}] lacks {missing}; each criterion has id, name, weight and "
                              "description")
        if extra:
            raise RubricError(f"{source}: criteria[{i}] has unknown keys {sorted(extra)}")
        weight = item["weight"]
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise RubricError(f"{source}: criteria[{i}] ({item['id']}): weight must be a number; got {weight!r}")
        criteria.append(Criterion(id=str(item["id"]), name=str(item["name"]), weight=float(weight),
                                  description=" ".join(str(item["description"]).split())))
    try:
        return build_rubric(str(data.get("name", "custom")), criteria)
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
