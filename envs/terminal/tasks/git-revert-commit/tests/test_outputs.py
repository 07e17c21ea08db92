import subprocess


def git(*args):
    """Run a read-only git command in repo/ and return its stdout (no hooks, no fsmonitor)."""
    cmd = ["git", "-C", "repo", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()


ORIGINAL = ["Document how to run", "Add healthcheck endpoint", "Enable debug logging", "Initial config"]


def test_one_new_commit_on_unchanged_history():
    assert subjects("main")[1:] == ORIGINAL


def test_debug_change_undone():
    assert git("show", "main:config.ini") == "[app]\ndebug = false\nlog_level = INFO\n"


def test_other_changes_kept():
    assert git("show", "main:app.py") == 'ROUTES = ["/", "/health"]\n'
    assert git("show", "main:README.md") == "Run with: python app.py\n"
