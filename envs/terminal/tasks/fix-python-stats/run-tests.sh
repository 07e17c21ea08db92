#!/bin/bash
# Grader contract: cwd = the workspace copy; ./tests (or $TEST_DIR) = this task's tests/, copied in only
# after the agent finished. -I: nothing in the workspace (a planted sitecustomize.py, json.py...) is imported.
TEST_DIR="${TEST_DIR:-tests}"
exec python3 -I "$TEST_DIR/runner.py" "$TEST_DIR/test_outputs.py"
