import os
import shutil
import subprocess
import tempfile

CASES = [  # (file contents, expected output line)
    ("4\n8\n15\n16\n\n23\n42\n", "count=6 mean=18.00 median=15.50"),
    ("7\n", "count=1 mean=7.00 median=7.00"),
    ("3\n1\n2\n", "count=3 mean=2.00 median=2.00"),
    ("  \n-1.5\n2.5\n10\n\t\n-4\n", "count=4 mean=1.75 median=0.50"),
    ("1\n2", "count=2 mean=1.50 median=1.50"),
]


def run_stats(text):
    scratch = tempfile.mkdtemp(prefix=".stats-test-", dir=".")
    try:
        path = os.path.join(scratch, "input.txt")
        with open(path, "w") as f:
            f.write(text)
        out = subprocess.run(["python3", "stats.py", path], capture_output=True, text=True, timeout=10)
    finally:
        shutil.rmtree(scratch)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_workspace_numbers():
    assert run_stats(CASES[0][0]) == CASES[0][1]


def test_odd_count_and_unsorted_input():
    for text, expected in CASES[1:3]:
        assert run_stats(text) == expected


def test_negatives_decimals_and_whitespace_lines():
    assert run_stats(CASES[3][0]) == CASES[3][1]


def test_last_line_without_newline():
    assert run_stats(CASES[4][0]) == CASES[4][1]
