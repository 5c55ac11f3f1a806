from formkit.fields import valid_email


def test_valid_email():
    assert valid_email("ann@example.org")


def test_invalid_emails():
    assert not valid_email("ann.example.org")
    assert not valid_email("@example.org")
    assert not valid_email("ann@localhost")
