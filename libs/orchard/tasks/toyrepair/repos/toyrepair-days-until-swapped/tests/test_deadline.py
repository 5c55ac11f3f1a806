from datetime import date

from timekit.deadline import days_until, is_overdue


def test_due_today():
    assert days_until(date(2025, 3, 1), date(2025, 3, 1)) == 0


def test_overdue():
    assert is_overdue(date(2025, 3, 2), date(2025, 3, 1))
    assert not is_overdue(date(2025, 3, 1), date(2025, 3, 1))
