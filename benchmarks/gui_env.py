"""The GUI environment's speed and memory: one step (action + observation), a reset, 4 episodes at once.

    python benchmarks/gui_env.py [--steps 60] [--resets 20] [--browser PATH] [--baseline REV [--rounds 3]]

On the project's own login task (envs/gui/tasks.py) in the sandboxed headless browser: a reset is
opening an episode (a fresh context, the start page, the first observation); a step is one `fill` or
`click` through `GuiWorld.call` with the new observation. Memory is the proportional set size (PSS)
of the browser's processes (Playwright's driver, bwrap, Chromium) with 4 episodes open, beside this
process's own RSS. Prints one JSON line. Goals (2 cores): step p50 <= 150 ms, p95 <= 400 ms, reset
p50 <= 300 ms, <= 600 MB for 4 episodes.

With `--baseline REV` it measures this tree and REV (a git revision, checked out in a temporary worktree)
in alternating rounds under the same load, and prints each one's medians over the rounds and their ratios
(this / baseline): a change to the environment is held to "within 10%" that way.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from envs.gui.env import GuiEnv  # noqa: E402
from envs.gui.tasks import own_tasks  # noqa: E402
from envs.gui.task import Target, find_element  # noqa: E402
from envs.gui.world import GuiWorld  # noqa: E402

GOALS = {"step_p50_ms": 150, "step_p95_ms": 400, "reset_p50_ms": 300, "memory_4_episodes_mb": 600}


def pss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
        except OSError:
            continue  # a process that ended meanwhile
    return total_kb / 1024


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(steps: int, resets: int, browser: str = "") -> dict:
    env = GuiEnv({"tasks": "own", "browser": browser})
    host = env.host()
    task = next(t for t in own_tasks() if t.id == "own/login")
    try:
        GuiWorld(host, task).open().close()  # warm-up: the first page of a new browser is slower
        reset_s = []
        for _ in range(resets):
            t0 = time.perf_counter()
            world = GuiWorld(host, task).open()
            reset_s.append(time.perf_counter() - t0)
            world.close()
        step_s = []
        with_world = GuiWorld(host, task).open()
        for i in range(steps):
            box = find_element(with_world.observation, Target("textbox", "Username"))
            t0 = time.perf_counter()
            with_world.call("fill", json.dumps({"id": box, "text": f"user {i}"}))
            step_s.append(time.perf_counter() - t0)
        with_world.close()
        open_worlds = [GuiWorld(host, task).open() for _ in range(4)]
        memory = pss_mb(host.processes())
        for world in open_worlds:
            world.close()
    finally:
        env.close()
    result = {"benchmark": "gui_env", "browser": host.chromium, "steps": steps, "resets": resets,
              "step_p50_ms": round(1000 * statistics.median(step_s), 1),
              "step_p95_ms": round(1000 * percentile(step_s, 0.95), 1),
              "reset_p50_ms": round(1000 * statistics.median(reset_s), 1),
              "memory_4_episodes_mb": round(memory, 1), "env_process_rss_mb": round(rss_mb(), 1)}
    result["goals_met"] = {k: result[k] <= goal for k, goal in GOALS.items()}
    return result


TIMES = ("step_p50_ms", "step_p95_ms", "reset_p50_ms", "memory_4_episodes_mb")


def _run(root: Path, steps: int, resets: int, browser: str) -> dict:
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "gui_env.py"), "--steps", str(steps),
                          "--resets", str(resets), "--browser", browser], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"gui_env.py in {root} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(rev: str, rounds: int, steps: int, resets: int, browser: str = "") -> dict:
    """This tree against `rev`, round by round (baseline first, then this), each in its own process."""
    runs: dict[str, list[dict]] = {"baseline": [], "this": []}
    with tempfile.TemporaryDirectory(prefix="gui-env-baseline-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=REPO, check=True,
                       capture_output=True)
        try:
            for k in range(rounds):
                for name, root in (("baseline", tree), ("this", REPO)):
                    runs[name].append(_run(root, steps, resets, browser))
                    print(f"round {k + 1}/{rounds} {name}: " + json.dumps({t: runs[name][-1][t] for t in TIMES}),
                          file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
    medians = {name: {t: statistics.median(r[t] for r in results) for t in TIMES} for name, results in runs.items()}
    ratio = {t: round(medians["this"][t] / medians["baseline"][t], 3) for t in TIMES}
    return {"benchmark": "gui_env_vs_baseline", "baseline_rev": rev, "rounds": rounds, "steps": steps, "resets": resets,
            **{name: m for name, m in medians.items()}, "ratio": ratio,
            "within_10_percent": {t: ratio[t] <= 1.10 for t in TIMES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--browser", default="", help="the Chromium to drive (default: the env's first found)")
    parser.add_argument("--baseline", default="", help="a git revision to measure against, round by round")
    parser.add_argument("--rounds", type=int, default=3, help="with --baseline: rounds of each")
    args = parser.parse_args()
    if args.baseline:
        print(json.dumps(compare(args.baseline, args.rounds, args.steps, args.resets, args.browser)), flush=True)
    else:
        print(json.dumps(measure(args.steps, args.resets, args.browser)), flush=True)


if __name__ == "__main__":
    main()
