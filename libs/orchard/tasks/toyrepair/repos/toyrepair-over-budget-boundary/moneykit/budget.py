"""Tracking spending against a budget, in whole cents."""


def remaining(limit: int, spent: int) -> int:
    """What is left of the budget (negative when overspent)."""
    return limit - spent


def is_over(limit: int, spent: int) -> bool:
    """True when more than the limit has been spent; spending exactly the limit is fine."""
    return spent >= limit
