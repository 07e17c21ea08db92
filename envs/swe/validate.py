"""Check SWE tasks the way SWE-smith keeps them: their tests fail with the bug and pass with the fix.

    python -m envs.swe.validate [--tasks FILE] [--backend auto]

For each task, in fresh sandboxes: the whole test suite with the bug (base + test_patch) and with the
gold patch (base + patch + test_patch). FAIL_TO_PASS = the tests that fail with the bug and pass with
the fix; PASS_TO_PASS = the tests that pass both ways. A task is rejected when FAIL_TO_PASS comes out
empty, when a test fails with the gold patch, or when its stored lists differ from the derived ones
(so every stored PASS_TO_PASS test passes both ways). Exit status 1 when any task is rejected.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from envs.agentic.sandbox import Sandbox, SandboxLimits
from envs.swe.grading import PASSED, apply_patch, grading_limits, run_tests
from envs.swe.tasks import BUNDLED_TASKS, SweTask, TaskFormatError, load_tasks, prepared_repo

SUITE_TIMEOUT_S = 300.0


@dataclass
class Derived:
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problems: list[str] = field(default_factory=list)


def suite_outcomes(task: SweTask, with_fix: bool, backend: str = "auto",
                   limits: SandboxLimits | None = None) -> dict[str, str]:
    """Every test's outcome on the base commit plus test_patch, with the gold patch first when `with_fix`."""
    with Sandbox(prepared_repo(task), backend=backend, limits=grading_limits(limits, SUITE_TIMEOUT_S)) as box:
        for name, patch in (("patch", task.patch if with_fix else ""), ("test_patch", task.test_patch)):
            if patch:
                applied = apply_patch(box, patch)
                if not applied.ok:
                    raise TaskFormatError(f"instance {task.instance_id!r}: field '{name}' does not apply: "
                                          f"{applied.output.strip()[-300:]}")
        outcomes, _ = run_tests(box, None, SUITE_TIMEOUT_S)
    return outcomes


def derive(task: SweTask, backend: str = "auto") -> Derived:
    """FAIL_TO_PASS and PASS_TO_PASS from running the suite with the bug and with the fix."""
    bug, fix = suite_outcomes(task, False, backend), suite_outcomes(task, True, backend)
    derived = Derived([t for t, s in fix.items() if s == PASSED and bug.get(t) != PASSED],
                      [t for t, s in fix.items() if s == PASSED and bug.get(t) == PASSED])
    broken = [t for t, s in fix.items() if s != PASSED]
    if not fix:
        derived.problems.append("no test ran with the gold patch")
    if broken:
        derived.problems.append(f"tests fail with the gold patch: {', '.join(broken)}")
    if not derived.fail_to_pass:
        derived.problems.append("FAIL_TO_PASS is empty: no test fails with the bug and passes with the fix")
    return derived


def _difference(name: str, stored: tuple[str, ...], derived: list[str]) -> list[str]:
    missing, extra = [t for t in derived if t not in stored], [t for t in stored if t not in derived]
    problems = [f"stored {name} lacks {', '.join(missing)}"] if missing else []
    if extra:
        why = " (they do not pass both ways)" if name == "PASS_TO_PASS" else " (they do not fail with the bug)"
        problems.append(f"stored {name} has {', '.join(extra)}, which the runs do not give{why}")
    return problems


def validate(task: SweTask, backend: str = "auto") -> list[str]:
    """What is wrong with `task` (an empty list: it is valid)."""
    derived = derive(task, backend)
    return (derived.problems + _difference("FAIL_TO_PASS", task.fail_to_pass, derived.fail_to_pass)
            + _difference("PASS_TO_PASS", task.pass_to_pass, derived.pass_to_pass))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs.swe.validate", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default=str(BUNDLED_TASKS), help="a JSONL task file (default: the bundled one)")
    parser.add_argument("--backend", default="auto", help="sandbox backend: auto, bwrap or unshare")
    args = parser.parse_args(argv)
    rejected = 0
    for task in load_tasks(args.tasks):
        try:
            problems = validate(task, args.backend)
        except TaskFormatError as e:
            problems = [str(e)]
        rejected += bool(problems)
        print(f"{'REJECTED' if problems else 'ok'} {task.instance_id}" + "".join(f"\n  - {p}" for p in problems),
              flush=True)
    print(f"{rejected} of the tasks rejected" if rejected else "all tasks valid")
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
