"""Web tasks for GUI agents: the task and check types, and loading task sets from JSON-lines files.

A task names a start page, a goal and a check on the final page (its URL, title and visible text). Bundled tasks
run on the sites that `SiteServer` serves; their URLs hold "{site}", the server's base URL.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config

from orchard.errors import InvalidArgument

BUNDLED_FILE = Path(__file__).resolve().parent / "tasks.jsonl"
"""The bundled task set, run on the sites `SiteServer` serves."""
SITE = "{site}"
"""The placeholder for the site server's base URL in task URLs and solutions."""
ACTIONS = ("click", "double_click", "type", "key_press", "scroll", "navigate", "back", "wait")
"""Browser actions a scripted solution may use: the names of orchard.env.v1 ActionType, lower case."""
ACTION_FIELDS = ("action", "selector", "x", "y", "text", "key", "delta_x", "delta_y", "url")
"""Keys a solution step may hold: fields of orchard.env.v1 ActRequest."""
_NEEDS = {"type": ("text",), "key_press": ("key",), "navigate": ("url",)}


def _squash(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class CheckResult:
    """Whether a page passed a check, and why not."""

    passed: bool
    reasons: tuple[str, ...] = ()
    """One human-readable line per failed condition; empty when passed."""


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class WebCheck:
    """Conditions on the final page; every condition that is set must hold."""

    url_path: str = ""
    """When set, the final URL's path must equal it (query and fragment ignored)."""
    url_query: Mapping[str, str] = field(default_factory=dict)
    """Each key must have this value in the final URL's query."""
    title_contains: str = ""
    """When set, must appear in the page title."""
    text_contains: tuple[str, ...] = ()
    """Each must appear in the page's visible text (case-sensitive, whitespace runs count as one space)."""
    text_absent: tuple[str, ...] = ()
    """None may appear in the page's visible text."""

    def evaluate(self, url: str, title: str, text: str) -> CheckResult:
        """Check a page given its URL, title and visible text (e.g. `document.body.innerText`)."""
        reasons = []
        parts = urlsplit(url)
        if self.url_path and parts.path != self.url_path:
            reasons.append(f"the URL path is {parts.path!r}, not {self.url_path!r}")
        query = parse_qsl(parts.query, keep_blank_values=True)
        for key, value in self.url_query.items():
            if (key, value) not in query:
                found = [v for k, v in query if k == key]
                reasons.append(
                    f"the URL query has {key}={found[0]!r}, not {value!r}"
                    if found
                    else f"the URL query lacks {key}={value!r}"
                )
        if self.title_contains and self.title_contains not in title:
            reasons.append(f"the title {title!r} lacks {self.title_contains!r}")
        text = _squash(text)
        reasons += [f"the page text lacks {s!r}" for s in self.text_contains if _squash(s) not in text]
        reasons += [f"the page text contains {s!r}" for s in self.text_absent if _squash(s) in text]
        return CheckResult(passed=not reasons, reasons=tuple(reasons))


def _fill(value: object, site: str) -> object:
    return value.replace(SITE, site.rstrip("/")) if isinstance(value, str) else value


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class WebTask:
    """A goal for a browser agent, where it starts, and how to tell it succeeded."""

    task_id: str
    goal: str
    """The instruction shown to the agent."""
    start_url: str
    """"{site}/shop/index.html" for bundled tasks ({site} = the site server's base URL), or an absolute URL."""
    check: WebCheck
    solution: tuple[Mapping[str, Any], ...] = ()
    """A scripted solution: browser actions such as {"action": "click", "selector": "#add-mug-blue"}."""
    allow_hosts: tuple[str, ...] = ()
    """Extra hosts the browser may reach (external tasks); the site server is always allowed."""
    category: str = ""
    """"form", "search", "shopping", "navigation", "miniwob", ..."""
    source: str = "bundled"

    @property
    def instance_id(self) -> str:
        """The task id under the name the rollout runner and reports use for every kind of task."""
        return self.task_id

    def __post_init__(self) -> None:
        for name in ("task_id", "goal", "start_url"):
            if not getattr(self, name).strip():
                raise ValueError(f"{name} must not be empty")
        for number, step in enumerate(self.solution, 1):
            action = step.get("action")
            if action not in ACTIONS:
                raise ValueError(f"solution step {number}: action {action!r} is not one of {', '.join(ACTIONS)}")
            unknown = sorted(set(step) - set(ACTION_FIELDS))
            if unknown:
                raise ValueError(f"solution step {number}: unknown keys {unknown}; allowed: {', '.join(ACTION_FIELDS)}")
            missing = [k for k in _NEEDS.get(str(action), ()) if k not in step]
            if missing:
                raise ValueError(f"solution step {number}: a {action!r} step needs {', '.join(missing)}")

    def url(self, site: str) -> str:
        """The start URL with {site} filled in."""
        return str(_fill(self.start_url, site))

    def actions(self, site: str) -> list[dict[str, Any]]:
        """The scripted solution with {site} filled in wherever it appears in string values."""
        return [{key: _fill(value, site) for key, value in step.items()} for step in self.solution]


_ROW = TypeAdapter(WebTask)


def task_from_row(row: object) -> WebTask:
    """A task from one JSON object: this module's format, or a WebVoyager row (id, web, ques) plus our "check"."""
    if isinstance(row, dict) and "ques" in row:
        row = dict(row)
        web = row.pop("web", "")
        converted = {
            "task_id": row.pop("id", ""),
            "goal": row.pop("ques"),
            "start_url": web,
            "category": row.pop("web_name", ""),
            "source": "webvoyager",
            "allow_hosts": [urlsplit(web).hostname] if isinstance(web, str) and urlsplit(web).hostname else [],
        }
        row = converted | row  # the rest (check, solution, allow_hosts ...) as in our format
    return _ROW.validate_python(row)


def _problems(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in err.errors())


def _read(path: Path) -> list[WebTask]:
    tasks: list[WebTask] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = task_from_row(json.loads(line))
        except json.JSONDecodeError as err:
            raise InvalidArgument(f"{path}:{number}: not valid JSON ({err})") from None
        except ValidationError as err:
            raise InvalidArgument(f"{path}:{number}: not a valid web task ({_problems(err)})") from None
        if task.task_id in seen:
            raise InvalidArgument(f"{path}:{number}: task id {task.task_id!r} appears twice")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


def load_tasks(path: str | os.PathLike[str] | None = None, ids: Sequence[str] | None = None) -> list[WebTask]:
    """Load web tasks: None = the bundled set, "miniwob" = MiniWoB++ tasks (needs the `miniwob` package, which
    scripts/install.sh installs), or a .jsonl file of tasks in this module's format or WebVoyager-style rows;
    optionally only `ids`, in that order.

    Raises InvalidArgument (a ValueError) naming the file, line and problem, or the unknown ids and the known ones;
    FailedPrecondition for "miniwob" without the package.
    """
    if path is not None and str(path) == "miniwob":
        from orchard.tasks.web.miniwob import miniwob_tasks

        tasks, where = miniwob_tasks(), "the miniwob task set"
    else:
        file = BUNDLED_FILE if path is None else Path(path)
        if not file.is_file():
            raise InvalidArgument(
                f'web task file {str(file)!r} does not exist (pass a .jsonl file, "miniwob", '
                "or None for the bundled set)"
            )
        tasks, where = _read(file), str(file)
    if not ids:
        return tasks
    known = {t.task_id: t for t in tasks}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise InvalidArgument(f"{where} has no tasks {unknown}; it has {sorted(known)}")
    return [known[i] for i in ids]
