EXPECTED = ["alice@example.com", "bob@example.org", "carol@example.net", "dave@example.com", "erin@example.com"]


def test_unique_lowercase_sorted_addresses():
    with open("unique_emails.txt") as f:
        text = f.read()
    assert text.splitlines() == EXPECTED
