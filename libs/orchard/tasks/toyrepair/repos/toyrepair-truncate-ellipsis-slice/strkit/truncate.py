"""Shortening text for display."""

ELLIPSIS = "..."


def truncate(text: str, width: int) -> str:
    """text cut to at most `width` characters, ending in "..." when it was cut."""
    if width < len(ELLIPSIS):
        raise ValueError("width too small for the ellipsis")
    if len(text) <= width:
        return text
    return text[:width - len(ELLIPSIS) - 1] + ELLIPSIS
