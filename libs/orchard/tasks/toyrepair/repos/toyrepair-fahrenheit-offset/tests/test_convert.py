from tempkit.convert import f_to_c


def test_boiling():
    assert f_to_c(212) == 100


def test_freezing():
    assert f_to_c(32) == 0
