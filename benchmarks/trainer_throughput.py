"""Trainer step throughput vs a plain transformers + torch step, and log-prob peak memory vs response length.

Prints one JSON line:
  tokens_per_s            our Megatron trainer step (packed THD micro-batches, chunked log-probs)
  baseline_tokens_per_s   the same model, data and loss as a padded transformers forward + torch AdamW
  ratio                   ours / baseline (goal on CPU: >= 1.0)
  logprob_peak_mb         peak memory of the log-prob forward+backward at a fixed token budget, per response length
  logprob_peak_growth     peak at the longest response / peak at the shortest (goal: <= 1.2)

Usage: python benchmarks/trainer_throughput.py [--steps 5] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.trainer_speed import measure_steps, speed_figures  # noqa: E402
from clawr1.config import AlgoConfig, ModelConfig, TrainerConfig  # noqa: E402
from clawr1.protocol import Sample  # noqa: E402


def mixed_batch(n: int, vocab: int, seed: int, lo: int = 16, hi: int = 512) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(lo, hi)
        p = max(1, length // 4)
        r = length - p
        out.append(Sample(sample_id=str(i), group_id=str(i), tokens=[rng.randrange(vocab) for _ in range(length)],
                          prompt_len=p, loss_mask=[1] * r, rollout_logprobs=[-rng.random() * 4 for _ in range(r)],
                          versions=[0] * r, reward=rng.choice([1.0, -1.0]),
                          teacher_logprobs=[-rng.random() * 4 for _ in range(r)] if i % 2 else None))
    return out


# ---------------------------------------------------------------- baseline: plain transformers + torch
def baseline_step(model, optimizer, samples: list[Sample], algo: AlgoConfig, pad_id: int) -> None:
    """Pad to the longest sample, full logits, the same combined-advantage PPO loss, AdamW."""
    width = max(len(s.tokens) for s in samples)
    ids = torch.full((len(samples), width), pad_id)
    attn = torch.zeros(len(samples), width, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
        attn[i, : len(s.tokens)] = 1
    logp_all = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), -1)
    total = sum(sum(s.loss_mask) for s in samples)
    loss = 0.0
    for i, s in enumerate(samples):
        pos = torch.arange(s.prompt_len - 1, len(s.tokens) - 1)
        logp = logp_all[i, pos].gather(1, torch.tensor(s.tokens[s.prompt_len:])[:, None])[:, 0]
        old = logp.detach()
        adv = algo.w_rl * (s.reward or 0.0) + (algo.w_opd * (torch.tensor(s.teacher_logprobs) - old)
                                                if s.teacher_logprobs is not None else 0.0)
        ratio = torch.exp(logp - old)
        token_loss = -torch.minimum(ratio * adv, ratio.clamp(1 - algo.eps_clip_low, 1 + algo.eps_clip_high) * adv)
        loss = loss + token_loss.sum() / total
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def throughput(steps: int, threads: int) -> dict:
    from transformers import AutoModelForCausalLM

    from clawr1.model_path import resolve_model_path
    from clawr1.trainer.megatron_setup import init_parallel
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.optim import TorchAdamW
    from clawr1.trainer.step import train_step

    torch.set_num_threads(threads)
    path = resolve_model_path(ModelConfig())
    init_parallel(tp=1, seed=0)
    policy = build_policy(path)
    ours_opt = TorchAdamW(policy.model.parameters(), TrainerConfig(lr=1e-5), total_steps=1000, tp=1, dp=1)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    hf.train()
    hf_opt = torch.optim.AdamW(hf.parameters(), lr=1e-5)
    algo = AlgoConfig()
    batches = [mixed_batch(16, hf.config.vocab_size, seed) for seed in range(steps + 1)]
    timed = measure_steps({  # interleaved batch by batch, batch 0 warming both up
        "ours": lambda batch: train_step(policy, ours_opt, batch, algo, max_tokens_per_microbatch=4096),
        "baseline": lambda batch: baseline_step(hf, hf_opt, batch, algo, hf.config.pad_token_id or 0),
    }, batches, synchronize=lambda: None)
    ours, base = (speed_figures(timed[name])["tokens_per_s"] for name in ("ours", "baseline"))
    return {"tokens_per_s": round(ours, 1), "baseline_tokens_per_s": round(base, 1), "ratio": round(ours / base, 3),
            "batch": "16 samples, lengths 16..512", "steps": steps, "threads": threads}


# ---------------------------------------------------------------- log-prob peak memory (one process per case)
def memory_case(response_len: int, budget: int, vocab: int) -> None:
    """Forward + backward of the chunked log-probs for one micro-batch of `budget` tokens; prints peak MB."""
    import tempfile

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from benchmarks.peakmem import peak_mb
    from clawr1.trainer.megatron_setup import init_parallel
    from clawr1.trainer.model import build_policy, pack, packed_logprobs_entropy

    torch.set_num_threads(2)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        Qwen2ForCausalLM(cfg).save_pretrained(d)
        init_parallel(tp=1, seed=0)
        policy = build_policy(d)
    prompt = 32
    per_sample = prompt + response_len
    n = max(1, budget // per_sample)
    rng = random.Random(0)
    packed = pack([[rng.randrange(vocab) for _ in range(per_sample)] for _ in range(n)], [prompt] * n)

    def work() -> None:
        logp, ent, _ = packed_logprobs_entropy(policy, packed, chunk_tokens=512)
        (logp.sum() + ent.sum()).backward()

    print(json.dumps({"response_len": response_len, "samples": n, "peak_mb": peak_mb(work)}))


def memory(lengths: list[int], budget: int, vocab: int) -> dict:
    from benchmarks.peakmem import run_case

    out = {str(n): run_case(__file__, str(n), str(budget), str(vocab))["peak_mb"] for n in lengths}
    return {"logprob_peak_mb": out, "logprob_budget_tokens": budget, "logprob_vocab": vocab,
            "logprob_peak_growth": round(out[str(lengths[-1])] / out[str(lengths[0])], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--case", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        memory_case(*args.case)
        return
    result = {"benchmark": "trainer_throughput", **throughput(args.steps, args.threads),
              **memory([256, 512, 1024, 2048], budget=4096, vocab=32768)}
    print(json.dumps(result))


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    main()
