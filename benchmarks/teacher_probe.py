"""The teacher's quality for a model: hint uptake and signal quality per preference kind, for the given users.

    python benchmarks/teacher_probe.py [--profiles 0,1] [--n 96] [model.path=DIR ...]

Starts an engine and a gateway for the model (default: the tiny model, built if needed), runs
envs.personal.teacher_probe for each user profile, prints a markdown table per profile and one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.bench import serving_stack  # noqa: E402
from clawr1.chat_client import GatewayChat  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402


async def measure(url: str, profile_seed: int, n: int) -> dict:
    env = PersonalEnv({"profile_seed": profile_seed, "probe_teacher": True})
    chat = GatewayChat(url, None, "clawr1-policy", 48, 1.0)
    try:
        return {"profile": env.profile, **await env.evaluate(chat, n, f"probe-{profile_seed}")}
    finally:
        await chat.close()


def table(result: dict) -> str:
    lines = ["| kind | satisfied with the hint | uptake | AUC |", "|---|---|---|---|"]
    for kind in result["profile"]:
        a = result.get(f"auc_{kind}")
        lines.append(f"| {kind} ({result['profile'][kind]}) | {result[f'hinted_{kind}']:.2f} | "
                     f"{result[f'uptake_{kind}']:+.2f} | {'-' if a is None else f'{a:.2f}'} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default="0,1")
    p.add_argument("--n", type=int, default=96, help="held-out questions per profile")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.path=runs/x/weights/v000150")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, serving_stack(str(REPO / "recipes/combined/cpu.yaml"), args.overrides,
                                                             Path(tmp)) as url:
        for seed in (int(s) for s in args.profiles.split(",")):
            results[seed] = asyncio.run(measure(url, seed, args.n))
            print(f"profile {seed}: {results[seed]['profile']}\n{table(results[seed])}\n", flush=True)
    print(json.dumps({"benchmark": "teacher_probe", "n": args.n,
                      "profiles": {s: {k: v for k, v in r.items() if k != "profile"} for s, r in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
