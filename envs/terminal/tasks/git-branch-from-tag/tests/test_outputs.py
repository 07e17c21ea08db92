import subprocess


def git(*args):
    """Run a read-only git command in repo/ and return its stdout (no hooks, no fsmonitor)."""
    cmd = ["git", "-C", "repo", "-c", "core.fsmonitor=false", "-c", "safe.directory=*", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def subjects(rev="HEAD"):
    return git("log", "--format=%s", rev).splitlines()


def test_branch_is_one_commit_on_top_of_the_tag():
    tagged = git("rev-parse", "v1.0^{commit}").strip()
    assert git("rev-parse", "refs/heads/hotfix/1.0.1~1").strip() == tagged
    assert subjects("refs/heads/hotfix/1.0.1") == ["Bump to 1.0.1", "Polish response", "Initial version"]


def test_version_bumped_on_the_branch():
    assert git("show", "refs/heads/hotfix/1.0.1:VERSION") == "1.0.1\n"
    assert git("show", "refs/heads/hotfix/1.0.1:app.py") == 'def serve():\n    return "v1.0"\n'


def test_main_and_tag_unchanged():
    assert subjects("main") == ["Add metrics", "Start 1.1 development", "Polish response", "Initial version"]
    assert subjects("v1.0") == ["Polish response", "Initial version"]
    assert git("cat-file", "-t", "v1.0").strip() == "tag"
