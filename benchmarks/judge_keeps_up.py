"""Does the judge keep up with many concurrent users? A whole run, unthrottled, for a fixed time.

Runs the combined CPU recipe with `--users` simulated users and no pool-backlog
throttle (users chat as fast as the engine answers, as live traffic would),
for `--minutes`, then stops it with Ctrl-C and reads the judge's metrics
(reported every 5 s). Prints one JSON line:

- turns_received / turns_judged and judged_per_s over the run;
- queue_wait_s: how long TurnRecords waited between the gateway queueing them and
  the judge taking them (per 5-s window: mean of the first and last quarter of
  the run, and the max of any window); a judge that falls behind shows a wait that
  grows with time;
- backlog_max: records the judge had taken but not finished, at any report;
- bounded: whether the last quarter's mean wait is within 2x of the first
  quarter's (+0.5 s), and no more than 1% of turns were left unjudged at the end.

Usage: python benchmarks/judge_keeps_up.py [--users 16 --minutes 10 --run-dir runs/judge-keeps-up]
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def quarter_mean(rows: list[dict], key: str, which: int) -> float:
    n = max(len(rows) // 4, 1)
    part = rows[:n] if which == 0 else rows[-n:]
    values = [r[key] for r in part if r.get("received")]
    return sum(values) / len(values) if values else 0.0


def summarize(run_dir: Path, seconds: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    judge = [r for r in rows if r.get("loop") == "judge" and "queue_wait_s_mean" in r]
    trainer = [r for r in rows if r.get("loop") == "trainer" and "pg_loss" in r]
    last = judge[-1]
    first_wait, last_wait = quarter_mean(judge, "queue_wait_s_mean", 0), quarter_mean(judge, "queue_wait_s_mean", 3)
    unjudged = last["received"] - last["judged"]
    return {
        "users": None, "seconds": round(seconds), "reports": len(judge),
        "turns_received": last["received"], "turns_judged": last["judged"],
        "judged_per_s": round(last["judged"] / seconds, 2),
        "queue_wait_s_first_quarter": round(first_wait, 3), "queue_wait_s_last_quarter": round(last_wait, 3),
        "queue_wait_s_max_window": round(max(r["queue_wait_s_max"] for r in judge), 3),
        "backlog_max": max(r["backlog"] for r in judge), "judge_latency_s_mean": round(last["mean_latency_s"], 3),
        "hint_rate": round(last["hint_rate"], 3), "trainer_steps": len(trainer),
        "bounded": last_wait <= 2 * first_wait + 0.5 and unjudged <= 0.01 * max(last["received"], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--run-dir", default="runs/judge-keeps-up")
    args = ap.parse_args()
    run_dir = Path(args.run_dir)
    cmd = [sys.executable, "-m", "clawr1.cli", "run", "recipes/combined/cpu.yaml", f"run.dir={run_dir}", "--overwrite",
           f"rollout.concurrency={args.users}", "rollout.max_pool_backlog=0", "rollout.eval_every=0",
           "run.max_steps=1000000", "tracking.wandb_mode=disabled"]
    out_path = Path(tempfile.mkstemp(prefix="judge-keeps-up-", suffix=".out")[1])
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        while "[run] all loops up" not in out_path.read_text():  # the clock starts once every loop is up
            if proc.poll() is not None:
                raise SystemExit(f"the run did not start (exit {proc.returncode}):\n{out_path.read_text()[-3000:]}")
            time.sleep(1)
        started = time.monotonic()
        time.sleep(args.minutes * 60)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        seconds = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"run output: {out_path}", file=sys.stderr)
    result = summarize(REPO / run_dir if not run_dir.is_absolute() else run_dir, seconds)
    result["users"] = args.users
    print(json.dumps(result))
    return 0 if result["bounded"] else 1


if __name__ == "__main__":
    sys.exit(main())
