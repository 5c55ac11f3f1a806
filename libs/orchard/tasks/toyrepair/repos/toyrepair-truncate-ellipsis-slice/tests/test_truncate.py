import pytest

from strkit.truncate import truncate


def test_short_text_unchanged():
    assert truncate("hello", 10) == "hello"


def test_exact_width_unchanged():
    assert truncate("hello", 5) == "hello"


def test_width_too_small():
    with pytest.raises(ValueError):
        truncate("hello", 2)
