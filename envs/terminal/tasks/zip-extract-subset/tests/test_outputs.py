import os

EXPECTED = {
    "docs/guide.md": "# Guide\nStart here.\n",
    "docs/api/reference.md": "# API\nGET /items\n",
    "docs/api/changes.txt": "v2: added /items\n",
}


def test_only_the_docs_entries_were_extracted():
    found = {}
    for d, _, names in os.walk("docs_only"):
        for n in names:
            path = os.path.join(d, n)
            with open(path) as f:
                found[os.path.relpath(path, "docs_only")] = f.read()
    assert found == EXPECTED
