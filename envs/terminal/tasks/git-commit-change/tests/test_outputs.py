import subprocess


def git(*args):
    """Run a read-only git command in repo/ and return its stdout (no hooks, no fsmonitor)."""
    cmd = ["git", "-C", "repo", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()


def test_new_commit_on_top_of_history():
    assert subjects("main") == ["Release 1.5.0", "Add changelog", "Initial import"]
    assert git("symbolic-ref", "HEAD").strip() == "refs/heads/main"


def test_commit_message_exact():
    assert git("log", "-1", "--format=%B", "main").strip() == "Release 1.5.0"


def test_committed_contents():
    assert git("show", "main:VERSION") == "1.5.0\n"
    assert git("show", "main:CHANGELOG.md") == (
        "# Changelog\n\n- 1.4.1: fix crash on empty input\n- 1.5.0: faster startup\n")
