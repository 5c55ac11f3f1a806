"""Runs of calendar days."""

from datetime import date, timedelta


def day_span(start: date, end: date) -> list[date]:
    """Every day from start to end, both included; [] when end is before start."""
    return [start + timedelta(days=i) for i in range((end - start).days)]


def weekday_name(day: date) -> str:
    """The English name of the day's weekday, e.g. "Monday"."""
    return ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"][day.weekday()]
