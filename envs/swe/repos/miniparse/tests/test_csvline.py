import pytest

from miniparse import convert_rows, join_line, parse_csv, quote_field, split_line, write_csv


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


def test_quote_field_only_when_needed():
    assert quote_field("plain") == "plain"
    assert quote_field("a,b") == '"a,b"'
    assert quote_field('say "hi"') == '"say ""hi"""'
    assert quote_field("a;b", delimiter=";") == '"a;b"'
    assert quote_field("a,b", delimiter=";") == "a,b"


def test_quote_field_refuses_line_breaks():
    with pytest.raises(ValueError):
        quote_field("two\nlines")


def test_join_line_round_trips_through_split_line():
    for fields in (["a", "b,c", ""], ["x y", " padded ", "1;2"], ["", ""]):
        assert split_line(join_line(fields)) == fields
    assert split_line(join_line(["a;b", "c"], ";"), ";") == ["a;b", "c"]


def test_join_line_keeps_a_blank_row_visible():
    assert join_line([""]) == '""'
    assert join_line(["  "]) == '"  "'
    assert parse_csv("name\n" + join_line([""]) + "\n") == [{"name": ""}]


def test_write_csv():
    rows = [{"name": "ann", "city": "Paris, France"}, {"name": "bob", "city": "Oslo"}]
    assert write_csv(rows) == 'name,city\nann,"Paris, France"\nbob,Oslo\n'
    assert write_csv([]) == ""
    assert write_csv([], header=["a", "b"]) == "a,b\n"


def test_write_csv_header_from_all_rows_and_missing_keys():
    rows = [{"a": "1"}, {"b": "2", "a": "3"}]
    assert write_csv(rows) == "a,b\n1,\n3,2\n"
    assert write_csv(rows, header=["b", "a"], delimiter=";") == "b;a\n;1\n2;3\n"
    with pytest.raises(ValueError, match="row 2"):
        write_csv(rows, header=["a"])


def test_write_csv_round_trips_through_parse_csv():
    rows = [{"id": "1", "note": "a, b", "empty": ""}, {"id": "2", "note": " spaced ", "empty": ""}]
    assert parse_csv(write_csv(rows)) == rows
    assert parse_csv(write_csv(rows, delimiter="\t"), delimiter="\t") == rows


def test_convert_rows():
    rows = parse_csv("name,age,score\nann,31,9.5\nbob,40,7\n")
    assert convert_rows(rows, {"age": int, "score": float}) == [
        {"name": "ann", "age": 31, "score": 9.5}, {"name": "bob", "age": 40, "score": 7.0}]
    assert rows[0]["age"] == "31"


def test_convert_rows_names_the_failing_cell():
    rows = [{"age": "31"}, {"age": "old"}]
    with pytest.raises(ValueError, match="row 2, column 'age'"):
        convert_rows(rows, {"age": int})
    with pytest.raises(ValueError, match="row 1, column 'height'"):
        convert_rows(rows, {"height": int})
