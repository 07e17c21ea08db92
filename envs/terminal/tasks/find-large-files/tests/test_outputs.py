EXPECTED = ["data/a.bin", "data/deep/x/y/huge.dat", "data/logs/big.log", "data/space name.bin"]


def listed():
    with open("large_files.txt") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    return [line[2:] if line.startswith("./") else line for line in lines]


def test_exactly_the_large_files_are_listed():
    assert sorted(listed()) == EXPECTED


def test_listed_in_byte_order():
    assert listed() == sorted(listed())
