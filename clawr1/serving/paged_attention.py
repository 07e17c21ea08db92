"""Decode attention read straight from the paged KV pool, in one Triton kernel (`serve.decode_attention: paged`).

The plain decode step (`ModelRunner.decode`) gathers every running request's keys and values into a dense
[batch, longest, kv_heads, head_dim] copy per layer, then calls SDPA with a mask. That copy grows with the batch
and the longest request, and building its index is Python work per request. Here one program per (request,
head) walks the request's own pages in the pool's page table, with an online softmax in fp32 (flash-decoding
without the split): no copy, no mask, nothing per request on the host, and the same shapes at every step, so
the step can be captured in a CUDA graph.

Needs triton; on a CPU only under Triton's interpreter (TRITON_INTERPRET=1, for tests).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _decode(q_ptr, k_ptr, v_ptr, table_ptr, len_ptr, out_ptr, scale, heads, group, head_dim, table_stride,
            kv_token_stride, PAGE: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    kv_head = h // group
    d = tl.arange(0, BLOCK_D)
    in_head = d < head_dim
    q = tl.load(q_ptr + (b * heads + h) * head_dim + d, mask=in_head, other=0.0).to(tl.float32) * scale
    length = tl.load(len_ptr + b)
    t = tl.arange(0, PAGE)
    best = -float("inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p in range(0, tl.cdiv(length, PAGE)):
        page = tl.load(table_ptr + b * table_stride + p).to(tl.int64)
        rows = (page * PAGE + t) * kv_token_stride + kv_head * head_dim
        valid = p * PAGE + t < length
        both = valid[:, None] & in_head[None, :]
        k = tl.load(k_ptr + rows[:, None] + d[None, :], mask=both, other=0.0).to(tl.float32)
        scores = tl.where(valid, tl.sum(k * q[None, :], axis=1), -float("inf"))
        new_best = tl.maximum(best, tl.max(scores, axis=0))
        weights = tl.exp(scores - new_best)
        shrink = tl.exp(best - new_best)
        v = tl.load(v_ptr + rows[:, None] + d[None, :], mask=both, other=0.0).to(tl.float32)
        total = total * shrink + tl.sum(weights, axis=0)
        acc = acc * shrink + tl.sum(weights[:, None] * v, axis=0)
        best = new_best
    tl.store(out_ptr + (b * heads + h) * head_dim + d, (acc / total).to(out_ptr.dtype.element_ty), mask=in_head)


def paged_decode_attention(q: Tensor, keys: Tensor, values: Tensor, page_table: Tensor, lengths: Tensor,
                           page_tokens: int, scale: float) -> Tensor:
    """Attention of one new query per request over its own cached positions.

    q [B, heads, head_dim]; keys/values [pool positions, kv_heads, head_dim] (the pool of one layer); page_table
    [B, pages] (each request's pages in order); lengths [B] (positions to attend, the new token's included).
    Returns [B, heads, head_dim] in q's dtype.
    """
    batch, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads or keys.shape[2] != head_dim or not keys.is_contiguous() or not values.is_contiguous():
        raise ValueError(f"paged decode attention: q {tuple(q.shape)} does not fit a contiguous pool of "
                         f"{tuple(keys.shape)}")
    q = q.contiguous()
    out = torch.empty_like(q)
    if batch:
        _decode[(batch, heads)](q, keys, values, page_table, lengths, out, scale, heads, heads // kv_heads, head_dim,
                                page_table.stride(0), kv_heads * head_dim, PAGE=page_tokens,
                                BLOCK_D=triton.next_power_of_2(head_dim))
    return out
