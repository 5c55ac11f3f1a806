"""Personal-assistant tasks (the Claw recipe): generated tasks over a plain-data world of mail, calendar and files,
declarative checks on the world a run leaves, and Claw-Eval scoring. `load_tasks()` loads the bundled set.

A world state is JSON-serialisable data:
    {"user": {"name", "email"}, "allowed_domains": ["acme.test"], "contacts": [{"name", "email"}],
     "mail": [{"id", "folder": "INBOX" | "Sent", "from", "to", "cc", "subject", "body", "date"}],
     "events": [{"uid", "summary", "start", "end", "location", "attendees", "description"}],
     "files": {path relative to the files area: text}}
"""

from orchard.tasks.assistant.checks import (
    AnswerContains,
    Check,
    CheckResult,
    EventAbsent,
    EventExists,
    EventUnchanged,
    FileAbsent,
    FileContains,
    FileLacks,
    FileUnchanged,
    MailSent,
    NoMailOutsideDomains,
    NoMailSent,
    evaluate,
)
from orchard.tasks.assistant.scoring import (
    PASS_SCORE,
    AssistantGrade,
    claw_report,
    format_claw_report,
    grade,
    pass_at_k,
    pass_hat_k,
)
from orchard.tasks.assistant.tasks import (
    TOOLS,
    AssistantTask,
    load_tasks,
    read_tasks,
    write_tasks,
)

__all__ = [
    "PASS_SCORE",
    "TOOLS",
    "AnswerContains",
    "AssistantGrade",
    "AssistantTask",
    "Check",
    "CheckResult",
    "EventAbsent",
    "EventExists",
    "EventUnchanged",
    "FileAbsent",
    "FileContains",
    "FileLacks",
    "FileUnchanged",
    "MailSent",
    "NoMailOutsideDomains",
    "NoMailSent",
    "claw_report",
    "evaluate",
    "format_claw_report",
    "grade",
    "load_tasks",
    "pass_at_k",
    "pass_hat_k",
    "read_tasks",
    "write_tasks",
]
