from moneykit.budget import remaining


def test_remaining():
    assert remaining(1000, 250) == 750


def test_overspent_is_negative():
    assert remaining(100, 130) == -30
