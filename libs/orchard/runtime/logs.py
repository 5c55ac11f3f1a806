"""Structured logging for services: one JSON object per line, or a readable text line.

Fields passed with `logger.info("...", extra={"sandbox": "sb-1"})` become keys of the JSON
object (or `key=value` pairs in text), so logs can be filtered without regexes.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def configure_logging(level: str, fmt: Literal["json", "text"] | str) -> None:
    """Send all logs to stderr in `fmt` ("json" or "text") at `level`; safe to call again."""
    formatter: logging.Formatter
    if fmt == "json":
        formatter = JsonFormatter()
    elif fmt == "text":
        formatter = TextFormatter()
    else:
        raise ValueError(f"unknown log format {fmt!r}; use 'json' or 'text'")
    root = logging.getLogger()
    # Replace the handler an earlier call installed instead of stacking a second one.
    for handler in [h for h in root.handlers if isinstance(h, _OrchardHandler)]:
        root.removeHandler(handler)
    handler = _OrchardHandler(sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level.upper())


class _OrchardHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs, marked by its type so a second call can find it."""


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _RECORD_ATTRS}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, extras and any traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            entry.setdefault(key, value)  # the standard keys win over a clashing extra
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message key=value ...`, then any traceback on the following lines."""

    def format(self, record: logging.LogRecord) -> str:
        time = datetime.fromtimestamp(record.created).isoformat(sep=" ", timespec="milliseconds")
        pairs = "".join(f" {key}={value}" for key, value in _extras(record).items())
        line = f"{time} {record.levelname:<7} {record.name}: {record.getMessage()}{pairs}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
