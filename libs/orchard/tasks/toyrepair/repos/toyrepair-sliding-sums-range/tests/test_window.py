import pytest

from seqkit.window import sliding_sums, total


def test_window_longer_than_values():
    assert sliding_sums([1, 2], 3) == []


def test_bad_k():
    with pytest.raises(ValueError):
        sliding_sums([1, 2, 3], 0)


def test_total():
    assert total([1, 2, 3]) == 6
