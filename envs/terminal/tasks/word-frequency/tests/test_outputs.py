EXPECTED = ["14 the", "6 river", "5 mill", "5 rain", "4 town"]


def lines():
    with open("top_words.txt") as f:
        return [" ".join(line.split()) for line in f.read().splitlines() if line.strip()]


def test_top_five_words_with_counts():
    assert lines() == EXPECTED


def test_tie_broken_alphabetically():
    assert lines()[2:4] == ["5 mill", "5 rain"]
