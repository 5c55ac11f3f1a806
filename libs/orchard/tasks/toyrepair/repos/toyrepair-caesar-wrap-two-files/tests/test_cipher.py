from cipherkit.decode import decode
from cipherkit.encode import encode


def test_encode_small_shift():
    assert encode("abc", 1) == "bcd"


def test_other_characters_unchanged():
    assert encode("hi, 42!", 0) == "hi, 42!"


def test_round_trip():
    assert decode(encode("hello", 5), 5) == "hello"
