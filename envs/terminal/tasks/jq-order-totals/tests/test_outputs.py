import json

EXPECTED = {"acme": 49.5, "globex": 0, "initech": 61.75}


def test_totals_per_paying_customer():
    with open("totals.json") as f:
        totals = json.load(f)
    assert isinstance(totals, dict)
    assert sorted(totals) == sorted(EXPECTED)
    for customer, total in EXPECTED.items():
        assert isinstance(totals[customer], (int, float)), totals[customer]
        assert abs(totals[customer] - total) < 1e-6, (customer, totals[customer])
