import pytest

from slugkit.words import count_noun, join_words, ordinal, pluralize, top_words


@pytest.mark.parametrize("word, plural", [
    ("cat", "cats"), ("bus", "buses"), ("box", "boxes"), ("church", "churches"), ("dish", "dishes"),
    ("city", "cities"), ("day", "days"), ("knife", "knives"), ("leaf", "leaves"), ("child", "children"),
    ("person", "people"), ("sheep", "sheep"), ("series", "series"),
])
def test_pluralize_rules(word, plural):
    assert pluralize(word) == plural


def test_pluralize_keeps_case():
    assert pluralize("Child") == "Children"
    assert pluralize("CITY") == "CITIES"
    assert pluralize("Knife") == "Knives"


def test_pluralize_with_count():
    assert pluralize("file", 1) == "file"
    assert pluralize("file", 0) == "files"
    assert pluralize("") == ""


def test_count_noun():
    assert count_noun(1, "mouse") == "1 mouse"
    assert count_noun(3, "mouse") == "3 mice"
    assert count_noun(0, "entry") == "0 entries"


@pytest.mark.parametrize("n, text", [
    (1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
    (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th"), (0, "0th"), (-2, "-2nd"),
])
def test_ordinal(n, text):
    assert ordinal(n) == text


def test_join_words():
    assert join_words([]) == ""
    assert join_words(["tea"]) == "tea"
    assert join_words(["tea", "coffee"]) == "tea and coffee"
    assert join_words(["tea", "coffee", "milk"]) == "tea, coffee, and milk"
    assert join_words(["tea", "coffee", "milk"], "or", serial_comma=False) == "tea, coffee or milk"


def test_top_words_ranks_by_count_then_alphabetically():
    text = "the cat and the dog and the bird"
    assert top_words(text, 2) == [("the", 3), ("and", 2)]
    assert top_words(text, 3, ignore=frozenset({"the", "and"})) == [("bird", 1), ("cat", 1), ("dog", 1)]
    assert top_words("", 5) == []
