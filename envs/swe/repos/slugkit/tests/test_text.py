import pytest

from slugkit import camel_to_snake, count_words, slugify, snake_to_camel, title_case, truncate, wrap


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_accents_and_separator():
    assert slugify("Crème Brûlée", separator="_") == "creme_brulee"


def test_slugify_empty():
    assert slugify("!!!") == ""


def test_truncate_short_text_unchanged():
    assert truncate("short", 10) == "short"


def test_truncate_negative_width():
    with pytest.raises(ValueError):
        truncate("abc", -1)


def test_camel_to_snake_simple():
    assert camel_to_snake("fooBar") == "foo_bar"


def test_snake_to_camel():
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"
    assert snake_to_camel("a_b", upper_first=True) == "AB"
    assert snake_to_camel("__") == ""


def test_title_case_small_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"


def test_count_words():
    assert count_words("It's a test, a TEST.") == {"it's": 1, "a": 2, "test": 2}


def test_wrap_basic():
    assert wrap("one two three four", 9) == ["one two", "three", "four"]


def test_wrap_long_word():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]
