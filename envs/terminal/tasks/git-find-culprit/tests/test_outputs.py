import subprocess


def git(*args):
    """Run a read-only git command in repo/ and return its stdout (no hooks, no fsmonitor)."""
    cmd = ["git", "-C", "repo", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()


def test_history_unchanged():
    assert subjects() == ["Enable keepalive", "Refactor client", "Tune network settings", "Add client",
                          "Document retries", "Add network settings"]


def test_culprit_is_the_commit_that_added_the_line():
    with open("culprit.txt") as f:
        answer = f.read().strip()
    expected = git("log", "--format=%H", "--grep=^Tune network settings$").strip()
    assert len(expected) == 40
    assert answer == expected
