import subprocess


def git(*args):
    """Run a read-only git command in repo/ and return its stdout (no hooks, no fsmonitor)."""
    cmd = ["git", "-C", "repo", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()


def test_restore_commit_on_top():
    assert subjects("main") == ["Restore notes.md", "Update main", "Clean up old files", "Update notes",
                                "Start project"]


def test_notes_restored_with_latest_contents():
    assert git("show", "main:notes.md") == "# Notes\n- decided: use sqlite\n- todo: backups\n"


def test_nothing_else_restored():
    assert sorted(git("ls-tree", "--name-only", "main").split()) == ["main.txt", "notes.md"]
