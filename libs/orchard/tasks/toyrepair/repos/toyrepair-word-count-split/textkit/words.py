"""Counting words."""


def word_count(text: str) -> int:
    """The number of words in text: runs of non-whitespace characters."""
    return len(text.split(" "))
