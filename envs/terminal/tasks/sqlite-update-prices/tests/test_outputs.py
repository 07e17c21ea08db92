import sqlite3

EXPECTED = [  # (id, name, category, price, qty)
    (1, "hammer", "tools", 14.29, 5),
    (3, "screwdriver", "tools", 4.84, 12),
    (5, "tape", "supplies", 2.0, 40),
    (6, "saw", "tools", 23.1, 2),
    (7, "tool belt", "apparel", 15.0, 3),
]


def rows():
    db = sqlite3.connect("file:inventory.db?mode=ro", uri=True)
    try:
        return db.execute("SELECT id, name, category, price, qty FROM items ORDER BY id").fetchall()
    finally:
        db.close()


def test_out_of_stock_items_deleted():
    assert [r[0] for r in rows()] == [e[0] for e in EXPECTED]


def test_prices():
    for got, want in zip(rows(), EXPECTED):
        assert got[1:3] == want[1:3] and got[4] == want[4], got
        assert abs(got[3] - want[3]) < 0.001, (got, want)
