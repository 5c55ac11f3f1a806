import pytest

from pagekit.paginate import page, page_count


def test_page_count():
    assert page_count(7, 3) == 3
    assert page_count(6, 3) == 2
    assert page_count(0, 3) == 0


def test_past_the_end():
    assert page([1, 2, 3], 5, 2) == []


def test_page_zero():
    with pytest.raises(ValueError):
        page([1, 2, 3], 0, 2)
