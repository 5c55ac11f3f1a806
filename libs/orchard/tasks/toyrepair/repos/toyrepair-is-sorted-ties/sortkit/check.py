"""Checks on the order of a sequence."""


def is_sorted(items: list) -> bool:
    """True when items never decrease from one to the next (equal neighbours are fine)."""
    return all(a < b for a, b in zip(items, items[1:]))


def first_descent(items: list) -> int:
    """The index of the first item smaller than the one before it, or -1 when there is none."""
    for i in range(1, len(items)):
        if items[i] < items[i - 1]:
            return i
    return -1
