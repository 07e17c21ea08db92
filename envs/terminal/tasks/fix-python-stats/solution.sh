#!/bin/bash
set -euo pipefail
cat > stats.py <<'PY'
"""Print count, mean and median of the numbers in a file (one number per line)."""
import sys


def read_numbers(path):
    with open(path) as f:
        return [float(line) for line in f if line.strip()]


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def main():
    numbers = read_numbers(sys.argv[1])
    mean = sum(numbers) / len(numbers)
    print(f"count={len(numbers)} mean={mean:.2f} median={median(numbers):.2f}")


if __name__ == "__main__":
    main()
PY
