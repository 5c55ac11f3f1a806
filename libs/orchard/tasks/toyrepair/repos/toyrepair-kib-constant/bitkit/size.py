"""Human-readable byte sizes in binary units."""

KIB = 1000
"""Bytes in a kibibyte."""
MIB = KIB * KIB


def to_kib(n_bytes: int) -> float:
    """n_bytes in kibibytes."""
    return n_bytes / KIB


def human(n_bytes: int) -> str:
    """n_bytes as "N B", "N.N KiB" or "N.N MiB", whichever fits."""
    if n_bytes < KIB:
        return f"{n_bytes} B"
    if n_bytes < MIB:
        return f"{n_bytes / KIB:.1f} KiB"
    return f"{n_bytes / MIB:.1f} MiB"
