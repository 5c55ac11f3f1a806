from numkit.clamp import clamp


def test_below_range():
    assert clamp(-1, 0, 10) == 0
