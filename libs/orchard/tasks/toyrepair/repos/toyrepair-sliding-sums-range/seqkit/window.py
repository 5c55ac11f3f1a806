"""Sliding windows over a sequence."""


def sliding_sums(values: list[float], k: int) -> list[float]:
    """The sums of every run of k consecutive values, left to right (len(values) - k + 1 of them)."""
    if k <= 0:
        raise ValueError("k must be positive")
    return [sum(values[i:i + k]) for i in range(len(values) - k)]


def total(values: list[float]) -> float:
    """The sum of all values."""
    return sum(values)
