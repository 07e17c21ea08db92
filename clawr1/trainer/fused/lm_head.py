"""The LM head's softmax statistics without its logits (`trainer.fused_kernels: lmhead`).

The trainer needs, at each response token, log p of the sampled token (and of the teacher's top k), and the
entropy. With z = h W^T / t the logits of one row, both follow from two statistics over the vocabulary:
lse = log sum exp z and mean = E_p[z]: log p_i = z_i - lse and entropy = lse - mean. One Triton kernel computes
them tile by tile (rows x vocabulary, the hidden size in steps), an online softmax in fp32, so no row's logits
ever exist in memory; z_i of the few ids asked for is a dot product. The backward recomputes each tile and adds
its share of dh and dW atomically: d lse / dz_j = p_j and d mean / dz_j = p_j (1 + z_j - mean).

The plain path (`clawr1/trainer/logprobs.py`) materialises `trainer.logprob_chunk_tokens` rows of logits at a time
and recomputes them in the backward. One tensor-parallel rank only (the whole vocabulary).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_R, BLOCK_V, BLOCK_H = 64, 128, 64  # tiles sized for tensor cores; not tuned on a GPU yet
# Triton's CPU interpreter multiplies bf16 tiles wrongly: there the tiles go through an fp32 dot instead (a product
# of two bf16 values is exact in fp32, so only the order of the fp32 sums differs from a GPU's bf16 dot)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _logits_tile(h_ptr, w_ptr, r, v, rows, vocab, hidden, IEEE: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """h[r] . W[v] for a tile of rows and vocabulary ids, in fp32."""
    z = tl.zeros([BLOCK_R, BLOCK_V], dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_H):
        k = k0 + tl.arange(0, BLOCK_H)
        h = tl.load(h_ptr + r[:, None] * hidden + k[None, :], mask=(r[:, None] < rows) & (k[None, :] < hidden),
                    other=0.0)
        w = tl.load(w_ptr + v[:, None] * hidden + k[None, :], mask=(v[:, None] < vocab) & (k[None, :] < hidden),
                    other=0.0)
        if IEEE:
            z += tl.dot(h.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            z += tl.dot(h, tl.trans(w))
    return z


@triton.jit
def _forward(h_ptr, w_ptr, inv_t_ptr, lse_ptr, mean_ptr, rows, vocab, hidden, IEEE: tl.constexpr,
             BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    inv_t = tl.load(inv_t_ptr + r, mask=r < rows, other=1.0)
    best = tl.full([BLOCK_R], -float("inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    weighted = tl.zeros([BLOCK_R], dtype=tl.float32)
    for v0 in range(0, vocab, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V)
        z = _logits_tile(h_ptr, w_ptr, r, v, rows, vocab, hidden, IEEE, BLOCK_R, BLOCK_V, BLOCK_H) * inv_t[:, None]
        in_vocab = v[None, :] < vocab
        z = tl.where(in_vocab, z, -float("inf"))
        new_best = tl.maximum(best, tl.max(z, axis=1))
        e = tl.exp(z - new_best[:, None])
        shrink = tl.exp(best - new_best)
        total = total * shrink + tl.sum(e, axis=1)
        weighted = weighted * shrink + tl.sum(e * tl.where(in_vocab, z, 0.0), axis=1)
        best = new_best
    tl.store(lse_ptr + r, best + tl.log(total), mask=r < rows)
    tl.store(mean_ptr + r, weighted / total, mask=r < rows)


@triton.jit
def _backward(h_ptr, w_ptr, inv_t_ptr, lse_ptr, mean_ptr, g_lse_ptr, g_mean_ptr, dh_ptr, dw_ptr, rows, vocab,
              hidden, IEEE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """One (rows, vocabulary) tile: its logits again, dz, and its share of dh = dz W / t and dW = dz^T h / t."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_rows, in_vocab = r < rows, v < vocab
    inv_t = tl.load(inv_t_ptr + r, mask=in_rows, other=1.0)
    lse = tl.load(lse_ptr + r, mask=in_rows, other=0.0)
    mean = tl.load(mean_ptr + r, mask=in_rows, other=0.0)
    g_lse = tl.load(g_lse_ptr + r, mask=in_rows, other=0.0)
    g_mean = tl.load(g_mean_ptr + r, mask=in_rows, other=0.0)
    z = _logits_tile(h_ptr, w_ptr, r, v, rows, vocab, hidden, IEEE, BLOCK_R, BLOCK_V, BLOCK_H) * inv_t[:, None]
    p = tl.where(in_rows[:, None] & in_vocab[None, :], tl.exp(z - lse[:, None]), 0.0)
    dlogits = p * (g_lse[:, None] + g_mean[:, None] * (1.0 + z - mean[:, None])) * inv_t[:, None]
    for k0 in range(0, hidden, BLOCK_H):
        k = k0 + tl.arange(0, BLOCK_H)
        in_hidden = k < hidden
        w = tl.load(w_ptr + v[:, None] * hidden + k[None, :], mask=in_vocab[:, None] & in_hidden[None, :], other=0.0)
        h = tl.load(h_ptr + r[:, None] * hidden + k[None, :], mask=in_rows[:, None] & in_hidden[None, :], other=0.0)
        if IEEE:
            dh = tl.dot(dlogits, w.to(tl.float32), input_precision="ieee")
            dw = tl.dot(tl.trans(dlogits), h.to(tl.float32), input_precision="ieee")
        else:
            dh = tl.dot(dlogits.to(w.dtype), w)
            dw = tl.dot(tl.trans(dlogits).to(h.dtype), h)
        tl.atomic_add(dh_ptr + r[:, None] * hidden + k[None, :], dh, mask=in_rows[:, None] & in_hidden[None, :])
        tl.atomic_add(dw_ptr + v[:, None] * hidden + k[None, :], dw, mask=in_vocab[:, None] & in_hidden[None, :])


class _LMHeadStatsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, inv_t: Tensor) -> tuple[Tensor, Tensor]:
        hidden, weight, inv_t = hidden.contiguous(), weight.contiguous(), inv_t.float().contiguous()
        rows, vocab = hidden.shape[0], weight.shape[0]
        lse = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        mean = torch.empty_like(lse)
        ieee = hidden.dtype == torch.float32 or INTERPRETED
        if rows:
            _forward[(triton.cdiv(rows, BLOCK_R),)](hidden, weight, inv_t, lse, mean, rows, vocab, hidden.shape[1],
                                                  IEEE=ieee, BLOCK_R=BLOCK_R, BLOCK_V=BLOCK_V, BLOCK_H=BLOCK_H)
        ctx.save_for_backward(hidden, weight, inv_t, lse, mean)
        return lse, mean

    @staticmethod
    def backward(ctx, g_lse: Tensor, g_mean: Tensor):
        hidden, weight, inv_t, lse, mean = ctx.saved_tensors
        rows, vocab = hidden.shape[0], weight.shape[0]
        dh = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        zeros = torch.zeros_like(lse)
        g_lse = zeros if g_lse is None else g_lse.float().contiguous()
        g_mean = zeros if g_mean is None else g_mean.float().contiguous()
        if rows:
            grid = (triton.cdiv(rows, BLOCK_R), triton.cdiv(vocab, BLOCK_V))
            _backward[grid](hidden, weight, inv_t, lse, mean, g_lse, g_mean, dh, dw, rows, vocab, hidden.shape[1],
                            IEEE=hidden.dtype == torch.float32 or INTERPRETED, BLOCK_R=BLOCK_R, BLOCK_V=BLOCK_V, BLOCK_H=BLOCK_H)
        return dh.to(hidden.dtype), dw.to(weight.dtype), None


def lm_head_stats(hidden: Tensor, weight: Tensor, inv_temperature: Tensor) -> tuple[Tensor, Tensor]:
    """(lse, mean) [R] of z = hidden [R, H] @ weight [V, H]^T * inv_temperature [R], fp32, without z."""
    return _LMHeadStatsFn.apply(hidden, weight, inv_temperature)


def logprob_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, inv_temperature: Tensor,
                    extra_ids: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """What `chunked_logprob_entropy` returns (log p of targets [R], entropy [R], log p of extra_ids [R, k] or
    None) for the LM head `weight` on one rank, through `lm_head_stats`."""
    lse, mean = lm_head_stats(hidden, weight, inv_temperature)
    ids = targets[:, None] if extra_ids is None else torch.cat([targets[:, None], extra_ids], dim=1)
    picked = torch.einsum("rh,rkh->rk", hidden.float(), weight[ids].float()) * inv_temperature[:, None]
    logp = picked - lse[:, None]
    return logp[:, 0], lse - mean, None if extra_ids is None else logp[:, 1:]
