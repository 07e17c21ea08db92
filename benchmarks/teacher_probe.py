"""The teacher's quality for a model: hint uptake and signal quality per preference kind, for the given users.

    python benchmarks/teacher_probe.py [--profiles 0,1] [--n 96] [model.path=DIR ...]
    python benchmarks/teacher_probe.py --base-url http://127.0.0.1:8000 [--profiles 0] [--reader free_text]
    python benchmarks/teacher_probe.py --phrasing free --hint user|directive   (the user's held-out words, or the
                                                                               directives the rules judge writes)

Starts an engine and a gateway for the model (default: the tiny model, built if needed), or uses a running
clawr1 gateway (--base-url; it scores through its /v1/score), runs envs.personal.teacher_probe for each user
profile, prints a markdown table per profile and one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from clawr1.agent_bench import serving_stack  # noqa: E402
from clawr1.chat_client import GatewayChat  # noqa: E402
from envs.personal.env import PersonalEnv  # noqa: E402


async def measure(url: str, profile_seed: int, n: int, reader: str = "exact", max_tokens: int = 48,
                  phrasing: str = "canonical", hint: str = "user", timeout_s: float = 900.0,
                  signal: bool = True) -> dict:
    """The probe's results for one user (`signal`: the AUCs as well as the uptake); a request may wait
    `timeout_s` (a real model on 2 shared cores queues)."""
    env = PersonalEnv({"profile_seed": profile_seed, "probe_teacher": True, "reader": reader, "phrasing": phrasing,
                       "probe_hint": hint, "probe_signal": signal})
    chat = GatewayChat(url, None, "clawr1-policy", max_tokens, 1.0, timeout_s=timeout_s)
    try:
        return {"profile": env.profile, **await env.evaluate(chat, n, f"probe-{profile_seed}")}
    finally:
        await chat.close()


def table(result: dict) -> str:
    lines = ["| kind | satisfied without the hint | with the hint | uptake | AUC |", "|---|---|---|---|---|"]
    for kind in result["profile"]:
        a, hinted = result.get(f"auc_{kind}"), result[f"hinted_{kind}"]
        lines.append(f"| {kind} ({result['profile'][kind]}) | {hinted - result[f'uptake_{kind}']:.2f} | {hinted:.2f} | "
                     f"{result[f'uptake_{kind}']:+.2f} | {'-' if a is None else f'{a:.2f}'} |")
    return "\n".join(lines)


def gateway(base_url: str, overrides: list[str], run_dir: Path) -> AbstractContextManager[str]:
    """The running gateway at `base_url`, or a serving stack of the recipe started in `run_dir`."""
    if base_url:
        return nullcontext(base_url.rstrip("/").removesuffix("/v1"))
    return serving_stack(str(REPO / "recipes/combined/cpu.yaml"), overrides, run_dir)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default="0,1")
    p.add_argument("--n", type=int, default=96, help="held-out questions per profile")
    p.add_argument("--base-url", default="", help="a running clawr1 gateway, e.g. http://127.0.0.1:8000; "
                                                 "default: start one for the model")
    p.add_argument("--reader", default="exact", help="how answers are read: exact (the tiny model) or free_text")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--phrasing", choices=("canonical", "free"), default="canonical",
                   help="how the user words wishes: the warm start's directives, or held-out free wordings")
    p.add_argument("--hint", choices=("user", "directive"), default="user",
                   help="the teacher's hint: the wishes in the user's words, or as the canonical directives")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model.path=runs/x/weights/v000150")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp, gateway(args.base_url, args.overrides, Path(tmp)) as url:
        for seed in (int(s) for s in args.profiles.split(",")):
            results[seed] = asyncio.run(measure(url, seed, args.n, args.reader, args.max_tokens, args.phrasing,
                                                args.hint))
            print(f"profile {seed}: {results[seed]['profile']}\n{table(results[seed])}\n", flush=True)
    print(json.dumps({"benchmark": "teacher_probe", "n": args.n, "phrasing": args.phrasing, "hint": args.hint,
                      "profiles": {s: {k: v for k, v in r.items() if k != "profile"} for s, r in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
