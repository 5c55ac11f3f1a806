from bitkit.size import human, to_kib


def test_small_sizes_in_bytes():
    assert human(512) == "512 B"
    assert human(0) == "0 B"


def test_zero_kib():
    assert to_kib(0) == 0
