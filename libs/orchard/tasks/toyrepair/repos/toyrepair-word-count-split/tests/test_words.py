from textkit.words import word_count


def test_two_words():
    assert word_count("hello world") == 2
