"""MiniWoB++ tasks, served by SiteServer from the pages the `miniwob` package ships (scripts/install.sh installs it
with --no-deps). Only the package's html/ folder is used (miniwob's Python side drives Selenium; Orchard drives
the pages itself).

A page starts an episode when the "START" box is clicked, and when the episode ends shows "Last reward: 0.93"
(time-discounted; -1.00 on failure) and "Episodes done: 1" in its side panel: the checks read that text.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from orchard.errors import FailedPrecondition
from orchard.tasks.web.tasks import WebCheck, WebTask

MINIWOB_PREFIX = "/miniwob"
"""Where SiteServer serves the package's html/ folder; the tasks live under /miniwob/miniwob/."""
MINIWOB_VERSION = "1.1.0"
"""The tested version (scripts/install.sh pins it)."""
EPISODE_MAX_MS = 600_000
"""How long an episode may last: MiniWoB's default 10 s suits RL policies, not LLM agents taking seconds a step."""

CORE_JS_PATCH = f"""
// Added by Orchard's SiteServer: a longer episode for LLM agents, and "?seed=..." fixes the problem the page
// generates (miniwob's Python side calls Math.seedrandom the same way).
core.EPISODE_MAX_TIME = {EPISODE_MAX_MS};
if (core.QueryString.seed) {{ Math.seedrandom(core.QueryString.seed); }}
"""

_GOAL = (
    'Click the "START" box, then do what the instruction at the top of the page says ({hint}). Do it once: '
    "the page then shows your reward."
)
_TASKS = (
    # (task name, hint, seed, solution after clicking START)
    ("click-test", 'it says "Click the button."', "", [{"action": "click", "selector": "#subbtn"}]),
    ("focus-text", "it asks you to focus the text box", "", [{"action": "click", "selector": "#tt"}]),
    (
        "enter-text",
        "it names a word to type into the text field and submit",
        "7",
        [{"action": "type", "selector": "#tt", "text": "Nathalie"}, {"action": "click", "selector": "#subbtn"}],
    ),
)


def miniwob_html_dir() -> Path | None:
    """The html/ folder of the installed `miniwob` package, or None when it is not installed."""
    # find_spec does not import the package (whose import registers gymnasium environments).
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        return None
    html_dir = Path(next(iter(spec.submodule_search_locations))) / "html"
    return html_dir if (html_dir / "core" / "core.js").is_file() else None


def miniwob_core_js(html_dir: Path) -> str:
    """MiniWoB's core.js as SiteServer serves it: the original plus CORE_JS_PATCH."""
    return (html_dir / "core" / "core.js").read_text() + CORE_JS_PATCH


def miniwob_tasks() -> list[WebTask]:
    """A few simple MiniWoB++ tasks, checked by the reward text the page shows."""
    if miniwob_html_dir() is None:
        raise FailedPrecondition(
            f"the miniwob package is not installed; run scripts/install.sh, or pip install "
            f"--no-deps miniwob=={MINIWOB_VERSION}, to serve MiniWoB++ tasks"
        )
    # Success: one episode ended with a positive reward (failure shows "-1.00", an unfinished one "-").
    check = WebCheck(text_contains=("Episodes done: 1",), text_absent=("Last reward: -",))
    tasks = []
    for name, hint, seed, steps in _TASKS:
        query = f"?seed={seed}" if seed else ""
        tasks.append(
            WebTask(
                task_id=f"miniwob-{name}",
                goal=_GOAL.format(hint=hint),
                start_url=f"{{site}}{MINIWOB_PREFIX}/miniwob/{name}.html{query}",
                check=check,
                solution=({"action": "click", "selector": "#sync-task-cover"}, *steps),
                category="miniwob",
                source="miniwob",
            )
        )
    return tasks
