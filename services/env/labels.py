"""Limits on the labels of sandboxes and snapshots: labels are selectors and log fields, not storage."""

from __future__ import annotations

import re
from collections.abc import Mapping

from orchard.errors import InvalidArgument

MAX_LABELS = 64
"""Most labels on one sandbox or snapshot."""
MAX_VALUE_CHARS = 256
"""Longest label value."""
KEY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$")
"""A label key: 1-63 letters, digits, '.', '_', '/' or '-', starting and ending with a letter or digit."""


def check_labels(labels: Mapping[str, str], field: str = "labels") -> None:
    """InvalidArgument naming `field` unless the labels keep to the limits above, and every value is printable
    text (no control, format or bidi characters, which would let a label rewrite a log line or a listing)."""
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(f"{len(labels)} labels; at most {MAX_LABELS} are allowed", field=field)
    for key, value in labels.items():
        if not KEY.match(key):
            raise InvalidArgument(
                f"label key {key[:80]!r} is not 1-63 letters, digits, '.', '_', '/' or '-' "
                "starting and ending with a letter or digit",
                field=field,
            )
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidArgument(
                f"label {key!r} has a value of {len(value)} characters; at most {MAX_VALUE_CHARS} are allowed",
                field=field,
            )
        if not value.isprintable():
            raise InvalidArgument(
                f"label {key!r} has a value with control, format or bidi characters "
                f"({value[:80]!r}); use printable text",
                field=field,
            )
