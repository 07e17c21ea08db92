"""clawr1's embedded engine against real SGLang 0.5.23 on this CPU: the same model, prompts and threads.

Prints one JSON line: for each engine (started as `clawr1 serve`, serve.backend embedded or sglang, float32, one
after the other, nothing else running), seconds from start to /health, generated tokens/s at 1 and 8 concurrent
requests (64 new tokens each, after a warm-up), and seconds of a weight update from disk (pause, flush, load,
continue: SyncEngineClient.update_weights_from_disk) of the model's own checkpoint; then SGLang's figures over
the embedded engine's.

Needs SGLang's environment (scripts/setup_sglang.sh). Usage:
  python benchmarks/sglang_cpu.py [--model smollm2-135m-instruct] [--threads 1] [--tokens 64] [--updates 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_real_model import cpu_name, decode_rates  # noqa: E402
from clawr1.devtools import REPO, LoopProcess, local_config  # noqa: E402
from clawr1.engine_api.client import SyncEngineClient  # noqa: E402
from clawr1.model_path import resolve_model_path  # noqa: E402

LEVELS = [1, 8]
QUESTION = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]


def prompt_ids(model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).apply_chat_template(QUESTION, add_generation_prompt=True,
                                                                       tokenize=True, return_dict=False)


def measure(backend: str, args, run_dir: Path) -> dict:
    overrides = [f"model.name={args.model}", f"serve.num_threads={args.threads}", "serve.dtype=float32",
                 f"serve.backend={backend}", f"serve.sglang.python={args.sglang_python}", "serve.sglang.dtype=float32"]
    cfg = local_config(run_dir, *overrides)
    t0 = time.perf_counter()
    engine = LoopProcess(cfg, "serve")
    try:
        engine.wait_http(f"{cfg.engine_url}/health", timeout=900)
        started = time.perf_counter() - t0
        model_dir = resolve_model_path(cfg.model)
        rates = decode_rates(cfg.engine_url, prompt_ids(model_dir), LEVELS, args.tokens)
        client = SyncEngineClient(cfg.engine_url, timeout_s=600)
        updates = []
        for version in range(1, args.updates + 1):
            t1 = time.perf_counter()
            client.update_weights_from_disk(str(model_dir), version)
            updates.append(time.perf_counter() - t1)
        assert client.weight_version() == args.updates
        client.close()
    finally:
        engine.stop()
    return {"startup_s": round(started, 1), **{f"tok_s_at_{n}": round(rates[str(n)], 2) for n in LEVELS},
            "update_s_median": round(statistics.median(updates), 3), "update_s": [round(u, 3) for u in updates]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each engine (the recipes' 1)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--updates", type=int, default=3, help="weight updates timed per engine")
    parser.add_argument("--sglang-python", default=str(REPO / ".venv-sglang" / "bin" / "python"))
    args = parser.parse_args()
    out = {"bench": "sglang_cpu", "cpu": cpu_name(), "model": args.model, "threads": args.threads,
           "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("embedded", "sglang"):
            out[backend] = measure(backend, args, Path(tmp) / backend)
    e, s = out["embedded"], out["sglang"]
    out["sglang_vs_embedded"] = {**{f"tok_s_at_{n}": round(s[f"tok_s_at_{n}"] / e[f"tok_s_at_{n}"], 3) for n in LEVELS},
                                 "update_s": round(s["update_s_median"] / e["update_s_median"], 3),
                                 "startup_s": round(s["startup_s"] / e["startup_s"], 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
