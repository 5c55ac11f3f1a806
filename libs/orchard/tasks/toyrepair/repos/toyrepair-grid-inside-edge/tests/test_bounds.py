from gridkit.bounds import area, inside


def test_centre_is_inside():
    assert inside((1, 1), (0, 0, 3, 3))


def test_far_edge_is_outside():
    assert not inside((3, 1), (0, 0, 3, 3))
    assert not inside((1, 3), (0, 0, 3, 3))


def test_area():
    assert area((0, 0, 3, 2)) == 6
    assert area((2, 2, 1, 5)) == 0
