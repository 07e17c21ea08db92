import csv

EXPECTED = [
    ["id", "name", "department", "salary"],
    ["3", "Cleo Nakamura", "Engineering", "123500"],
    ["7", "Gia Russo", "Engineering", "105000"],
    ["1", "Ada Park", "Engineering", "98000"],
    ["5", "Eve Adams", "Engineering", "87000"],
]


def test_engineers_sorted_by_salary_descending():
    with open("engineers.csv", newline="") as f:
        assert [row for row in csv.reader(f) if row] == EXPECTED
