import os
import tarfile

EXPECTED = {
    "project/src/app.py": b'print("hello")\n',
    "project/README.md": b"# Project\n",
    "project/logs/keep.txt": b"keep me\n",
}


def archived_files():
    with tarfile.open("backup.tar.gz", "r:gz") as tar:
        return {m.name[2:] if m.name.startswith("./") else m.name: tar.extractfile(m).read()
                for m in tar.getmembers() if m.isfile()}


def test_archive_holds_exactly_the_wanted_files():
    assert archived_files() == EXPECTED


def test_project_left_in_place():
    assert os.path.isfile("project/debug.log") and os.path.isfile("project/tmp/notes.txt")
