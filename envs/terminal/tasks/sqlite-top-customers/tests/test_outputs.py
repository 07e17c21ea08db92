import csv

EXPECTED = [["name", "total"], ["Bo Chen", "450.00"], ["Cy Diaz", "350.50"], ["Ed Fox", "340.01"]]


def test_top_three_completed_totals():
    with open("top_customers.csv", newline="") as f:
        assert [row for row in csv.reader(f) if row] == EXPECTED
