"""A Qwen3-0.6B-shaped model (random weights) served by the embedded engine with its default settings.

    python benchmarks/token_pool.py [--requests 40] [--max-tokens 64]

Every request's whole context (32 requests x 4,096 tokens, 28 layers x 8 KV heads x 128) would need 28 GiB of KV
cache, which a 24 GiB machine refused. The token pool takes what the budget leaves beside the weights. This builds
the model (transformers' Qwen3 of that shape, random weights, the tiny model's Qwen3 tokenizer) in a temporary
directory, starts `clawr1 serve` with no serve.* override, sends `--requests` generations at once, and prints one
JSON line: the pool, the engine's resident memory, how many requests waited and whether any failed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN3_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                 tie_word_embeddings=True)


def build(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from clawr1.config import ModelConfig
    from clawr1.model_path import resolve_model_path

    tiny = resolve_model_path(ModelConfig())  # for its Qwen3 tokenizer and chat template
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_06B), dtype=torch.float32)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    return out


def rss_gib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


async def generate_all(url: str, pid: int, n: int, max_tokens: int) -> dict:
    """`n` generations sent at once; how many succeeded, and the most requests seen waiting, the fewest free pool
    tokens and the engine's peak resident memory, polled meanwhile."""
    import httpx

    seen = {"most_waiting": 0, "fewest_free_pool_tokens": None, "engine_peak_rss_gib": 0.0}
    async with httpx.AsyncClient(timeout=3600) as client:
        sent = [asyncio.create_task(client.post(f"{url}/generate", json={
            "input_ids": list(range(100, 164)), "sampling_params": {"max_new_tokens": max_tokens, "temperature": 1.0,
                                                                    "ignore_eos": True}})) for _ in range(n)]
        while not all(t.done() for t in sent):
            gauges = _gauges((await client.get(f"{url}/metrics")).text)
            seen["most_waiting"] = max(seen["most_waiting"], gauges["clawr1_engine_waiting_requests"])
            free = gauges["clawr1_engine_kv_pool_free_tokens"]
            fewest = seen["fewest_free_pool_tokens"]
            seen["fewest_free_pool_tokens"] = free if fewest is None else min(free, fewest)
            seen["engine_peak_rss_gib"] = round(max(seen["engine_peak_rss_gib"], rss_gib(pid)), 2)
            await asyncio.sleep(0.5)
        codes = [(await t).status_code for t in sent]
    return {"ok": sum(c == 200 for c in codes), "failed": sum(c != 200 for c in codes), **seen}


def _gauges(text: str) -> dict[str, int]:
    return {line.split()[0]: int(float(line.split()[1])) for line in text.splitlines() if not line.startswith("#")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40, help="sent at once (more than serve.max_running_requests)")
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    import httpx

    from clawr1.config import load_config, save_config

    from clawr1.ports import assign_free_ports
    from clawr1.runtime import start_process, stop_processes, wait_http

    with tempfile.TemporaryDirectory(prefix="token-pool-") as tmp:
        started = time.monotonic()
        model = build(Path(tmp) / "qwen3-0.6b-shape")
        print(f"[token_pool] built the model in {time.monotonic() - started:.0f} s", file=sys.stderr)
        run_dir = Path(tmp) / "run"
        cfg = assign_free_ports(load_config(str(REPO / "recipes/live/cpu.yaml"),
                                            [f"model.path={model}", f"run.dir={run_dir}"]))
        run_dir.mkdir()
        save_config(cfg, run_dir / "config.yaml")
        proc = start_process([sys.executable, "-m", "clawr1.cli", "serve", "--config", str(run_dir / "config.yaml")],
                             run_dir / "serve.log")
        try:
            wait_http(f"{cfg.engine_url}/health", proc, 600)
            info = httpx.get(f"{cfg.engine_url}/get_server_info", timeout=30).json()
            t0 = time.monotonic()
            seen = asyncio.run(generate_all(cfg.engine_url, proc.pid, args.requests, args.max_tokens))
            wall = time.monotonic() - t0
        finally:
            stop_processes([proc], 30)
        log = (run_dir / "serve.log").read_text()
    plan = next((line for line in log.splitlines() if "KV pool" in line), "")
    print(json.dumps({"benchmark": "token_pool", "model": "Qwen3-0.6B shape, random weights, fp32",
                      "serve_overrides": "none", "engine_log": plan.split("] ")[-1],
                      "max_total_num_tokens": info.get("max_total_num_tokens"),
                      "max_running_requests": info.get("max_running_requests"),
                      "context_length": info.get("context_length"), "requests": args.requests, **seen,
                      "wall_s": round(wall, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
