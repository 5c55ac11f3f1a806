"""Web tasks for GUI agents: bundled practice sites (forms, search, a shop, docs) served offline by `SiteServer`,
tasks with scripted solutions, and checks on the final page. `load_tasks()` loads the bundled set."""

from orchard.tasks.web.server import SiteServer
from orchard.tasks.web.tasks import CheckResult, WebCheck, WebTask, load_tasks

__all__ = ["CheckResult", "SiteServer", "WebCheck", "WebTask", "load_tasks"]
