from retry.config import BACKOFF_S, attempts


def test_backoff():
    assert BACKOFF_S == 0.5


def test_attempts_start_at_one():
    assert attempts()[0] == 1
