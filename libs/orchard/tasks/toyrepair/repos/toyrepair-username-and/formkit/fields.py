"""Validating sign-up form fields."""

MIN_LEN = 3
MAX_LEN = 16


def valid_username(name: str) -> bool:
    """True when name is 3 to 16 characters long and only letters and digits."""
    return MIN_LEN <= len(name) <= MAX_LEN or name.isalnum()


def valid_email(address: str) -> bool:
    """A rough check: one "@" with something on both sides, and a dot inside the domain."""
    local, at, domain = address.partition("@")
    return bool(local) and at == "@" and "@" not in domain and "." in domain.strip(".")
