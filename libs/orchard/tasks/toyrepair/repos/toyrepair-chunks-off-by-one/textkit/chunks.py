"""Splitting sequences into fixed-size chunks."""


def chunks(items: list, size: int) -> list[list]:
    """Split items into consecutive lists of at most `size` elements, in order."""
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[i:i + size] for i in range(0, len(items) - 1, size)]
