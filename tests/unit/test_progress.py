"""ProgressLine: redrawn in place on a terminal; plain, throttled lines in a log, ending with the final state."""

import io

from orchard.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_plain_lines_at_most_every_interval_and_the_last_state() -> None:
    out = io.StringIO()
    line = ProgressLine(out, interval_s=3600)
    for i in range(1, 101):
        line.update(f"{i}/100")
    line.update("stage two", force=True)
    line.update("stage two: 1/2")
    line.line("a message")
    line.update("stage two: 2/2")
    line.finish()
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == ["1/100", "stage two", "stage two: 1/2", "a message", "stage two: 2/2"]


def test_a_log_with_no_interval_gets_every_update() -> None:
    out = io.StringIO()
    line = ProgressLine(out, interval_s=0)
    for i in range(3):
        line.update(f"{i}")
    line.finish("done")
    assert out.getvalue().splitlines() == ["0", "1", "2", "done"]


def test_a_terminal_redraws_one_line_in_place() -> None:
    out = Terminal()
    line = ProgressLine(out, interval_s=3600)
    line.update("1/2")
    line.update("2/2")
    line.line("note")
    line.update("3/3")
    line.finish()
    assert out.getvalue() == "\r1/2\x1b[K\r2/2\x1b[K\nnote\n\r3/3\x1b[K\n"
