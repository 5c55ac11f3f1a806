"""The tail of a list."""


def last_n(items: list, n: int) -> list:
    """The last n items; all of them when n >= len(items); [] when n <= 0."""
    if n <= 0:
        return []
    return items[-n + 1:]
