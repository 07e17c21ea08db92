"""What a live run costs while nobody talks to it: CPU time of all its processes over an idle window.

    python benchmarks/idle_cost.py [--window 60] [--settle 15]

Starts `clawr1 run recipes/live/cpu.yaml` (free ports, a temporary run directory), waits until it is
ready and settled, reads every process's user+system CPU time from /proc before and after the
window, stops the run, and prints one JSON line. Goal: under 5% of one core in total.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.ports import free_port  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")
GOAL = 0.05


def tree(root: int) -> list[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [root], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def name_of(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [a.decode(errors="replace") for a in args if a]
    if "clawr1.cli" in words:
        return words[words.index("clawr1.cli") + 1]  # run | serve | gateway | judge | pool | train
    return Path(words[0]).name if words else "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", type=float, default=60.0, help="idle seconds measured")
    p.add_argument("--settle", type=float, default=15.0, help="seconds to wait after ready, before measuring")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.Popen([sys.executable, "-m", "clawr1.cli", "run", "recipes/live/cpu.yaml", f"run.dir={tmp}/run",
                                f"gateway.port={free_port()}"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        try:
            for line in run.stdout:
                if line.startswith("[run] ready"):
                    break
            else:
                raise SystemExit("the live run exited before it was ready")
            time.sleep(args.settle)
            pids = tree(run.pid)
            names = {pid: name_of(pid) for pid in pids}
            before = {pid: cpu_seconds(pid) for pid in pids}
            time.sleep(args.window)
            after = {pid: cpu_seconds(pid) for pid in pids if Path(f"/proc/{pid}").exists()}
        finally:
            run.send_signal(signal.SIGINT)
            run.communicate(timeout=120)
        per_process: dict[str, float] = {}
        for pid, t in after.items():
            per_process[names[pid]] = per_process.get(names[pid], 0.0) + (t - before[pid]) / args.window
        total = sum(per_process.values())
    print(json.dumps({"benchmark": "idle_cost", "window_s": args.window, "processes": len(after),
                      "cpu_fraction_of_one_core": round(total, 4), "goal": GOAL, "ok": total < GOAL,
                      "per_process": {k: round(v, 4) for k, v in sorted(per_process.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
