from sortkit.check import first_descent


def test_first_descent():
    assert first_descent([1, 2, 5, 3, 0]) == 3


def test_no_descent():
    assert first_descent([1, 1, 2]) == -1
    assert first_descent([]) == -1
