import csv

EXPECTED = [
    ["id", "name", "email", "city"],
    ["1", "Grace O'Neil", "grace@example.ie", "Cork"],
    ["3", "Tomás Ruiz", "tomas@example.es", "Sevilla"],
    ["7", "Mara Lind", "mara@example.com", "Oslo"],
    ["10", "Sam Carter, Jr.", "sam@example.com", "Austin"],
]


def test_active_users_sorted_by_id():
    with open("active_users.csv", newline="", encoding="utf-8") as f:
        assert [row for row in csv.reader(f) if row] == EXPECTED
