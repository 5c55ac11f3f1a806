"""The Claw assistant environment: a sandbox running real mail (SMTP + IMAP), calendar (CalDAV) and a files area,
seeded from an assistant task's world state (`orchard.tasks.assistant`), with the assistant's tools as calls into
it (`AssistantEnv`) and as OpenAI-style function specs (`TOOLS`). The in-sandbox side is `sandbox/*.py`."""

from orchard.assistant.env import AssistantEnv
from orchard.assistant.tools import TOOLS

__all__ = ["TOOLS", "AssistantEnv"]
