"""Peak resident memory of a piece of work, on Linux: reset the high-water mark, run, read it back.

Run each measured case in a fresh process (see `run_case`): memory freed by an
earlier case stays in the allocator and would hide a later case's growth.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise KeyError(field)


def peak_mb(work: Callable[[], object]) -> float:
    """MB by which the process's peak RSS rose above its RSS while `work` ran."""
    gc.collect()
    before = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    work()
    return round((_status_kb("VmHWM") - before) / 1024, 1)


def run_case(script: str, *args: str) -> dict:
    """Run `script --case ARGS` in a fresh interpreter; it prints its result as the last JSON line."""
    res = subprocess.run([sys.executable, script, "--case", *args], capture_output=True, text=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    return json.loads(res.stdout.strip().splitlines()[-1])
