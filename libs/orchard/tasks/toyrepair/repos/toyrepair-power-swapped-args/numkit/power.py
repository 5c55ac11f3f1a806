"""Powers with a scale factor."""


def _power(base: float, exponent: float) -> float:
    return base ** exponent


def scaled_power(base: float, exponent: float, scale: float = 1) -> float:
    """scale * base ** exponent."""
    return scale * _power(exponent, base)
