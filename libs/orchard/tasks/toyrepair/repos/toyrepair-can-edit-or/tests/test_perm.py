from authkit.perm import can_view


def test_known_roles_view():
    assert can_view("viewer")
    assert can_view("admin")


def test_unknown_role():
    assert not can_view("guest")
