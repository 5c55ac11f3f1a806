from datetime import date

from datekit.span import weekday_name


def test_weekday_name():
    assert weekday_name(date(2025, 1, 1)) == "Wednesday"


def test_sunday():
    assert weekday_name(date(2024, 3, 3)) == "Sunday"
