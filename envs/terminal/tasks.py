"""Terminal-Bench-compatible task directories: loading, test installation, test-output parsing.

A task is a directory `<task-id>/` holding `task.yaml` (Terminal-Bench's fields: `instruction`,
`difficulty`, `category`, `tags`, `max_agent_timeout_sec`, `max_test_timeout_sec`; others such as
`author_email` or `parser_name` are accepted and ignored), `solution.sh`, `run-tests.sh`, `tests/`, and
two optional parts: `workspace/` (the files the agent starts with) and `setup.sh` (our extension: run
in the fresh workspace copy before the agent starts, e.g. to build a git repository). See README.md.

The grader never trusts the workspace: `install_tests` replaces whatever the agent left at `./tests`
with the task's own tests (plus the shared runner, `runner.py` here, unless the task ships its own:
`grader_files`), the task's own `run-tests.sh` is run from outside the workspace, and only its
stdout is read (`parse_test_output`).
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DIFFICULTIES = ("easy", "medium", "hard", "unknown")  # Terminal-Bench's TaskDifficulty values
DEFAULT_CATEGORY = "software_engineering"  # Terminal-Bench's default
DEFAULT_AGENT_TIMEOUT_S = 360.0  # Terminal-Bench's defaults for the two timeouts
DEFAULT_TEST_TIMEOUT_S = 60.0
BUNDLED_TASKS = Path(__file__).with_name("tasks")  # the task set this repository ships
SHARED_RUNNER = Path(__file__).with_name("runner.py")  # installed as tests/runner.py unless a task has its own


@dataclass(frozen=True)
class TerminalTask:
    id: str  # the directory name
    path: Path  # the task directory
    instruction: str  # what the agent is told
    category: str
    difficulty: str  # one of DIFFICULTIES
    tags: tuple[str, ...]
    agent_timeout_s: float  # max_agent_timeout_sec
    test_timeout_s: float  # max_test_timeout_sec
    workspace_dir: Path | None  # copied fresh per episode; None: the agent starts in an empty directory
    solution_path: Path  # solution.sh: the reference solution (cwd = the workspace copy)
    run_tests_path: Path  # run-tests.sh (cwd = the workspace copy, tests installed at ./tests)
    tests_dir: Path  # tests/: installed only after the agent has finished
    setup_path: Path | None = None  # setup.sh: run in the workspace copy before the agent starts


@dataclass(frozen=True)
class TestVerdict:
    __test__ = False  # not a pytest test class

    passed: int
    failed: int
    all_passed: bool

    @property
    def fraction(self) -> float:
        """Share of tests that passed (0.0 when none ran)."""
        total = self.passed + self.failed
        return self.passed / total if total else 0.0


def _field(data: dict[str, Any], key: str, file: Path, kind: type | tuple[type, ...], default: Any = None) -> Any:
    value = data.get(key)
    value = default if value is None else value
    if value is None:
        raise ValueError(f"{file}: missing field '{key}'")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{file}: field '{key}' must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    words = {"str": "a string", "list": "a list", "int": "a number", "float": "a number"}
    names = [words.get(k.__name__, k.__name__) for k in (kind if isinstance(kind, tuple) else (kind,))]
    return " or ".join(dict.fromkeys(names))


def _instruction(data: dict[str, Any], file: Path) -> str:
    if "instruction" not in data and isinstance(data.get("descriptions"), list):  # Terminal-Bench's older format
        base = [d for d in data["descriptions"] if isinstance(d, dict) and d.get("key", "base") == "base"]
        data = {"instruction": base[0].get("description") if base else None}
    text = _field(data, "instruction", file, str)
    if not text.strip():
        raise ValueError(f"{file}: field 'instruction' is empty")
    return text.strip() + "\n"


def _timeout(data: dict[str, Any], key: str, file: Path, default: float) -> float:
    value = float(_field(data, key, file, (int, float), default))
    if not value > 0:
        raise ValueError(f"{file}: field '{key}' must be a positive number of seconds, got {value!r}")
    return value


def _required_file(task_dir: Path, name: str, directory: bool = False) -> Path:
    path = task_dir / name
    if not (path.is_dir() if directory else path.is_file()):
        what = "directory" if directory else "file"
        raise ValueError(f"{path}: missing {what} '{name}' (every task needs it)")
    return path


def load_task(path: str | Path) -> TerminalTask:
    """The task in directory `path`; ValueError naming the file and the field when something is missing or bad."""
    task_dir = Path(path)
    file = task_dir / "task.yaml"
    if not file.is_file():
        raise ValueError(f"{file}: missing file 'task.yaml' (not a task directory)")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{file}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: must be a mapping of fields, got {type(data).__name__}")
    difficulty = _field(data, "difficulty", file, str)
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"{file}: field 'difficulty' must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    category = _field(data, "category", file, str, DEFAULT_CATEGORY)
    if not category.strip():
        raise ValueError(f"{file}: field 'category' is empty")
    tags = _field(data, "tags", file, list, [])
    if not all(isinstance(t, str) and t for t in tags):
        raise ValueError(f"{file}: field 'tags' must be a list of non-empty strings, got {tags!r}")
    if (task_dir / "solution.yaml").is_file() and not (task_dir / "solution.sh").is_file():
        raise ValueError(f"{task_dir / 'solution.yaml'}: solution.yaml is not supported; write solution.sh")
    workspace, setup = task_dir / "workspace", task_dir / "setup.sh"
    return TerminalTask(
        id=task_dir.resolve().name, path=task_dir, instruction=_instruction(data, file), category=category,
        difficulty=difficulty, tags=tuple(tags),
        agent_timeout_s=_timeout(data, "max_agent_timeout_sec", file, DEFAULT_AGENT_TIMEOUT_S),
        test_timeout_s=_timeout(data, "max_test_timeout_sec", file, DEFAULT_TEST_TIMEOUT_S),
        workspace_dir=workspace if workspace.is_dir() else None,
        solution_path=_required_file(task_dir, "solution.sh"),
        run_tests_path=_required_file(task_dir, "run-tests.sh"),
        tests_dir=_required_file(task_dir, "tests", directory=True),
        setup_path=setup if setup.is_file() else None,
    )


def load_tasks(dir_or_task: str | Path) -> list[TerminalTask]:
    """One task directory, or every task directory inside `dir_or_task` (names starting with . or _ skipped); sorted by id."""
    root = Path(dir_or_task)
    if (root / "task.yaml").is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise ValueError(f"{root}: no such task directory")
    tasks = [load_task(d) for d in sorted(root.iterdir()) if d.is_dir() and d.name[0] not in "._"]
    if not tasks:
        raise ValueError(f"{root}: no task directories (each needs a task.yaml)")
    return sorted(tasks, key=lambda t: t.id)


def copy_workspace(task: TerminalTask, dest: Path) -> Path:
    """A fresh copy of the task's starting files at `dest` (which must not exist); an empty directory if it has none."""
    if task.workspace_dir is None:
        dest.mkdir(parents=True)
    else:
        shutil.copytree(task.workspace_dir, dest, symlinks=True)
    return dest


def grader_files(task: TerminalTask) -> list[tuple[Path, str]]:
    """What the grader installs, in order, as (host path, path relative to the workspace).

    The task's `tests/` at `tests`, then the shared runner at `tests/runner.py` unless the task's
    `tests/` has a `runner.py` of its own (a task keeps its own runner; pytest-based Terminal-Bench
    tasks never run it, and pytest does not collect a file of that name).
    """
    files = [(task.tests_dir, "tests")]
    if not (task.tests_dir / "runner.py").exists():
        files.append((SHARED_RUNNER, "tests/runner.py"))
    return files


def install_tests(task: TerminalTask, workspace: Path) -> Path:
    """Replace whatever is at `workspace/tests` (a planted file, directory or link) with `grader_files(task)`."""
    target = workspace / "tests"
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    for src, dest in grader_files(task):
        if src.is_dir():
            shutil.copytree(src, workspace / dest)
        else:
            shutil.copy2(src, workspace / dest)
    return target


_TEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR) (\S.*?)(?: - .*)?\s*$")
_RESULT_LINE = re.compile(r"^RESULT passed=(\d+) failed=(\d+)\s*$")
# pytest's last line: "3 passed, 1 failed in 0.12s", framed by "=" without -q, with "(0:01:05)" past a minute
_PYTEST_SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+)(?:, \d+ [a-z]+)*) in [\d.]+s\b[^=]*=*\s*$")
PYTEST_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected", "warning", "rerun")


@dataclass(frozen=True)
class PytestSummary:
    """The counts on pytest's summary line (pytest writes "error"/"errors" and "warning"/"warnings")."""

    passed: int = 0
    failed: int = 0
    errors: int = 0  # setup/teardown errors and collection errors
    skipped: int = 0
    xfailed: int = 0
    xpassed: int = 0
    deselected: int = 0
    warnings: int = 0
    rerun: int = 0

    @property
    def not_passed(self) -> int:
        """Tests that count against the verdict: failures and errors (skips and xfails do not)."""
        return self.failed + self.errors


def parse_pytest_summary(line: str) -> PytestSummary | None:
    """The counts of a pytest summary line such as `1 failed, 3 passed, 2 warnings in 0.12s`; None for any other line.

    A line naming an outcome pytest does not report (see PYTEST_OUTCOMES) is not a summary line.
    """
    m = _PYTEST_SUMMARY.match(line)
    if not m:
        return None
    counts: dict[str, int] = {}
    for part in m.group(1).split(", "):
        number, word = part.split(" ", 1)
        word = word[:-1] if word in ("errors", "warnings", "reruns") else word
        if word not in PYTEST_OUTCOMES or word in counts:
            return None
        counts[word] = int(number)
    field = {"error": "errors", "warning": "warnings"}
    return PytestSummary(**{field.get(word, word): n for word, n in counts.items()})


def parse_test_output(stdout: str) -> TestVerdict:
    """The verdict in run-tests.sh's stdout.

    Reads `PASSED <name>` / `FAILED <name>` / `ERROR <name>` lines (ours, or pytest's short summary:
    `-rA` lists every test, the default lists only failures and errors; ERROR counts as failed) and the
    summary: our `RESULT passed=<n> failed=<m>` or pytest's last line (`parse_pytest_summary`: failed
    and errors count as failed, skips and xfails count as neither). Without any PASSED line the counts
    come from the summary, and the failure lines must match its failures. `all_passed` needs a
    summary, no failure and at least one pass. Output that contradicts itself (a test named twice,
    summaries that disagree with each other or with the per-test lines) earns nothing: passed=0.
    """
    statuses: dict[str, str] = {}
    duplicate = False
    summaries: list[tuple[int, int]] = []
    for line in stdout.splitlines():
        if m := _TEST_LINE.match(line):
            duplicate |= m.group(2) in statuses
            statuses[m.group(2)] = m.group(1)
        elif m := _RESULT_LINE.match(line):
            summaries.append((int(m.group(1)), int(m.group(2))))
        elif pytest_summary := parse_pytest_summary(line):
            summaries.append((pytest_summary.passed, pytest_summary.not_passed))
    failed = sum(s != "PASSED" for s in statuses.values())
    if "PASSED" in statuses.values():
        passed = len(statuses) - failed
    else:  # only failures listed (pytest without -rA), or no test lines at all
        passed = summaries[0][0] if summaries else 0
        failed = summaries[0][1] if summaries and not statuses else failed
    if duplicate or any(s != (passed, failed) for s in summaries):
        return TestVerdict(passed=0, failed=max(failed, 1), all_passed=False)
    return TestVerdict(passed=passed, failed=failed, all_passed=bool(summaries) and failed == 0 and passed >= 1)


def reported_test_lines(stdout: str) -> list[tuple[str, str]]:
    """The (status, test name) of every `PASSED|FAILED|ERROR <name>` line (pytest's `-rA` summary), in order."""
    return [(m.group(1), m.group(2)) for line in stdout.splitlines() if (m := _TEST_LINE.match(line))]


def failing_tests(stdout: str) -> list[str]:
    """Names of the tests that run-tests.sh's stdout reports FAILED (or ERROR), in order, each once."""
    return list(dict.fromkeys(name for status, name in reported_test_lines(stdout) if status != "PASSED"))
