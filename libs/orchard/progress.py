"""Progress a person can read, on a terminal or in a log file.

On a terminal the line is redrawn in place. Elsewhere (a pipe, a CI log, `> file`) every redraw would be one
more `\\r` frame glued to the last, so a plain line is written at most every `interval_s` seconds, on a
`force`d update (a stage change), and once more with the final state.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

LOG_INTERVAL_S = 10.0
"""Least time between two progress lines when the output is not a terminal."""


class ProgressLine:
    """One progress line on `stream` (stderr by default)."""

    def __init__(self, stream: TextIO | None = None, *, interval_s: float = LOG_INTERVAL_S) -> None:
        self._stream = stream or sys.stderr
        self.tty = self._stream.isatty()
        self._interval_s = interval_s
        self._last_write = -float("inf")
        self._pending: str | None = None  # the latest text not yet written (logs only)
        self._dangling = False  # a terminal line was drawn without its newline

    def update(self, text: str, *, force: bool = False) -> None:
        """Show `text` as the current state; in a log only when forced or interval_s passed since the last line."""
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self._stream.write(f"\r{text[:width]}\x1b[K")
            self._dangling = True
            self._stream.flush()
            return
        now = time.monotonic()
        if force or now - self._last_write >= self._interval_s:
            self._write_line(text)
            self._last_write = now
        else:
            self._pending = text

    def line(self, text: str) -> None:
        """Write `text` as a line of its own, below the progress line."""
        self._end_line()
        self._write_line(text)

    def finish(self, text: str | None = None) -> None:
        """End the progress: write the final state (`text`, else the latest update) on a line that stays."""
        if text is not None:
            self._pending = None
            if self.tty:
                self.update(text)
            else:
                self._write_line(text)
        elif self._pending is not None:
            self._write_line(self._pending)
        self._end_line()

    def _end_line(self) -> None:
        if self._pending is not None and not self.tty:
            self._write_line(self._pending)
        if self._dangling:
            self._stream.write("\n")
            self._dangling = False
            self._stream.flush()

    def _write_line(self, text: str) -> None:
        self._pending = None
        self._stream.write(text + "\n")
        self._stream.flush()
