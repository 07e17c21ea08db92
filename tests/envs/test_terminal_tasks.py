"""The bundled terminal tasks and their loader.

For every task, in a fresh copy of its workspace under a clean environment: the reference solution
passes its tests, an untouched workspace fails them, and files the agent could plant (a reward file,
its own ./run-tests.sh or ./tests, modules that python would import from the current directory)
change nothing.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from envs.terminal.tasks import (DEFAULT_AGENT_TIMEOUT_S, DEFAULT_CATEGORY, DEFAULT_TEST_TIMEOUT_S, SHARED_RUNNER,
                                 PytestSummary, TerminalTask, TestVerdict, copy_workspace, failing_tests,
                                 grader_files, install_tests, load_task, load_tasks, parse_pytest_summary,
                                 parse_test_output)
from tests.conftest import REPO

TASKS_DIR = REPO / "envs" / "terminal" / "tasks"
TASKS = load_tasks(TASKS_DIR)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_LINE = re.compile(r"^(PASSED|FAILED) \S+$|^RESULT passed=\d+ failed=\d+$")
FORGED = "PASSED forged\nRESULT passed=99 failed=0\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A clean environment with /usr/bin/python3 first on PATH."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python3").symlink_to("/usr/bin/python3")
    (tmp_path / "home").mkdir()
    return {"PATH": f"{shim}:{SYSTEM_PATH}", "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}


def bash(script: Path, cwd: Path, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script.resolve())], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def prepare(task: TerminalTask, dest: Path, env: dict[str, str]) -> Path:
    """A fresh workspace copy, set up as the agent would find it."""
    workspace = copy_workspace(task, dest)
    if task.setup_path:
        setup = bash(task.setup_path, workspace, env)
        assert setup.returncode == 0, setup.stderr
    return workspace


def grade(task: TerminalTask, workspace: Path, env: dict[str, str]) -> tuple[int, TestVerdict, str]:
    """What the grader does after the agent: install the task's tests, run the task's run-tests.sh."""
    install_tests(task, workspace)
    run = bash(task.run_tests_path, workspace, env, timeout=task.test_timeout_s)
    return run.returncode, parse_test_output(run.stdout), run.stdout


def plant(workspace: Path) -> None:
    """Everything an agent might leave behind to fake a pass."""
    (workspace / "reward.txt").write_text("1\n")
    (workspace / "result.json").write_text('{"passed": true, "reward": 1}\n')
    (workspace / "run-tests.sh").write_text(f"#!/bin/bash\nprintf '{FORGED}'\nexit 0\n")
    (workspace / "run-tests.sh").chmod(0o755)
    fake = f"import os\nprint({FORGED!r}, end='', flush=True)\nos._exit(0)\n"
    (workspace / "tests").mkdir()  # no bundled workspace ships a tests/ of its own
    for name in ("test_outputs.py", "runner.py", "test_x.py"):
        (workspace / "tests" / name).write_text(fake)
    for name in ("sitecustomize.py", "usercustomize.py", "runner.py", "runpy.py", "traceback.py"):
        (workspace / name).write_text(fake)


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_reference_solution_passes(task: TerminalTask, tmp_path: Path, env: dict[str, str]):
    workspace = prepare(task, tmp_path / "ws", env)
    solved = bash(task.solution_path, workspace, env)
    assert solved.returncode == 0, solved.stderr
    rc, verdict, stdout = grade(task, workspace, env)
    assert rc == 0, stdout
    assert verdict.all_passed and verdict.failed == 0 and verdict.passed >= 1, stdout
    assert all(OUTPUT_LINE.match(line) for line in stdout.splitlines()), stdout
    assert stdout.splitlines()[-1] == f"RESULT passed={verdict.passed} failed=0"


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_untouched_workspace_fails_and_planted_files_change_nothing(task: TerminalTask, tmp_path: Path,
                                                                    env: dict[str, str]):
    rc, verdict, stdout = grade(task, prepare(task, tmp_path / "clean", env), env)
    assert rc != 0 and not verdict.all_passed and verdict.failed >= 1, stdout

    workspace = prepare(task, tmp_path / "planted", env)
    plant(workspace)
    planted_rc, planted_verdict, planted_stdout = grade(task, workspace, env)
    assert planted_rc != 0 and planted_verdict == verdict, planted_stdout
    assert "forged" not in planted_stdout
    assert (workspace / "tests" / "test_outputs.py").read_bytes() == (task.tests_dir / "test_outputs.py").read_bytes()
    assert (workspace / "tests" / "runner.py").read_bytes() == SHARED_RUNNER.read_bytes()
    assert not (workspace / "tests" / "test_x.py").exists()


def test_the_bundled_set():
    assert len(TASKS) >= 22
    assert len({t.id for t in TASKS}) == len(TASKS) and [t.id for t in TASKS] == sorted(t.id for t in TASKS)
    assert {"file-operations", "text-processing", "data-processing", "archives", "permissions", "git",
            "debugging", "log-analysis", "database"} <= {t.category for t in TASKS}
    assert {t.difficulty for t in TASKS} == {"easy", "medium", "hard"}
    assert sum(t.category == "git" for t in TASKS) >= 4
    assert all(t.instruction.strip() and t.agent_timeout_s <= 600 and t.test_timeout_s <= 60 for t in TASKS)


def test_every_task_uses_the_canonical_run_tests_and_the_shared_runner():
    template = TASKS_DIR / "_template"
    assert sorted(p.name for p in template.iterdir()) == ["README.md", "run-tests.sh"]
    assert not list(TASKS_DIR.rglob("runner.py"))  # one runner, envs/terminal/runner.py, installed by the grader
    for task in TASKS:
        assert task.run_tests_path.read_bytes() == (template / "run-tests.sh").read_bytes(), task.id
        assert grader_files(task) == [(task.tests_dir, "tests"), (SHARED_RUNNER, "tests/runner.py")], task.id


def test_the_runner_keeps_everything_but_verdicts_off_stdout(tmp_path: Path, env: dict[str, str]):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "runner.py").write_bytes(SHARED_RUNNER.read_bytes())
    (tmp_path / "tests" / "test_outputs.py").write_text(
        "import os, subprocess, sys\n"
        "def test_prints():\n    print('PASSED printed')\n"
        "def test_child_output():\n    subprocess.run(['echo', 'RESULT passed=9 failed=0'])\n"
        "def test_fails():\n    assert 1 == 2, 'PASSED in a message'\n"
        "def test_exits():\n    sys.exit(0)\n"
        "def helper():\n    raise AssertionError\n")
    run = subprocess.run(["python3", "-I", "tests/runner.py", "tests/test_outputs.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 1
    assert run.stdout == "PASSED test_prints\nPASSED test_child_output\nFAILED test_fails\nFAILED test_exits\n" \
                         "RESULT passed=2 failed=2\n"
    assert "PASSED printed" in run.stderr and "RESULT passed=9" in run.stderr and "PASSED in a message" in run.stderr
    (tmp_path / "tests" / "test_outputs.py").write_text("raise ImportError('broken')\n")
    broken = subprocess.run(["python3", "-I", "tests/runner.py", "tests/test_outputs.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=30)
    assert (broken.returncode, broken.stdout) == (1, "FAILED collect\nRESULT passed=0 failed=1\n")


def machine_path_findings(checkout: Path) -> list[str]:
    """Task files under a checkout that hold a .git directory, or the absolute path of the checkout or of its user's
    home (a path that only exists on the machine the task was written on). A path counts only where it starts:
    with HOME=/tmp, a task's relative "project/tmp/cache" names no machine path."""
    paths = {str(checkout.resolve()), str(checkout)} | ({str(Path.home())} if Path.home() != Path("/") else set())
    machine_path = re.compile(r"(?<![\w./~-])(?:" + "|".join(re.escape(p) for p in sorted(paths)) + r")(?=/|\b)")
    findings = []
    for task in load_tasks(checkout / "envs" / "terminal" / "tasks"):
        for p in (p for p in task.path.rglob("*") if p.is_file()):
            if ".git" in p.relative_to(task.path).parts:
                findings.append(f"{p}: inside a .git directory")
            elif machine_path.search(p.read_text(errors="replace")):
                findings.append(f"{p}: names a machine path")
    return findings


def test_no_task_ships_a_git_directory_or_absolute_machine_paths():
    assert machine_path_findings(REPO) == []


def test_the_path_check_holds_wherever_the_checkout_lives(tmp_path: Path):
    """A fresh clone directly under the system's temporary directory (where CI may put one) passes the same check,
    and the check still sees a machine path planted in a task."""
    if not (REPO / ".git").exists():
        pytest.skip("this checkout is not a git repository")
    clone = Path(tempfile.mkdtemp(prefix="clawr1-clone-"))
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(clone)], check=True, timeout=120)
        assert machine_path_findings(clone) == []
        planted = load_tasks(clone / "envs" / "terminal" / "tasks")[0].path / "planted.txt"
        planted.write_text(f"cat {clone}/secrets\n")
        assert machine_path_findings(clone) == [f"{planted}: names a machine path"]
    finally:
        shutil.rmtree(clone, ignore_errors=True)


# ---------------------------------------------------------------- the loader

def write_task(root: Path, yaml_text: str, *, skip: tuple[str, ...] = ()) -> Path:
    root.mkdir(parents=True)
    (root / "task.yaml").write_text(yaml_text)
    for name in ("solution.sh", "run-tests.sh"):
        if name not in skip:
            (root / name).write_text("#!/bin/bash\n")
    if "tests" not in skip:
        (root / "tests").mkdir()
    return root


GOOD = "instruction: Do it.\ndifficulty: easy\ncategory: git\ntags: [a, b]\nmax_agent_timeout_sec: 100\n" \
       "max_test_timeout_sec: 20\nauthor_email: x@example.com\nparser_name: pytest\n"


def test_load_task_reads_the_fields(tmp_path: Path):
    root = write_task(tmp_path / "my-task", GOOD)
    (root / "workspace").mkdir()
    (root / "setup.sh").write_text("true\n")
    task = load_task(root)
    assert (task.id, task.instruction, task.category, task.difficulty, task.tags) == \
        ("my-task", "Do it.\n", "git", "easy", ("a", "b"))
    assert (task.agent_timeout_s, task.test_timeout_s) == (100.0, 20.0)
    assert (task.workspace_dir, task.setup_path, task.solution_path) == \
        (root / "workspace", root / "setup.sh", root / "solution.sh")
    assert (task.run_tests_path, task.tests_dir) == (root / "run-tests.sh", root / "tests")


def test_load_task_defaults_like_terminal_bench(tmp_path: Path):
    task = load_task(write_task(tmp_path / "t", "instruction: |\n  Multi\n  line\ndifficulty: hard\n"))
    assert (task.instruction, task.category, task.tags) == ("Multi\nline\n", DEFAULT_CATEGORY, ())
    assert (task.agent_timeout_s, task.test_timeout_s) == (DEFAULT_AGENT_TIMEOUT_S, DEFAULT_TEST_TIMEOUT_S)
    assert (task.workspace_dir, task.setup_path) == (None, None)


def test_load_task_reads_the_older_descriptions_format(tmp_path: Path):
    text = "descriptions:\n  - key: base\n    description: Old style.\ndifficulty: medium\n"
    assert load_task(write_task(tmp_path / "t", text)).instruction == "Old style.\n"


@pytest.mark.parametrize("yaml_text, field, message", [
    ("difficulty: easy\n", "instruction", "missing field 'instruction'"),
    ("instruction: '  '\ndifficulty: easy\n", "instruction", "field 'instruction' is empty"),
    ("instruction: [1]\ndifficulty: easy\n", "instruction", "field 'instruction' must be a string"),
    ("instruction: x\n", "difficulty", "missing field 'difficulty'"),
    ("instruction: x\ndifficulty: extreme\n", "difficulty", "must be one of easy, medium, hard, unknown"),
    ("instruction: x\ndifficulty: easy\ntags: git\n", "tags", "field 'tags' must be a list"),
    ("instruction: x\ndifficulty: easy\ntags: [1]\n", "tags", "list of non-empty strings"),
    ("instruction: x\ndifficulty: easy\ncategory: 3\n", "category", "field 'category' must be a string"),
    ("instruction: x\ndifficulty: easy\nmax_agent_timeout_sec: soon\n", "max_agent_timeout_sec", "must be a number"),
    ("instruction: x\ndifficulty: easy\nmax_test_timeout_sec: -5\n", "max_test_timeout_sec", "positive number"),
    ("instruction: x\ndifficulty: easy\nmax_test_timeout_sec: true\n", "max_test_timeout_sec", "must be a number"),
    ("- just\n- a list\n", "", "must be a mapping of fields"),
    ("instruction: [unclosed\n", "", "not valid YAML"),
])
def test_load_task_names_the_file_and_the_bad_field(tmp_path: Path, yaml_text: str, field: str, message: str):
    root = write_task(tmp_path / "t", yaml_text)
    with pytest.raises(ValueError) as err:
        load_task(root)
    assert str(root / "task.yaml") in str(err.value) and message in str(err.value) and field in str(err.value)


@pytest.mark.parametrize("missing", ["solution.sh", "run-tests.sh", "tests"])
def test_load_task_names_a_missing_file(tmp_path: Path, missing: str):
    root = write_task(tmp_path / "t", GOOD, skip=(missing,))
    with pytest.raises(ValueError, match=f"missing (file|directory) '{missing}'") as err:
        load_task(root)
    assert str(root / missing) in str(err.value)


def test_load_task_rejects_a_directory_without_task_yaml(tmp_path: Path):
    with pytest.raises(ValueError, match=r"task\.yaml.*not a task directory"):
        load_task(tmp_path)


def test_load_tasks_accepts_one_task_or_a_directory_of_them(tmp_path: Path):
    for name in ("zeta", "alpha", "mid"):
        write_task(tmp_path / "set" / name, GOOD)
    (tmp_path / "set" / "_template").mkdir()  # skipped, like files
    (tmp_path / "set" / "notes.md").write_text("not a task")
    assert [t.id for t in load_tasks(tmp_path / "set")] == ["alpha", "mid", "zeta"]
    assert [t.id for t in load_tasks(tmp_path / "set" / "mid")] == ["mid"]


def test_load_tasks_errors(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no task directories"):
        load_tasks(tmp_path / "empty")
    with pytest.raises(ValueError, match="no such task directory"):
        load_tasks(tmp_path / "absent")
    (tmp_path / "set" / "stray").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"stray/task\.yaml"):
        load_tasks(tmp_path / "set")


def test_install_tests_replaces_planted_files_and_links_without_following_them(tmp_path: Path):
    task = load_task(write_task(tmp_path / "t", GOOD))
    (task.tests_dir / "test_outputs.py").write_text("real\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    for n, planted in enumerate(("file", "dir", "link")):
        workspace = tmp_path / f"ws{n}"
        workspace.mkdir()
        if planted == "file":
            (workspace / "tests").write_text("fake")
        elif planted == "dir":
            (workspace / "tests").mkdir()
            (workspace / "tests" / "test_outputs.py").write_text("fake\n")
        else:
            (workspace / "tests").symlink_to(outside)
        install_tests(task, workspace)
        assert not (workspace / "tests").is_symlink()
        assert sorted(p.name for p in (workspace / "tests").iterdir()) == ["runner.py", "test_outputs.py"]
        assert (workspace / "tests" / "test_outputs.py").read_text() == "real\n"
        assert (workspace / "tests" / "runner.py").read_bytes() == SHARED_RUNNER.read_bytes()
    assert (outside / "keep.txt").read_text() == "keep"


def test_a_task_that_ships_its_own_runner_keeps_it(tmp_path: Path):
    task = load_task(write_task(tmp_path / "t", GOOD))
    (task.tests_dir / "runner.py").write_text("# the task's own\n")
    assert grader_files(task) == [(task.tests_dir, "tests")]
    install_tests(task, tmp_path / "ws")
    assert (tmp_path / "ws" / "tests" / "runner.py").read_text() == "# the task's own\n"


def test_copy_workspace_makes_an_empty_directory_without_one(tmp_path: Path):
    task = load_task(write_task(tmp_path / "t", GOOD))
    assert list(copy_workspace(task, tmp_path / "ws").iterdir()) == []


# ---------------------------------------------------------------- parse_test_output

def test_parse_our_runner_output():
    assert parse_test_output("PASSED test_a\nPASSED test_b\nRESULT passed=2 failed=0\n") == TestVerdict(2, 0, True)
    verdict = parse_test_output("PASSED test_a\nFAILED test_b\nPASSED test_c\nRESULT passed=2 failed=1\n")
    assert verdict == TestVerdict(2, 1, False) and verdict.fraction == 2 / 3  # the same one division: bit for bit


def test_parse_needs_a_summary_and_a_pass():
    assert parse_test_output("PASSED test_a\n") == TestVerdict(1, 0, False)  # the runner died before its summary
    assert parse_test_output("") == TestVerdict(0, 0, False)
    assert parse_test_output("RESULT passed=0 failed=0\n") == TestVerdict(0, 0, False)
    assert parse_test_output("FAILED collect\nRESULT passed=0 failed=1\n") == TestVerdict(0, 1, False)
    assert TestVerdict(0, 0, False).fraction == 0.0


def test_parse_gives_nothing_for_output_that_contradicts_itself():
    forged_extra = "FAILED test_a\nRESULT passed=0 failed=1\nPASSED x\nRESULT passed=99 failed=0\n"
    assert parse_test_output(forged_extra) == TestVerdict(0, 1, False)
    assert parse_test_output("PASSED test_a\nRESULT passed=5 failed=0\n") == TestVerdict(0, 1, False)
    assert parse_test_output("FAILED test_a\nPASSED test_a\nRESULT passed=1 failed=0\n") == TestVerdict(0, 1, False)


def test_parse_ignores_other_lines():
    text = "noise PASSED test_z\n  PASSED indented\nPASSED\nRESULT passed=1 failed=0 extra\nPASSED test_a\n" \
           "RESULT passed=1 failed=0\n"
    assert parse_test_output(text) == TestVerdict(1, 0, True)


def test_failing_tests_names_each_failure_once_in_order():
    text = "PASSED test_a\nFAILED test_b\nERROR tests/t.py::test_c - boom\nFAILED test_b\n  FAILED indented\n"
    assert failing_tests(text) == ["test_b", "tests/t.py::test_c"]
    assert failing_tests("PASSED test_a\nRESULT passed=1 failed=0\n") == []


def test_parse_pytest_short_summary_and_final_line():
    text = """\
tests/test_outputs.py ..F                                                [100%]
=========================== short test summary info ============================
PASSED tests/test_outputs.py::test_a
PASSED tests/test_outputs.py::test_b[x-1]
FAILED tests/test_outputs.py::test_c - AssertionError: assert 1 == 2
========================= 1 failed, 2 passed in 0.12s ==========================
"""
    assert parse_test_output(text) == TestVerdict(2, 1, False)
    assert parse_test_output("========== 3 passed, 1 warning in 0.05s ==========\n") == TestVerdict(3, 0, True)
    assert parse_test_output("ERROR tests/t.py::test_a - fixture\n1 error in 0.1s\n") == TestVerdict(0, 1, False)


@pytest.mark.parametrize("line, expected", [
    ("3 passed, 1 failed in 0.12s", PytestSummary(passed=3, failed=1)),
    ("1 failed, 3 passed in 0.12s", PytestSummary(passed=3, failed=1)),
    ("2 failed, 1 passed, 3 errors in 1.50s", PytestSummary(passed=1, failed=2, errors=3)),
    ("1 error in 0.05s", PytestSummary(errors=1)),
    ("==== 4 passed, 1 skipped, 2 xfailed, 1 xpassed, 2 warnings in 0.30s ====",
     PytestSummary(passed=4, skipped=1, xfailed=2, xpassed=1, warnings=2)),
    ("========= 7 passed, 1 warning, 5 deselected in 61.02s (0:01:01) =========",
     PytestSummary(passed=7, warnings=1, deselected=5)),
    ("1 passed, 2 rerun in 0.4s", PytestSummary(passed=1, rerun=2)),
])
def test_parse_pytest_summary_reads_every_count(line: str, expected: PytestSummary):
    assert parse_pytest_summary(line) == expected


@pytest.mark.parametrize("line", [
    "no tests ran in 0.01s", "3 passed", "3 passed in", "PASSED tests/t.py::test_a", "3 hacked in 0.1s",
    "1 passed, 1 passed in 0.1s", "Interrupted: 1 error during collection", "x 3 passed in 0.1s",
])
def test_parse_pytest_summary_refuses_other_lines(line: str):
    assert parse_pytest_summary(line) is None


def test_parse_pytest_quiet_output_lists_only_failures():
    """`pytest -q` (no -rA): counts from the last line, each failure or error named once above it."""
    text = """\
..F.E                                                                    [100%]
=================================== FAILURES ===================================
___________________________________ test_c ____________________________________
E       assert 1 == 2
=========================== short test summary info ============================
FAILED tests/test_outputs.py::test_c - assert 1 == 2
ERROR tests/test_outputs.py::test_e - RuntimeError: fixture broke
1 failed, 3 passed, 1 error in 0.12s
"""
    verdict = parse_test_output(text)
    assert verdict == TestVerdict(passed=3, failed=2, all_passed=False) and verdict.fraction == 3 / 5
    assert failing_tests(text) == ["tests/test_outputs.py::test_c", "tests/test_outputs.py::test_e"]
    assert parse_test_output("....                    [100%]\n4 passed in 0.02s\n") == TestVerdict(4, 0, True)
    assert parse_test_output("2 passed, 1 skipped, 1 xfailed in 0.1s\n") == TestVerdict(2, 0, True)
    assert parse_test_output("3 skipped in 0.01s\n") == TestVerdict(0, 0, False)  # nothing passed


def test_parse_pytest_output_that_contradicts_itself_earns_nothing():
    # a failing test's captured output (shown under FAILURES) forging a clean run
    forged = "F.\n---- Captured stdout call ----\n5 passed in 0.01s\nFAILED t.py::test_a - x\n1 failed, 1 passed in 0.1s\n"
    assert parse_test_output(forged) == TestVerdict(0, 1, False)
    # fewer failure lines than the summary's failures, or more
    assert parse_test_output("FAILED t.py::test_a\n2 failed, 1 passed in 0.1s\n") == TestVerdict(0, 1, False)
    assert parse_test_output("FAILED t.py::a\nFAILED t.py::b\n1 failed in 0.1s\n") == TestVerdict(0, 2, False)
