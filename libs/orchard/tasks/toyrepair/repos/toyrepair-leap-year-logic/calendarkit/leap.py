"""The Gregorian leap-year rule."""


def is_leap(year: int) -> bool:
    """True when year is a leap year in the Gregorian calendar."""
    return year % 4 == 0 and year % 100 != 0 and year % 400 == 0
