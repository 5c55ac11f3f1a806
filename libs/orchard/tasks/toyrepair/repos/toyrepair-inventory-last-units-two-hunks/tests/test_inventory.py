import pytest

from stockkit.inventory import OutOfStock, can_fill, restock, take


def test_restock():
    stock = {}
    restock(stock, "pear", 4)
    restock(stock, "pear", 1)
    assert stock == {"pear": 5}


def test_plenty_in_stock():
    stock = {"apple": 10}
    assert can_fill(stock, "apple", 3)
    take(stock, "apple", 3)
    assert stock == {"apple": 7}


def test_too_many():
    with pytest.raises(OutOfStock):
        take({"apple": 2}, "apple", 5)
