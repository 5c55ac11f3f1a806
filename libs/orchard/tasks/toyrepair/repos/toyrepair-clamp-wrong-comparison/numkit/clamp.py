"""Limiting numbers to a range."""


def clamp(x: float, lo: float, hi: float) -> float:
    """x limited to the closed range [lo, hi]."""
    if x < lo:
        return lo
    if x < hi:
        return hi
    return x
