"""What a run costs before it trains: CPU-seconds and wall seconds from `clawr1 run` to its first trainer step,
with the fork server (run.fork_server=true, the default) against every loop started as a fresh Python
(run.fork_server=false), in the same invocation.

    python benchmarks/run_start.py [--recipes tiny,qwen] [--repeats 1]

Each start runs `clawr1 run RECIPE run.max_steps=1 rollout.eval_every=0` in a temporary directory (no
evaluation before training, so the first step follows the start), reads the time of `[run] all loops up`
and of the first `[train] step` line, and at each reads the user+system CPU time of the whole process tree:
every live process and what its reaped children used. The qwen recipe needs Qwen2.5-Coder-0.5B in the
model cache (docs/real_model.md). Goals (issue 62): the tiny recipe's first step under 10 s wall, and the
fork server at least 3x less CPU than fresh starts. Prints one JSON line.
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

from benchmarks.idle_cost import TICKS, tree  # noqa: E402

RECIPES = {"tiny": "recipes/combined/cpu.yaml", "qwen": "recipes/combined/cpu_qwen05_lora.yaml"}
STARTS = {"fresh": "run.fork_server=false", "fork_server": "run.fork_server=true"}


def tree_cpu_s(root: int) -> float:
    """User+system CPU of `root`'s live process tree, with what each process's reaped children used."""
    total = 0
    for pid in tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked: its parent's reaped-children time holds it once reaped
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return total / TICKS


def one_start(recipe: str, start: str, run_dir: Path) -> dict[str, float]:
    """Start, read the two moments, stop the run (SIGINT, as Ctrl-C) and wait for it."""
    command = [sys.executable, "-m", "clawr1.cli", "run", recipe, f"run.dir={run_dir}", "run.max_steps=1",
               "rollout.eval_every=0", start]
    began = time.monotonic()
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    moments: dict[str, float] = {}
    try:
        for line in proc.stdout:
            if line.startswith("[run] all loops up") and "ready_wall_s" not in moments:
                moments.update(ready_wall_s=time.monotonic() - began, ready_cpu_s=tree_cpu_s(proc.pid))
            if line.startswith("[train] step"):
                moments.update(step_wall_s=time.monotonic() - began, step_cpu_s=tree_cpu_s(proc.pid))
                break
            if line.startswith("[run] FAILED"):
                raise SystemExit(f"{recipe} ({start}) failed: {line.strip()}; see {run_dir / 'logs'}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=300)
    if "step_wall_s" not in moments:
        raise SystemExit(f"{recipe} ({start}) ended before its first step; see {run_dir / 'logs'}")
    return {k: round(v, 2) for k, v in moments.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", default="tiny,qwen", help="comma-separated: tiny, qwen")
    parser.add_argument("--repeats", type=int, default=1, help="starts of each kind, alternated")
    args = parser.parse_args()
    result: dict = {"bench": "run_start", "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.recipes.split(","):
            runs: dict[str, list[dict[str, float]]] = {start: [] for start in STARTS}
            for i in range(args.repeats):
                for start, override in STARTS.items():
                    print(f"[run_start] {name} {start} {i + 1}/{args.repeats}", file=sys.stderr, flush=True)
                    runs[start].append(one_start(RECIPES[name], override, Path(tmp) / f"{name}-{start}-{i}"))
            best = {start: min(r, key=lambda m: m["step_wall_s"]) for start, r in runs.items()}
            result[name] = {**best, "runs": runs,
                            "step_cpu_ratio": round(best["fresh"]["step_cpu_s"] / best["fork_server"]["step_cpu_s"], 2),
                            "ready_cpu_ratio": round(best["fresh"]["ready_cpu_s"] / best["fork_server"]["ready_cpu_s"], 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
