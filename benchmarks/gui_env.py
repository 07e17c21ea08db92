"""The GUI environment's speed and memory: one step (action + observation), a reset, 4 episodes at once.

    python benchmarks/gui_env.py [--steps 60] [--resets 20] [--browser PATH]

On the project's own login task (envs/gui/tasks.py) in the sandboxed headless browser: a reset is
opening an episode (a fresh context, the start page, the first observation); a step is one `fill` or
`click` through `GuiWorld.call` with the new observation. Memory is the proportional set size (PSS)
of the browser's processes (Playwright's driver, bwrap, Chromium) with 4 episodes open, beside this
process's own RSS. Prints one JSON line. Goals (2 cores): step p50 <= 150 ms, p95 <= 400 ms, reset
p50 <= 300 ms, <= 600 MB for 4 episodes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--resets", type=int, default=20)
    parser.add_argument("--browser", default="", help="the Chromium to drive (default: the env's first found)")
    args = parser.parse_args()
    print(json.dumps(measure(args.steps, args.resets, args.browser)), flush=True)


if __name__ == "__main__":
    main()
