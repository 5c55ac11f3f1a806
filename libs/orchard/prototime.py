"""Conversions between seconds (float) and protobuf's Timestamp and Duration, in one place, and the check of a
Duration a client sent."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from orchard.errors import InvalidArgument

_NANOS = 1_000_000_000


def timestamp(seconds: float | None) -> Timestamp | None:
    """A Timestamp of epoch `seconds` (None stays None: an unset field)."""
    if seconds is None:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def duration(seconds: float) -> Duration:
    """A Duration of `seconds`."""
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def seconds_of(d: Duration | Timestamp) -> float:
    """The Duration's length, or the Timestamp's epoch time, in seconds."""
    return float(d.ToNanoseconds() / 1e9)


def span_of(d: Duration, field: str) -> float:
    """The length in seconds of a Duration a client sent for a wait or a timeout; InvalidArgument naming
    `field` when it is negative or not a valid Duration (nanos outside ±999,999,999 or of the other sign)."""
    if d.seconds < 0 or d.nanos < 0:
        raise InvalidArgument(f"{field} must not be negative (got {d.seconds}s {d.nanos}ns)", field=field)
    if d.nanos >= _NANOS:
        raise InvalidArgument(
            f"{field} is not a valid Duration: nanos must be below 1,000,000,000 (got {d.nanos})", field=field
        )
    return d.seconds + d.nanos / _NANOS
