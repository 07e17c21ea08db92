import pytest

from miniparse import IniError, dump_ini, merge_ini, parse_ini, with_defaults
from miniparse.ini import get_bool, get_float, get_int, get_list


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


def test_get_int_and_get_float():
    section = {"port": "8080", "ratio": "0.25", "name": "x"}
    assert get_int(section, "port") == 8080
    assert get_float(section, "ratio") == 0.25
    assert get_float(section, "port") == 8080.0
    assert get_int(section, "missing", default=3) == 3
    assert get_float(section, "missing", default=None) is None


def test_typed_getters_refuse_bad_or_missing_values():
    with pytest.raises(IniError, match="is not an integer"):
        get_int({"port": "eighty"}, "port")
    with pytest.raises(IniError, match="is not a number"):
        get_float({"ratio": "1/4"}, "ratio")
    with pytest.raises(IniError, match="missing key 'port'"):
        get_int({}, "port")


def test_with_defaults():
    sections = parse_ini("timeout = 5\nretries = 2\n[a]\ntimeout = 9\n[b]\n")
    assert with_defaults(sections) == {"a": {"timeout": "9", "retries": "2"}, "b": {"timeout": "5", "retries": "2"}}
    assert with_defaults({}) == {}


def test_merge_ini():
    base = {"a": {"x": "1", "y": "2"}, "b": {"z": "3"}}
    merged = merge_ini(base, {"a": {"y": "20"}, "c": {"w": "4"}})
    assert merged == {"a": {"x": "1", "y": "20"}, "b": {"z": "3"}, "c": {"w": "4"}}
    assert base["a"]["y"] == "2"


def test_dump_ini():
    text = dump_ini({"server": {"host": "example.org", "port": "8080"}, "DEFAULT": {"debug": "no"}})
    assert text == "[DEFAULT]\ndebug = no\n\n[server]\nhost = example.org\nport = 8080\n"
    assert dump_ini({}) == ""


def test_dump_ini_round_trips_through_parse_ini():
    sections = {"DEFAULT": {"a": "1"}, "paths": {"home": "/home/ann", "url": "http://x.org/?q=1", "empty": ""},
                "empty section": {}}
    assert parse_ini(dump_ini(sections)) == sections


@pytest.mark.parametrize("sections", [
    {"": {}}, {" padded": {}}, {"a": {"": "v"}}, {"a": {"k=v": "x"}}, {"a": {"k:v": "x"}}, {"a": {"#k": "x"}},
    {"a": {"k": "two\nlines"}}, {"a": {"k": " padded"}}, {"two\nlines": {}},
])
def test_dump_ini_refuses_what_would_not_read_back(sections):
    with pytest.raises(IniError):
        dump_ini(sections)
