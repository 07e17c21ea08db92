"""Run the test_* functions of a test file, in order; print one machine-readable line each.

The one shared test runner of the terminal tasks: the grader installs this file as ./tests/runner.py
with a task's tests, unless the task's tests/ ships a runner.py of its own (see README.md). It runs
inside the sandbox under the system python3, so it uses only the standard library.

Usage (cwd = the workspace): python3 -I tests/runner.py tests/test_outputs.py
Stdout holds only `PASSED <name>` / `FAILED <name>` lines and a last `RESULT passed=<n> failed=<m>`.
Everything else (tracebacks, prints, subprocesses' output) goes to stderr, so nothing a test reads
from the workspace can forge a line. Exit status 0 iff at least one test ran and none failed.
"""
import os
import runpy
import sys
import traceback


def main(test_file):
    results = os.fdopen(os.dup(1), "w")  # private copy of stdout; not inherited by subprocesses
    os.dup2(2, 1)  # fd 1 (prints, children) now goes to stderr
    sys.stdout = sys.stderr
    try:
        namespace = runpy.run_path(test_file, run_name="test_outputs")
    except (Exception, SystemExit):
        traceback.print_exc()
        namespace = {}
    tests = [(name, fn) for name, fn in namespace.items() if name.startswith("test_") and callable(fn)]
    if not tests:
        results.write("FAILED collect\nRESULT passed=0 failed=1\n")
        results.flush()
        return 1
    failed = 0
    for name, fn in tests:
        try:
            fn()
        except (Exception, SystemExit):
            failed += 1
            traceback.print_exc()
            results.write(f"FAILED {name}\n")
        else:
            results.write(f"PASSED {name}\n")
        results.flush()
    results.write(f"RESULT passed={len(tests) - failed} failed={failed}\n")
    results.flush()
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
