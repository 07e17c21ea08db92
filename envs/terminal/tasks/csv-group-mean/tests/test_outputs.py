import csv
import re

EXPECTED = [("East", 80.97), ("North", 67.87), ("South", 73.80), ("West", 48.80)]


def rows():
    with open("region_means.csv", newline="") as f:
        return list(csv.reader(f))


def test_header():
    assert rows()[0] == ["region", "mean_amount"]


def test_one_row_per_region_sorted_with_means():
    body = rows()[1:]
    assert [r[0] for r in body] == [region for region, _ in EXPECTED]
    for (region, mean), row in zip(EXPECTED, body):
        assert len(row) == 2, row
        assert re.fullmatch(r"-?\d+\.\d\d", row[1]), row
        assert abs(float(row[1]) - mean) < 0.001, (region, row[1], mean)
