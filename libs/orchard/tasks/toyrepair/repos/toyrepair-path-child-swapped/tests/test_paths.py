from pathkit.paths import _join, basename


def test_join_one_slash():
    assert _join("a/", "/b") == "a/b"


def test_basename():
    assert basename("/srv/app/main.py") == "main.py"
    assert basename("/srv/") == ""
