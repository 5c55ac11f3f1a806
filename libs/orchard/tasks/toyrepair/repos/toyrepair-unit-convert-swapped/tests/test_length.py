import pytest

from unitkit.length import _factor


def test_factor_km_to_m():
    assert _factor("km", "m") == 1000


def test_factor_mm_to_cm():
    assert _factor("mm", "cm") == pytest.approx(0.1)
