"""SWE-bench instance rows: loading, checking, and the repository each episode starts from.

A task file is JSONL, one SWE-bench instance per line: `instance_id`, `repo`, `base_commit`,
`problem_statement`, `patch` (the gold fix), `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS` (lists of
pytest ids, or JSON-encoded lists as in SWE-bench's own files). Other SWE-bench fields (`version`,
`created_at`, `hints_text`...) are kept in `extra` and otherwise ignored. Where the repository comes from:

- `repo_dir`: a directory (relative paths are relative to the task file). A git repository is cloned
  and checked out at `base_commit` (its other refs, tags and remotes are dropped, so the fix is not in
  reach). A directory of plain files (the bundled `repos/<name>/`) becomes a one-commit repository
  whose author, committer and dates are fixed (`GIT_ENV`), after applying the row's `bug_patch` (our
  extension: how the bug is injected, SWE-smith style), so `base_commit` is the same on every machine;
  the loader's `prepared_repo` checks that it is.
- `image_name`: a docker image holding the repository (SWE-bench's images, on clusters). Such rows
  load and are checked here, but no episode runs them here: the sandbox's docker backend is not
  usable on this machine.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BUNDLED_TASKS = Path(__file__).with_name("tasks.jsonl")
REQUIRED_TEXT = ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".git")
GIT_TIMEOUT_S = 120
# A fixed identity, date and configuration: the base commit of a plain directory is reproducible.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "clawr1", "GIT_AUTHOR_EMAIL": "swe@clawr1.invalid",
    "GIT_AUTHOR_DATE": "2025-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "clawr1", "GIT_COMMITTER_EMAIL": "swe@clawr1.invalid",
    "GIT_COMMITTER_DATE": "2025-01-01T00:00:00+0000",
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
    "LANG": "C.UTF-8", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
}
BASE_MESSAGE = "base"


class TaskFormatError(ValueError):
    """A task row that cannot be used; the message names the instance and the field."""


@dataclass(frozen=True)
class SweTask:
    instance_id: str
    repo: str  # "owner/name": the task's category
    base_commit: str
    problem_statement: str
    patch: str  # the gold fix
    test_patch: str  # the tests that check it, applied only when grading
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    repo_dir: Path | None = None
    image_name: str | None = None
    bug_patch: str = ""  # applied to a plain repo_dir before the base commit is made
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def id(self) -> str:
        return self.instance_id

    @property
    def category(self) -> str:
        return self.repo


def _test_list(row: dict[str, Any], key: str, name: str) -> tuple[str, ...]:
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{name}: field '{key}' is a string but not a JSON list: {e}") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise TaskFormatError(f"{name}: field '{key}' must be a list of test ids, got {value!r}")
    return tuple(value)


def parse_row(row: Any, where: str = "", base: Path | None = None) -> SweTask:
    """One SWE-bench instance row as a task; TaskFormatError naming the instance and the field."""
    if not isinstance(row, dict):
        raise TaskFormatError(f"{where}: a task row must be a JSON object, got {type(row).__name__}")
    name = f"instance {row.get('instance_id', '?')!r}"
    name = f"{where}: {name}" if where else name
    for key in (*REQUIRED_TEXT, *TEST_LISTS):
        if key not in row or row[key] is None:
            raise TaskFormatError(f"{name}: missing field '{key}'")
    for key in REQUIRED_TEXT:
        if not isinstance(row[key], str) or not row[key].strip():
            raise TaskFormatError(f"{name}: field '{key}' must be a non-empty string")
    fail_to_pass, pass_to_pass = (_test_list(row, key, name) for key in TEST_LISTS)
    if not fail_to_pass:
        raise TaskFormatError(f"{name}: field 'FAIL_TO_PASS' is empty: a task needs at least one test "
                              f"that fails before the fix and passes after it")
    repo_dir, image = row.get("repo_dir"), row.get("image_name")
    if bool(repo_dir) == bool(image):
        raise TaskFormatError(f"{name}: give exactly one of the fields 'repo_dir' (a repository directory) "
                              f"and 'image_name' (a docker image)")
    path = None
    if repo_dir:
        path = Path(repo_dir) if base is None or Path(repo_dir).is_absolute() else base / repo_dir
        if not path.is_dir():
            raise TaskFormatError(f"{name}: field 'repo_dir': no such directory {str(path)!r}")
    known = {*REQUIRED_TEXT, *TEST_LISTS, "repo_dir", "image_name", "bug_patch"}
    return SweTask(
        instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"].strip(),
        problem_statement=row["problem_statement"], patch=row["patch"], test_patch=row["test_patch"],
        fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, repo_dir=path, image_name=image or None,
        bug_patch=row.get("bug_patch") or "", extra={k: v for k, v in row.items() if k not in known})


def load_tasks(path: str | Path = BUNDLED_TASKS) -> list[SweTask]:
    """Every row of a JSONL task file (blank lines skipped), in file order; ids must be unique."""
    file = Path(path)
    if not file.is_file():
        raise TaskFormatError(f"{file}: no such task file")
    tasks = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"{file}:{number}: not valid JSON: {e}") from None
        tasks.append(parse_row(row, f"{file}:{number}", base=file.parent))
    ids = [t.instance_id for t in tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise TaskFormatError(f"{file}: instance ids occur more than once: {', '.join(duplicates)}")
    if not tasks:
        raise TaskFormatError(f"{file}: no task rows")
    return tasks


# ---------------------------------------------------------------- the base repository

def git(args: list[str], cwd: Path, stdin: str | None = None) -> str:
    """Run host git on a repository we made from trusted files (never on an agent's workspace)."""
    done = subprocess.run(["git", *args], cwd=cwd, input=stdin, env=GIT_ENV, capture_output=True, text=True,
                          timeout=GIT_TIMEOUT_S)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["git", *args], done.stdout, done.stderr)
    return done.stdout


def commit_tree(repo: Path) -> str:
    """Make `repo` (plain files) a git repository with one commit of everything; that commit's id."""
    git(["init", "-q", "-b", "main"], repo)
    for key, value in (("core.autocrlf", "false"), ("core.filemode", "true"), ("commit.gpgsign", "false")):
        git(["config", key, value], repo)
    git(["add", "-A"], repo)
    git(["commit", "-q", "--no-verify", "-m", BASE_MESSAGE], repo)
    return git(["rev-parse", "HEAD"], repo).strip()


def build_base(repo_dir: Path, bug_patch: str, dest: Path) -> str:
    """The base repository at `dest` (must not exist): repo_dir's files, the bug applied, one commit."""
    shutil.copytree(repo_dir, dest, ignore=COPY_IGNORE)
    if bug_patch:
        git(["apply", "--whitespace=nowarn", "-"], dest, stdin=bug_patch)
    return commit_tree(dest)


def clone_at(repo_dir: Path, commit: str, dest: Path) -> str:
    """A clone of the git repository `repo_dir` at `commit`, with nothing beyond it reachable."""
    git(["clone", "-q", "--no-hardlinks", "--no-checkout", str(repo_dir.resolve()), str(dest)], repo_dir)
    git(["checkout", "-q", "-B", "main", commit], dest)
    git(["remote", "remove", "origin"], dest)
    for ref in git(["for-each-ref", "--format=%(refname)"], dest).split():
        if ref != "refs/heads/main":
            git(["update-ref", "-d", ref], dest)
    git(["reflog", "expire", "--expire=now", "--all"], dest)
    git(["gc", "-q", "--prune=now"], dest)
    return git(["rev-parse", "HEAD"], dest).strip()


_holder: Path | None = None


def _cache_root() -> Path:
    global _holder
    if _holder is None:
        _holder = Path(tempfile.mkdtemp(prefix="clawr1-swe-repos-"))
        atexit.register(shutil.rmtree, _holder, True)
    return _holder


@functools.lru_cache(maxsize=None)
def _prepared(repo_dir: Path, bug_patch: str, base_commit: str, instance_id: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="base-", dir=_cache_root())) / "repo"
    try:
        is_git = (repo_dir / ".git").exists()
        head = clone_at(repo_dir, base_commit, dest) if is_git else build_base(repo_dir, bug_patch, dest)
    except subprocess.CalledProcessError as e:
        raise TaskFormatError(f"instance {instance_id!r}: cannot make the base repository from 'repo_dir' "
                              f"{str(repo_dir)!r}: {' '.join(e.cmd)}: {(e.stderr or '').strip()[-300:]}") from None
    if head != base_commit:
        raise TaskFormatError(f"instance {instance_id!r}: field 'base_commit' is {base_commit}, but the repository "
                              f"built from 'repo_dir' (and 'bug_patch') is at {head}")
    return dest


def prepared_repo(task: SweTask) -> Path:
    """A host directory holding the task's repository at its base commit, made once per process.

    Read-only by convention: sandboxes copy it, nobody changes it.
    """
    if task.repo_dir is None:
        raise TaskFormatError(f"instance {task.instance_id!r}: a row with 'image_name' runs only in its docker "
                              f"image (the sandbox's docker backend, on clusters), not in a local sandbox")
    return _prepared(task.repo_dir.resolve(), task.bug_patch, task.base_commit, task.instance_id)


def patch_files(patch: str) -> list[str]:
    """The paths a unified git diff touches (both sides of a rename), in order, each once."""
    paths = []
    for line in patch.splitlines():
        if line.startswith(("--- a/", "+++ b/")):
            paths.append(line[6:].rstrip("\t"))
    return list(dict.fromkeys(paths))
