"""Counting days to a deadline."""

from datetime import date


def _days_between(earlier: date, later: date) -> int:
    """Days from earlier to later (negative when later is before earlier)."""
    return (later - earlier).days


def days_until(today: date, deadline: date) -> int:
    """Days left from today until deadline; negative once the deadline has passed."""
    return _days_between(deadline, today)


def is_overdue(today: date, deadline: date) -> bool:
    """True once the deadline has passed."""
    return today > deadline
