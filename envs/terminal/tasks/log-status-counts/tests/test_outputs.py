EXPECTED = ["200 87", "301 6", "304 6", "403 4", "404 8", "500 3", "502 5", "503 1"]


def test_counts_per_status_sorted():
    with open("status_counts.txt") as f:
        lines = [" ".join(line.split()) for line in f if line.strip()]
    assert lines == EXPECTED
