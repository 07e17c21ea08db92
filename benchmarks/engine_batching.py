"""Continuous batching: generated tokens/s of the embedded engine with 1 vs 16 concurrent requests.

Prints one JSON line with both throughputs and their ratio (goal: >= 4x).
Usage: python benchmarks/engine_batching.py [--tokens 64] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.devtools import LoopProcess, local_config  # noqa: E402
from clawr1.chat import ChatRenderer  # noqa: E402


async def burst(url: str, prompt: list[int], concurrency: int, tokens: int) -> float:
    """Tokens per second over `concurrency` requests sent at once."""
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(client.post(f"{url}/generate", json=body) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    generated = sum(len(r.json()["output_ids"]) for r in replies)
    return generated / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from clawr1.model_path import resolve_model_path

    with tempfile.TemporaryDirectory() as d:
        cfg = local_config(Path(d), "serve.max_running_requests=32")
        renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path(cfg.model)))
        prompt = renderer.encode_messages([{"role": "user", "content": "What is 3 km plus 4 km?"}])
        engine = LoopProcess(cfg, "serve")
        try:
            engine.wait_http(f"{cfg.engine_url}/health")
            asyncio.run(burst(cfg.engine_url, prompt, 4, 8))  # warm-up
            single, batched = [], []
            for _ in range(args.rounds):  # interleaved, so machine noise hits both alike
                single.append(asyncio.run(burst(cfg.engine_url, prompt, 1, args.tokens)))
                batched.append(asyncio.run(burst(cfg.engine_url, prompt, 16, args.tokens)))
        finally:
            engine.stop()
    one, sixteen = sorted(single)[len(single) // 2], sorted(batched)[len(batched) // 2]
    print(json.dumps({"benchmark": "engine_batching", "tokens_per_request": args.tokens, "rounds": args.rounds,
                      "tokens_per_s_1": round(one, 1), "tokens_per_s_16": round(sixteen, 1),
                      "ratio": round(sixteen / one, 2), "engine_threads": cfg.serve.num_threads}))


if __name__ == "__main__":
    main()
