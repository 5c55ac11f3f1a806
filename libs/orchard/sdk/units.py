"""Kubernetes-style resource quantities ("4", "500m", "16Gi") as the proto's integers."""

from __future__ import annotations

import re

_MEMORY_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def cpu_millis(cpu: str | float | None) -> int:
    """Thousandths of a core: "4" or 4 -> 4000, "500m" -> 500, "0.5" -> 500; None -> 0 (service default)."""
    if cpu is None:
        return 0
    if isinstance(cpu, int | float):
        return round(cpu * 1000)
    match = _QUANTITY.match(cpu)
    if match is None or match.group(2) not in ("", "m"):
        raise ValueError(f"cpu {cpu!r} is not a CPU quantity; use e.g. '4', '0.5' or '500m'")
    value = float(match.group(1))
    return round(value if match.group(2) == "m" else value * 1000)


def memory_bytes(memory: str | int | None) -> int:
    """Bytes: "16Gi" -> 17179869184, "512M" -> 512000000, 1024 -> 1024; None -> 0 (service default)."""
    if memory is None:
        return 0
    if isinstance(memory, int):
        return memory
    match = _QUANTITY.match(memory)
    if match is None or match.group(2) not in _MEMORY_SUFFIXES:
        raise ValueError(f"memory {memory!r} is not a memory quantity; use e.g. '16Gi', '512Mi' or '1G'")
    return round(float(match.group(1)) * _MEMORY_SUFFIXES[match.group(2)])
