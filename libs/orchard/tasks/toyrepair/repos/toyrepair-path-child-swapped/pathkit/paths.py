"""Joining and splitting slash-separated paths."""


def _join(head: str, tail: str) -> str:
    """head and tail joined by exactly one slash."""
    return head.rstrip("/") + "/" + tail.lstrip("/")


def child(parent: str, name: str) -> str:
    """The path of the entry `name` inside the directory `parent`."""
    return _join(name, parent)


def basename(path: str) -> str:
    """The last component of path ("" for a path ending in a slash)."""
    return path.rsplit("/", 1)[-1]
