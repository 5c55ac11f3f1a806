import pytest

from textkit.chunks import chunks


def test_even_length():
    assert chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_bad_size():
    with pytest.raises(ValueError):
        chunks([1], 0)
