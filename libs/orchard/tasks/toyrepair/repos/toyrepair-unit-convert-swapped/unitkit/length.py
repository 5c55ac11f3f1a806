"""Converting lengths between metric units."""

METRES = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0}
"""How many metres one of each unit is."""


def _factor(from_unit: str, to_unit: str) -> float:
    """What to multiply a length in from_unit by to get it in to_unit."""
    return METRES[from_unit] / METRES[to_unit]


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """value, a length in from_unit, expressed in to_unit."""
    if from_unit not in METRES or to_unit not in METRES:
        raise ValueError(f"unknown unit: {from_unit} or {to_unit}")
    return value * _factor(to_unit, from_unit)
