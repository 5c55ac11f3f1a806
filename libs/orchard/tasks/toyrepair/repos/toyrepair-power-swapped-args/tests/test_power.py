from numkit.power import scaled_power


def test_square_of_two():
    assert scaled_power(2, 2) == 4


def test_zero_scale():
    assert scaled_power(3, 1, scale=0) == 0
