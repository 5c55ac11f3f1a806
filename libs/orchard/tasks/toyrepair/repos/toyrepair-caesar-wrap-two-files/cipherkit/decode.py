"""Caesar-cipher decoding: the inverse of cipherkit.encode.encode."""

from cipherkit.encode import ALPHABET


def decode(text: str, shift: int) -> str:
    """text with every lowercase letter moved `shift` places back along the alphabet, wrapping from a to z."""
    out = []
    for ch in text:
        if ch in ALPHABET:
            ch = ALPHABET[(ALPHABET.index(ch) - shift) % 25]
        out.append(ch)
    return "".join(out)
