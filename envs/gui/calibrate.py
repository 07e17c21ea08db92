"""Which MiniWoB++ oracles pass on every seed: a type belongs to `MINIWOB_SET` when its oracle passes all 20.

    python -m envs.gui.calibrate                      # every type with an oracle, 20 seeds
    python -m envs.gui.calibrate click-tab find-word --seeds 5

Prints a line per type as it finishes, then one JSON object: passes per type and the first failure's reason.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from clawr1.environment import EpisodeResult
from envs.gui.env import GuiEnv
from envs.gui.miniwob import MINIWOB_SET, ORACLES, miniwob_task

SEEDS = 20


async def play_seeds(env: GuiEnv, task_type: str, seeds: int) -> list[EpisodeResult]:
    tasks = [miniwob_task(task_type, seed) for seed in range(seeds)]
    return list(await asyncio.gather(*(env.run_task(env.scripted_agent("oracle"), t, f"calibrate-{t.id}")
                                       for t in tasks)))


def calibrate(types: list[str], seeds: int = SEEDS) -> dict[str, Any]:
    """Each type's oracle on seeds 0..seeds-1: how many passed, the first failure's reason, and the verdict."""
    env = GuiEnv({"tasks": "own"})
    try:
        out: dict[str, Any] = {}
        for task_type in types:
            results = asyncio.run(play_seeds(env, task_type, seeds))
            failures = [r for r in results if not r.passed]
            out[task_type] = {"passed": len(results) - len(failures), "of": seeds,
                              "in_set": task_type in MINIWOB_SET,
                              "first_failure": failures[0].details.get("reason", "") if failures else ""}
            print(task_type, out[task_type], flush=True)
        return out
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="task types (default: every one with an oracle)")
    parser.add_argument("--seeds", type=int, default=SEEDS)
    args = parser.parse_args()
    unknown = sorted(set(args.types) - set(ORACLES))
    if unknown:
        parser.error(f"no oracle for {', '.join(unknown)}; known: {', '.join(sorted(ORACLES))}")
    print(json.dumps(calibrate(args.types or sorted(ORACLES), args.seeds)))


if __name__ == "__main__":
    main()
