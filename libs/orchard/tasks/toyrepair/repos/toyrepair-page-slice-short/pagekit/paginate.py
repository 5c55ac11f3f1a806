"""Splitting a list into numbered pages."""


def page_count(total: int, size: int) -> int:
    """How many pages of `size` items `total` items fill (the last one may be short)."""
    if size <= 0:
        raise ValueError("size must be positive")
    return (total + size - 1) // size


def page(items: list, number: int, size: int) -> list:
    """Page `number` (counted from 1) of items, `size` items to a page; [] past the last page."""
    if number < 1:
        raise ValueError("pages are numbered from 1")
    start = (number - 1) * size
    return items[start:start + size - 1]
