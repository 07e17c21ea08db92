"""Terminal-agent environment: Terminal-Bench-compatible task directories (tasks.py, tasks/)."""
