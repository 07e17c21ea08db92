import json

EXPECTED = [
    {"sku": "A-100", "name": "Bolt, hex M6", "qty": 250, "price": 0.15},
    {"sku": "A-101", "name": "Washer", "qty": 1200, "price": 0.05},
    {"sku": "B-200", "name": 'Drill bit "HSS" 5mm', "qty": 40, "price": 3.9},
    {"sku": "C-300", "name": "Tape measure", "qty": 0, "price": 12.5},
]


def load():
    with open("inventory.json") as f:
        return json.load(f)


def test_rows_in_order_with_values():
    assert load() == EXPECTED


def test_types():
    for item in load():
        assert isinstance(item["qty"], int) and not isinstance(item["qty"], bool)
        assert isinstance(item["price"], (int, float)) and isinstance(item["sku"], str)
