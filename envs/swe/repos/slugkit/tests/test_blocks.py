from slugkit.blocks import align_columns, dedent, indent, number_lines, strip_margin


def test_dedent_removes_the_shared_indentation():
    assert dedent("    a\n      b\n    c") == "a\n  b\nc"


def test_dedent_ignores_blank_lines():
    assert dedent("  a\n\n \n    b\n") == "a\n\n\n  b\n"


def test_dedent_mixed_tabs_and_spaces_share_only_the_common_part():
    assert dedent("\t a\n\t\tb") == " a\n\tb"
    assert dedent("no indent\n  here") == "no indent\n  here"


def test_indent_skips_blank_lines_by_default():
    assert indent("a\n\nb", "> ") == "> a\n\n> b"
    assert indent("a\n\nb", "> ", blank_lines=True) == "> a\n> \n> b"


def test_indent_then_dedent_round_trips():
    text = "def f():\n    return 1"
    assert dedent(indent(text, "        ")) == text


def test_strip_margin():
    text = """first
        |  second
        |third
    untouched"""
    assert strip_margin(text) == "first\n  second\nthird\n    untouched"
    assert strip_margin("  #> x", marker="#>") == " x"


def test_align_columns():
    rows = [["name", "qty"], ["apple", "3"], ["kiwi", "12"]]
    assert align_columns(rows) == ["name   qty", "apple  3", "kiwi   12"]
    assert align_columns(rows, separator=" | ", right=[1]) == ["name  | qty", "apple |   3", "kiwi  |  12"]


def test_align_columns_pads_short_rows():
    assert align_columns([["a", "b", "c"], ["long"]]) == ["a     b  c", "long"]
    assert align_columns([]) == []


def test_number_lines():
    assert number_lines("a\nb") == "1 | a\n2 | b"
    assert number_lines("x\n" * 9 + "y", start=1).splitlines()[-1] == "10 | y"
    assert number_lines("x", start=7, separator=": ") == "7: x"
