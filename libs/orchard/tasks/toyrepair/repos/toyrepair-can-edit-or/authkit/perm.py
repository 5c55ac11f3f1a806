"""Who may do what to a document."""

ROLES = ("viewer", "editor", "admin")


def can_view(role: str) -> bool:
    """Every known role may view."""
    return role in ROLES


def can_edit(role: str, is_owner: bool) -> bool:
    """Admins may edit any document; anyone else only the documents they own."""
    return role == "admin" and is_owner
