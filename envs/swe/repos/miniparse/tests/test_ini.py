import pytest

from miniparse import IniError, parse_ini
from miniparse.ini import get_bool, get_list


def test_sections_and_keys():
    text = "[server]\nHost = example.org\nport: 8080\n"
    assert parse_ini(text) == {"server": {"host": "example.org", "port": "8080"}}


def test_keys_before_a_header_go_to_default():
    assert parse_ini("name = x\n") == {"DEFAULT": {"name": "x"}}


def test_hash_comments_and_blank_lines():
    assert parse_ini("# c\n\n[a]\nk=v\n") == {"a": {"k": "v"}}


def test_bad_line():
    with pytest.raises(IniError, match="line 2"):
        parse_ini("[a]\nnonsense\n")


def test_get_bool():
    assert get_bool({"x": "Yes"}, "x") is True
    assert get_bool({}, "x", default=True) is True
    with pytest.raises(IniError):
        get_bool({"x": "maybe"}, "x")


def test_get_list():
    assert get_list({"k": "a, b,,c "}, "k") == ["a", "b", "c"]
