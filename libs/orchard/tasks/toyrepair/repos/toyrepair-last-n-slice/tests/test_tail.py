from listkit.tail import last_n


def test_zero():
    assert last_n([1, 2, 3], 0) == []
