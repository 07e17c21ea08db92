"""SWE-bench grading in a fresh sandbox: the agent's diff, the task's tests restored and added, tests run by id.

1. `agent_diff`: the agent's `git diff` against the base commit (new files included), taken inside
   the episode's sandbox (git never runs on the host over an agent's workspace).
2. `grade_patch`, in a fresh sandbox holding a clean copy of the base repository: apply the diff;
3. restore the test files to the base commit: every file `test_patch` touches, and every test file
   (`is_test_path`: under tests/, test_*.py, *_test.py, conftest.py) the diff touches; files the diff
   created there are deleted;
4. apply `test_patch`;
5. run FAIL_TO_PASS and PASS_TO_PASS by id with the sandbox toolchain's pytest (`-rA`) and read
   each test's outcome from pytest's short summary.

Resolved: every FAIL_TO_PASS test passed and every PASS_TO_PASS test still passed. An empty diff, a
diff that does not apply, a test that did not run: not resolved. pytest is the toolchain's, started
with `python3 -I` and the repository appended to `sys.path` (not prepended, as `python3 -m pytest`
would), so no file of the repository can stand in for pytest or its plugins. Code the tests import
runs inside pytest's process, as in SWE-bench: it is sandboxed, not trusted.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Iterable

from envs.agentic.sandbox import CommandResult, Sandbox, SandboxError, SandboxLimits
from envs.swe.tasks import SweTask, patch_files, prepared_repo
from envs.terminal.tasks import reported_test_lines

PASSED = "PASSED"
NOT_RUN = "NOT_RUN"  # grading stopped before the tests ran (empty or non-applying diff)
MISSING = "MISSING"  # pytest ran but did not report the test (not found, collection error...)
PYTEST_BOOT = "import os, sys; sys.path.append(os.getcwd()); import pytest; sys.exit(pytest.console_main())"
PYTEST = f"python3 -I -c {shlex.quote(PYTEST_BOOT)} -q -rA -p no:cacheprovider"
SUMMARY_HEADER = "short test summary info"
APPLY = "git apply --whitespace=nowarn -"
DIFF_FILE = ".git/clawr1-agent.diff"
GRADING_OUTPUT_BYTES = 4_000_000  # pytest's -rA report of a whole suite must reach its summary
TEST_DIRS = ("tests", "test", "testing")


@dataclass
class GradeReport:
    resolved: bool
    reason: str  # "" when resolved, else why not
    fail_to_pass: dict[str, str] = field(default_factory=dict)  # test id -> PASSED / FAILED / ERROR / MISSING...
    pass_to_pass: dict[str, str] = field(default_factory=dict)

    def failing(self) -> list[str]:
        """The ids that did not pass: FAIL_TO_PASS first."""
        return [t for outcomes in (self.fail_to_pass, self.pass_to_pass) for t, s in outcomes.items() if s != PASSED]

    def feedback(self) -> str:
        """The judge's text: what is resolved, or which tests fail."""
        if self.resolved:
            return f"resolved: all {len(self.fail_to_pass) + len(self.pass_to_pass)} tests passed"
        failing = self.failing()
        if not failing or self.reason != "tests failed":
            return f"not resolved: {self.reason}"
        more = f" and {len(failing) - 5} more" if len(failing) > 5 else ""
        return "not resolved: failing tests: " + ", ".join(failing[:5]) + more

    def details(self) -> dict:
        return {"resolved": self.resolved, "reason": self.reason, "FAIL_TO_PASS": dict(self.fail_to_pass),
                "PASS_TO_PASS": dict(self.pass_to_pass), "failing_tests": self.failing()[:20]}


def is_test_path(path: str) -> bool:
    """Whether a repository path is a test file whose edits grading discards."""
    parts = path.split("/")
    name = parts[-1]
    return (any(part in TEST_DIRS for part in parts[:-1]) or name.startswith("test_") or name.endswith("_test.py")
            or name == "conftest.py")


def parse_outcomes(output: str, ids: Iterable[str] = ()) -> dict[str, str]:
    """Each test's outcome in pytest's `-rA` short summary; a test named twice keeps its worst outcome.

    A line is `STATUS <id>` or `STATUS <id> - <message>`; an id that itself holds " - " (a parametrized
    one) is recognised when it is among `ids`, the tests asked for.
    """
    if SUMMARY_HEADER not in output:
        return {}
    known = sorted(ids, key=len, reverse=True)  # the longest match first: `t[a - b]` before `t[a`
    outcomes: dict[str, str] = {}
    for line in output.rsplit(SUMMARY_HEADER, 1)[1].splitlines():
        for status, name in reported_test_lines(line):
            rest = line[len(status) + 1:].rstrip()
            name = next((i for i in known if rest == i or rest.startswith(i + " - ")), name)
            if outcomes.get(name, PASSED) == PASSED:
                outcomes[name] = status
    return outcomes


def grading_limits(limits: SandboxLimits | None, test_timeout_s: float) -> SandboxLimits:
    return replace(limits or SandboxLimits(), max_output_bytes=GRADING_OUTPUT_BYTES, timeout_s=test_timeout_s)


def run_tests(box: Sandbox, ids: Iterable[str] | None, timeout_s: float) -> tuple[dict[str, str], CommandResult]:
    """Run the given test ids (None: the whole suite) in `box`; their outcomes and pytest's result."""
    ids = [] if ids is None else list(ids)
    result = box.run(PYTEST + "".join(" " + shlex.quote(i) for i in ids), timeout_s=timeout_s)
    return parse_outcomes(result.output, ids), result


def agent_diff(box: Sandbox, base_commit: str, timeout_s: float = 60.0) -> str:
    """The agent's changes against the base commit, new files included ("" when there is no repository left)."""
    command = (f"git add -A && git -c core.quotepath=off diff --cached --binary --no-color --no-ext-diff "
               f"--no-renames {shlex.quote(base_commit)} > {DIFF_FILE}")
    if not box.run(command, timeout_s=timeout_s).ok:
        return ""
    try:
        return box.read_file(DIFF_FILE, max_bytes=50_000_000)
    except (SandboxError, OSError):
        return ""


def restore_tests(box: Sandbox, task: SweTask, timeout_s: float = 60.0) -> list[str]:
    """Put the test files the diff changed back to the base commit (deleting new ones); the paths restored."""
    listed = box.run(f"git add -A && git diff --cached --name-only --no-renames -z {shlex.quote(task.base_commit)}",
                     timeout_s=timeout_s)
    if not listed.ok:
        raise SandboxError(f"could not list the changed files: {listed.output[-300:]}")
    protected = set(patch_files(task.test_patch))
    paths = [p for p in listed.output.split("\0") if p and (p in protected or is_test_path(p))]
    base = shlex.quote(task.base_commit)
    script = "".join(f"if git cat-file -e {base}:{shlex.quote(p)} 2>/dev/null; then git checkout -q {base} -- "
                     f"{shlex.quote(p)}; else rm -rf -- {shlex.quote(p)}; fi\n" for p in paths)
    if script:
        restored = box.run("set -e\n" + script, timeout_s=timeout_s)
        if not restored.ok:
            raise SandboxError(f"could not restore the test files: {restored.output[-300:]}")
    return paths


def apply_patch(box: Sandbox, patch: str, timeout_s: float = 60.0) -> CommandResult:
    return box.run(APPLY, stdin=patch, timeout_s=timeout_s)


def _not_run(task: SweTask, reason: str) -> GradeReport:
    return GradeReport(False, reason, {t: NOT_RUN for t in task.fail_to_pass}, {t: NOT_RUN for t in task.pass_to_pass})


def grade_patch(task: SweTask, diff: str, backend: str = "auto", limits: SandboxLimits | None = None,
                test_timeout_s: float = 300.0) -> GradeReport:
    """Grade `diff` for `task` in a fresh sandbox: steps 2 to 5 of the module's docstring."""
    if not diff.strip():
        return _not_run(task, "empty diff")
    with Sandbox(prepared_repo(task), backend=backend, limits=grading_limits(limits, test_timeout_s)) as box:
        applied = apply_patch(box, diff)
        if not applied.ok:
            return _not_run(task, f"the diff does not apply: {applied.output.strip()[-300:]}")
        restore_tests(box, task)
        applied = apply_patch(box, task.test_patch)
        if not applied.ok:
            return _not_run(task, f"test_patch does not apply: {applied.output.strip()[-300:]}")
        outcomes, result = run_tests(box, [*task.fail_to_pass, *task.pass_to_pass], test_timeout_s)
    report = GradeReport(False, "", {t: outcomes.get(t, MISSING) for t in task.fail_to_pass},
                         {t: outcomes.get(t, MISSING) for t in task.pass_to_pass})
    report.resolved = not report.failing()
    report.reason = "" if report.resolved else ("the tests timed out" if result.timed_out else "tests failed")
    return report
