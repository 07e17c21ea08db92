def test_line_count_is_the_total_over_py_files():
    with open("line_count.txt") as f:
        assert int(f.read().strip()) == 16
