from calendarkit.leap import is_leap


def test_common_year():
    assert not is_leap(2023)


def test_century():
    assert not is_leap(1900)
