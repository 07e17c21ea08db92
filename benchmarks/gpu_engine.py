"""The embedded engine's generation speed (issue 64): tokens/s at 1, 4, 32 and 128 concurrent requests for each decode
path, the plain one first, all in one run.

Paths (`serve.decode_attention`, `serve.decode_cuda_graph`):
  gather   the plain step: keys and values copied out of the paged pool, SDPA with a mask (the baseline)
  paged    one Triton kernel reads the pool in place (clawr1/serving/paged_attention.py)
  graphs   paged, each step replayed from a CUDA graph of its batch-size bucket (CUDA only)
  counter  graphs, and each token's random number hashed on the GPU for the whole batch (`serve.sampler: counter`)
           instead of drawn from each request's host generator (CUDA only)

Each path is a fresh in-process `Engine` on random weights of Qwen2.5-0.5B's shape (bf16, CUDA; with --device cpu
the tiny shape in fp32, where paged runs only under TRITON_INTERPRET=1 and graphs never). For each concurrency,
that many requests of --prompt-tokens random ids are submitted at once, each generating --new-tokens with
ignore_eos: generated tokens/s over the burst, and ms per decode step. One JSON line is printed last (also
$OUT/gpu_engine.json); a path or burst that fails reports its error and the rest still run.

Usage:
  python benchmarks/gpu_engine.py --tokenizer-dir .whl/tokenizer-qwen3      # CUDA
  python benchmarks/gpu_engine.py --device cpu --concurrency 1,4           # CPU (tests/benchmarks)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.gpu_trainer import SHAPES, stop_on_sigterm  # noqa: E402
from benchmarks.guarded import error_result, guarded  # noqa: E402

PATHS = {"gather": dict(decode_attention="gather"), "paged": dict(decode_attention="paged"),
         "graphs": dict(decode_attention="paged", decode_cuda_graph=True),
         "counter": dict(decode_attention="paged", decode_cuda_graph=True, sampler="counter")}


def log(msg: str) -> None:
    print(f"[gpu_engine] {msg}", file=sys.stderr, flush=True)


def write_model(out: Path, shape: str, tokenizer_dir: Path, dtype) -> Path:
    """Random weights of `shape` (benchmarks/gpu_trainer.SHAPES) with the tokenizer files of `tokenizer_dir`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6,
                         rms_norm_eps=1e-6)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


def burst(engine, concurrency: int, prompt_tokens: int, new_tokens: int, vocab: int, seed: int) -> dict:
    """`concurrency` requests submitted at once; tokens/s until the last one is done."""
    import torch

    from clawr1.serving.engine import GenerateRequest, SamplingParams

    generator = torch.Generator().manual_seed(seed)
    done, lock, finished, generated = threading.Event(), threading.Lock(), [0], [0]

    def on_event(event: dict) -> None:
        if event["type"] != "done":
            return
        with lock:
            finished[0] += 1
            generated[0] += len(event.get("output_ids") or [])
            if finished[0] == concurrency:
                done.set()

    steps0, t0 = engine.steps, time.perf_counter()
    for _ in range(concurrency):
        ids = torch.randint(0, vocab, (prompt_tokens,), generator=generator).tolist()
        params = SamplingParams.from_dict({"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 1.0})
        engine.submit(GenerateRequest(input_ids=ids, params=params), on_event)
    if not done.wait(timeout=600):
        raise TimeoutError(f"{finished[0]} of {concurrency} requests done after 600 s")
    seconds, steps = time.perf_counter() - t0, engine.steps - steps0
    return {"ok": generated[0] == concurrency * new_tokens, "tokens": generated[0], "seconds": round(seconds, 3),
            "tokens_per_s": round(generated[0] / seconds, 1), "steps": steps,
            "ms_per_step": round(1e3 * seconds / max(steps, 1), 2)}


def run_path(name: str, model: Path, args, dtype: str, vocab: int) -> dict:
    from clawr1.serving.engine import Engine

    t0 = time.perf_counter()
    engine = Engine(model, dtype=dtype, max_running=max(args.concurrency), device=args.device,
                    max_context=args.prompt_tokens + args.new_tokens + 16, **PATHS[name])
    res: dict = {"start_s": round(time.perf_counter() - t0, 2)}
    try:
        burst(engine, 1, args.prompt_tokens, 4, vocab, seed=1)  # warm: the first kernels compile
        for c in args.concurrency:
            res[str(c)], _ = guarded(lambda: burst(engine, c, args.prompt_tokens, args.new_tokens, vocab, seed=c))
            log(f"{name} x{c}: {json.dumps(res[str(c)])[:300]}")
    finally:
        engine.stop()
    res["ok"] = all(res[str(c)].get("ok") for c in args.concurrency)
    return res


def run(args, result: dict) -> dict:
    """Fills `result` path by path (a run stopped half way still reports the paths it measured)."""
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        return {**result, "ok": False, "error": "no CUDA device here; run --device cpu"}
    dtype = "bfloat16" if cuda else "float32"
    shape = args.shape or ("0.5b" if cuda else "tiny")
    result.update({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                   "dtype": dtype, "shape": shape, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                   "concurrency": args.concurrency, "baseline": "gather", "paths": {}})
    with tempfile.TemporaryDirectory(prefix="gpu_engine-") as tmp:
        model = write_model(Path(tmp) / shape, shape, args.tokenizer_dir, getattr(torch, dtype))
        for name in args.paths:
            res, seconds = guarded(lambda: run_path(name, model, args, dtype, SHAPES[shape]["vocab_size"]))
            result["paths"][name] = {**res, "seconds": round(seconds, 1)}
            write_out(result)
    base = result["paths"].get("gather", {})
    result["speedup"] = {name: {c: round(res[c]["tokens_per_s"] / base[c]["tokens_per_s"], 3)
                                for c in map(str, args.concurrency)
                                if "tokens_per_s" in res.get(c, {}) and "tokens_per_s" in base.get(c, {})}
                         for name, res in result["paths"].items() if name != "gather"}
    result["ok"] = all(res.get("ok") for res in result["paths"].values())
    return result


def write_out(result: dict) -> None:
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_engine.json").write_text(json.dumps(result, default=str) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--shape", default=None, help="a shape of benchmarks/gpu_trainer.SHAPES (default: 0.5b on CUDA, "
                                                  "tiny on CPU)")
    ap.add_argument("--paths", default=None, help="comma-separated of gather,paged,graphs,counter (default: all four "
                                                  "on CUDA, gather on CPU)")
    ap.add_argument("--concurrency", default=None, help="default: 1,4,32,128 on CUDA, 1,4 on CPU")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=None, help="default: 128 on CUDA, 16 on CPU")
    ap.add_argument("--tokenizer-dir", type=Path, default=None, help="tokenizer.json and tokenizer_config.json "
                    "(default: Qwen3's from npm, clawr1/tokenizer_packages.py)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if not cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    args.paths = (args.paths or ("gather,paged,graphs,counter" if cuda else "gather")).split(",")
    args.concurrency = [int(c) for c in (args.concurrency or ("1,4,32,128" if cuda else "1,4")).split(",")]
    args.new_tokens = args.new_tokens or (128 if cuda else 16)
    if args.tokenizer_dir is None:
        from clawr1.tokenizer_packages import tokenizer_dir

        args.tokenizer_dir = tokenizer_dir("qwen3")
    stop_on_sigterm()
    t0 = time.monotonic()
    result: dict = {"benchmark": "gpu_engine", "ok": False}
    try:
        result = run(args, result)
    except BaseException as e:  # noqa: BLE001 (the JSON line is printed whatever happened)
        result.update(error_result(e))
    result["seconds"] = round(time.monotonic() - t0, 1)
    write_out(result)
    print(json.dumps(result, default=str), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
