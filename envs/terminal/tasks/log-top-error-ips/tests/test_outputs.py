EXPECTED = ["7 10.0.0.17", "3 172.16.4.2", "3 192.168.1.20"]


def test_top_three_error_ips():
    with open("top_error_ips.txt") as f:
        lines = [" ".join(line.split()) for line in f if line.strip()]
    assert lines == EXPECTED
