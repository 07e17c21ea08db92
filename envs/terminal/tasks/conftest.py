# The task directories' tests/ run inside a task's workspace through run-tests.sh, never under the
# project's pytest (tests/envs/test_terminal_tasks.py drives them).
collect_ignore_glob = ["*"]
