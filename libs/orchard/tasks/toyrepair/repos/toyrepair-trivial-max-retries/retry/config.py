"""Retry settings."""

MAX_RETRIES = 2
"""How many times a failed call is retried (the docs say 3)."""
BACKOFF_S = 0.5


def attempts() -> list[int]:
    """The attempt numbers, from 1 to MAX_RETRIES."""
    return list(range(1, MAX_RETRIES + 1))
