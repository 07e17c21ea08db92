import os

EXPECTED = {
    "beach.jpg": "beach\n",
    "trip 2023/sunset.jpg": "sunset\n",
    "trip 2023/map.png": "map\n",
    "old/scan.jpg": "scan\n",
    "old/scan.jpeg.txt": "notes about the scan\n",
    "readme.txt": "Family photos.\n",
}


def files_under(root):
    found = {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            with open(path) as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


def test_no_jpeg_files_left():
    assert not [p for p in files_under("photos") if p.endswith(".jpeg")]


def test_exactly_the_expected_files_with_their_contents():
    assert files_under("photos") == EXPECTED
