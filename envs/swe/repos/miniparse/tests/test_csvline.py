import pytest

from miniparse import parse_csv, split_line


def test_plain_fields():
    assert split_line("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert split_line(",x,") == ["", "x", ""]


def test_unterminated_quote():
    with pytest.raises(ValueError):
        split_line('"abc')


def test_parse_csv_rows():
    assert parse_csv("name,age\nann,31\n\nbob,40\n") == [{"name": "ann", "age": "31"}, {"name": "bob", "age": "40"}]


def test_parse_csv_too_many_fields():
    with pytest.raises(ValueError):
        parse_csv("a\n1,2\n")
