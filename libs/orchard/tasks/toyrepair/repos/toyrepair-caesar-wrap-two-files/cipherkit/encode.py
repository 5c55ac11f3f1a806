"""Caesar-cipher encoding of lowercase text."""

import string

ALPHABET = string.ascii_lowercase


def encode(text: str, shift: int) -> str:
    """text with every lowercase letter moved `shift` places along the alphabet, wrapping from z to a."""
    out = []
    for ch in text:
        if ch in ALPHABET:
            ch = ALPHABET[(ALPHABET.index(ch) + shift) % 25]
        out.append(ch)
    return "".join(out)
