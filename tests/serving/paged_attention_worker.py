"""Run under Triton's CPU interpreter (tests/serving/test_paged_attention.py): the paged decode-attention kernel
against attention computed from a dense copy, then the tiny model's decode steps with serve.decode_attention=paged
against gather. Exits 0 when every comparison holds.

Usage: python -m tests.serving.paged_attention_worker MODEL_DIR
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from clawr1.serving.model_runner import PAGE_TOKENS, ModelRunner, TokenPool
from clawr1.serving.paged_attention import paged_decode_attention
from tests.numerics import assert_as_exact_as, assert_close, forward_depth

torch.manual_seed(0)


def dense_attention(q, keys, values, index, lengths):
    """The gather path's math: each request's positions copied out, masked past its length, SDPA."""
    ks, vs = keys[index].transpose(1, 2), values[index].transpose(1, 2)  # [B, kv_heads, L, hd]
    visible = torch.arange(index.shape[1])[None, :] < lengths[:, None]
    return F.scaled_dot_product_attention(q[:, :, None], ks, vs, attn_mask=visible[:, None, None, :],
                                          enable_gqa=True)[:, :, 0]


def check_kernel() -> None:
    """Requests of 1, 15, 16, 17 and 70 positions on pages scattered through the pool (taken and released in
    between), 6 query heads over 2 kv heads, head_dim 24 (not a power of 2)."""
    heads, kv_heads, hd = 6, 2, 24
    pool = TokenPool(layers=1, slots=8, tokens=16 * 40, kv_heads=kv_heads, head_dim=hd, dtype=torch.float64)
    lengths = [1, 15, 16, 17, 70]
    slots = []
    for n in lengths:
        pool.release(pool.take(40))  # pages handed out and back: the next slot's pages are not in order
        slots.append(pool.take(n))
    pool.keys[0].normal_()
    pool.values[0].normal_()
    q = torch.randn(len(slots), heads, hd, dtype=torch.float64)
    longest = max(lengths)
    index = torch.stack([torch.cat([pool.positions[s][:n], pool.positions[s][:1].expand(longest - n)])
                         for s, n in zip(slots, lengths)])
    lens = torch.tensor(lengths)
    table = pool.page_table[torch.tensor(slots)]
    exact = dense_attention(q, pool.keys[0], pool.values[0], index, lens)
    honest = dense_attention(q.float(), pool.keys[0].float(), pool.values[0].float(), index, lens)
    got = paged_decode_attention(q.float(), pool.keys[0].float().contiguous(), pool.values[0].float().contiguous(),
                                 table, lens.to(torch.int32), PAGE_TOKENS, hd ** -0.5)
    assert_as_exact_as(got, exact, honest, torch.float32, what="paged decode attention fp32")
    print("[paged_worker] kernel: as exact as SDPA on a dense copy", flush=True)


def check_runner(model_dir: str) -> None:
    """Three requests of different prompt lengths, prefilled, then 20 decode steps fed the same tokens: the paged
    runner's hidden states are the gather runner's, up to the rounding of another attention sum."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    runners = {kind: ModelRunner(model, slots=4, pool_tokens=16 * 24, decode_attention=kind)
               for kind in ("gather", "paged")}
    prompts = [[5, 9, 14], list(range(3, 40)), [7] * 16]
    slots = {kind: [r.cache.take(len(p) + 21) for p in prompts] for kind, r in runners.items()}
    tokens = []
    for kind, runner in runners.items():
        last = [runner.prefill(torch.tensor(p), s)[-1] for p, s in zip(prompts, slots[kind])]
        tokens = [int(runner.logits(h[None]).argmax()) for h in last]
    generator = torch.Generator().manual_seed(1)
    depth = forward_depth(model_dir)
    for step in range(20):
        feed = torch.tensor(tokens)
        hidden = {kind: r.decode(feed, slots[kind]) for kind, r in runners.items()}
        assert_close(hidden["paged"], hidden["gather"], torch.float32, depth, what=f"decode step {step}")
        tokens = torch.randint(0, model.config.vocab_size, (len(prompts),), generator=generator).tolist()
    print("[paged_worker] runner: 20 decode steps of 3 requests equal gather's", flush=True)


if __name__ == "__main__":
    check_kernel()
    check_runner(sys.argv[1])
