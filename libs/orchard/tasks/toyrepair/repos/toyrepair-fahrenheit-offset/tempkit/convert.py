"""Converting temperatures between Celsius and Fahrenheit."""


def f_to_c(f: float) -> float:
    """Degrees Fahrenheit in Celsius."""
    return (f - 32) * 5 / 9


def c_to_f(c: float) -> float:
    """Degrees Celsius in Fahrenheit."""
    return c * 9 / 5 + 23
