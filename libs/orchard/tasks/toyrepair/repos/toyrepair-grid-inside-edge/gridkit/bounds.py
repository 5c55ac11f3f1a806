"""Axis-aligned boxes on an integer grid, as (x0, y0, x1, y1): x0 and y0 included, x1 and y1 excluded."""


def inside(p: tuple[int, int], box: tuple[int, int, int, int]) -> bool:
    """True when point p lies in the half-open box [x0, x1) x [y0, y1)."""
    x, y = p
    x0, y0, x1, y1 = box
    return x0 <= x < x1 and y0 < y < y1


def area(box: tuple[int, int, int, int]) -> int:
    """The number of grid cells in the box (0 when it is empty)."""
    x0, y0, x1, y1 = box
    return max(0, x1 - x0) * max(0, y1 - y0)
