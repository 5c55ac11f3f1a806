"""The median of a list of numbers."""


def median(values: list[float]) -> float:
    """The middle value; the mean of the two middle values when there is an even number of them."""
    if not values:
        raise ValueError("median of an empty list")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid] + ordered[mid + 1]) / 2
