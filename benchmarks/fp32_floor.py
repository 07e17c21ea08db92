"""How far fp32 log-probs of sampled tokens can agree on a real model: the embedded engine against HF, next to
HF against itself.

For each prompt, the embedded engine (`clawr1.serving.engine.Engine`, in this process) samples a completion
with its decode-time log-probs. The same tokens are then scored by HF `transformers`:
- one full forward in fp32 (what the trainer's check uses as "the HF log-probs");
- token by token with HF's own KV cache in fp32 (the way any decoding engine computes them);
- one full forward in fp64 (exact arithmetic, near enough).
Each figure is the largest |difference| over the completion's tokens. `hf_cached_vs_hf_full` is the floor: HF
decoding with its own cache disagrees with its own full forward by that much, so no KV-cache engine can be held
to less in fp32.

Usage: python benchmarks/fp32_floor.py [--model smollm2-135m-instruct | --model PATH] [--tokens 48]
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clawr1.config import ModelConfig  # noqa: E402
from clawr1.model_path import resolve_model_path  # noqa: E402
from clawr1.serving.engine import Engine, GenerateRequest, SamplingParams  # noqa: E402

PROMPTS = (
    "What is 39 L plus 56 L? Answer briefly.",
    "Tell me a short story about a cat.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers above 50.",
)


def engine_sample(engine: Engine, prompt_ids: list[int], tokens: int, seed: int) -> tuple[list[int], list[float]]:
    """A completion of exactly `tokens` tokens and the engine's log-probs for them."""
    done, out = threading.Event(), {}

    def on_event(event: dict) -> None:
        if event["type"] == "done":
            out.update(event)
            done.set()

    params = SamplingParams(max_new_tokens=tokens, temperature=1.0, ignore_eos=True, sampling_seed=seed)
    engine.submit(GenerateRequest(prompt_ids, params, return_logprob=True), on_event)
    done.wait(600)
    pairs = out["meta_info"]["output_token_logprobs"]
    return [t for _, t, _ in pairs], [lp for lp, _, _ in pairs]


@torch.no_grad()
def full_forward(model, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    logits = model(torch.tensor([prompt_ids + output_ids])).logits[0, len(prompt_ids) - 1:-1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp.gather(1, torch.tensor(output_ids)[:, None])[:, 0].tolist()


@torch.no_grad()
def cached_decode(model, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    out = model(torch.tensor([prompt_ids]), use_cache=True)
    values = []
    for token in output_ids:
        values.append(float(torch.log_softmax(out.logits[0, -1], dim=-1)[token]))
        out = model(torch.tensor([[token]]), cache=out.past_key_values, use_cache=True)
    return values


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a model directory or a `clawr1 model get` name")
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    model_cfg = ModelConfig(path=args.model) if Path(args.model).is_dir() else ModelConfig(name=args.model)
    model_dir = resolve_model_path(model_cfg)

    engine = Engine(model_dir, max_running=1, max_context=1024)
    model32 = engine.model.eval()
    gaps: dict[str, list[float]] = {"engine_vs_hf_full": [], "hf_cached_vs_hf_full": [], "hf_full_vs_fp64": []}
    samples = []
    try:
        for seed, prompt in enumerate(PROMPTS):
            text = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                        add_generation_prompt=True)
            prompt_ids = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
            output_ids, engine_lps = engine_sample(engine, prompt_ids, args.tokens, seed)
            samples.append((prompt_ids, output_ids, engine_lps))
    finally:
        engine.stop()
    full32 = [full_forward(model32, prompt_ids, output_ids) for prompt_ids, output_ids, _ in samples]
    for (prompt_ids, output_ids, engine_lps), hf in zip(samples, full32):
        gaps["engine_vs_hf_full"].append(max_gap(engine_lps, hf))
        gaps["hf_cached_vs_hf_full"].append(max_gap(cached_decode(model32, prompt_ids, output_ids), hf))
    model64 = model32.double()
    for (prompt_ids, output_ids, _), hf in zip(samples, full32):
        gaps["hf_full_vs_fp64"].append(max_gap(hf, full_forward(model64, prompt_ids, output_ids)))
    print(json.dumps({"model": model_dir.name, "prompts": len(PROMPTS), "tokens": args.tokens,
                      **{k: [float(f"{v:.3g}") for v in vals] for k, vals in gaps.items()},
                      **{f"{k}_median": float(f"{statistics.median(vals):.3g}") for k, vals in gaps.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
