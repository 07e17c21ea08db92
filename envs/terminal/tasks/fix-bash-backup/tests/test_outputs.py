import os
import shutil
import subprocess
import tempfile

SOURCE = {"a.txt": "alpha\n", "b c.txt": "bravo charlie\n", "notes.md": "not text\n", "atxt": "no dot\n",
          "sub/deep.txt": "too deep\n", "dir.txt/inner.txt": "a directory named .txt\n"}


def run_backup(files, dest_rel):
    """Run backup.sh on a fresh source tree; return (stdout, {name: contents} found in dest)."""
    scratch = tempfile.mkdtemp(prefix=".backup-test-", dir=".")
    try:
        src = os.path.join(scratch, "my docs")
        os.makedirs(src)
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        dest = os.path.join(scratch, dest_rel)
        out = subprocess.run(["bash", "backup.sh", src, dest], capture_output=True, text=True, timeout=10)
        copied = {}
        if os.path.isdir(dest):
            for name in os.listdir(dest):
                with open(os.path.join(dest, name)) as f:
                    copied[name] = f.read()
        return out.stdout, copied
    finally:
        shutil.rmtree(scratch)


def test_copies_txt_files_with_spaces_into_new_nested_dest():
    stdout, copied = run_backup(SOURCE, "out dir/nested")
    assert copied == {"a.txt": "alpha\n", "b c.txt": "bravo charlie\n"}
    assert stdout == "copied 2 files\n"


def test_no_txt_files():
    stdout, copied = run_backup({"readme.md": "x\n"}, "backup")
    assert stdout == "copied 0 files\n" and copied == {}


def test_single_file():
    stdout, copied = run_backup({"only one.txt": "1\n"}, "backup")
    assert stdout == "copied 1 files\n" and copied == {"only one.txt": "1\n"}
