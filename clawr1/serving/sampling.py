"""Next-token sampling for a whole decode batch at once: the filters and the randomness as tensor ops.

The randomness (serve.sampler=counter) is a counter-based hash of each request's seed and the index of the token it
draws: no generator per request, no host work per row, the same number on every device and in any batch. With
serve.sampler=generator each request keeps its own seeded torch.Generator on the host (the engine draws from it).
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), exact in int64: x is split in 16-bit halves so no product overflows."""
    return ((x & 0xFFFF) * c + (((x >> 16) * c) & 0xFFFF) * 65536) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash with good avalanche (Wellons' "lowbias32"), on int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """One float32 in [0, 1) per row from (its int64 seed, its int64 counter), with 24 random bits: a float32
    cumulative sum resolves no finer."""
    hi, lo = (seeds >> 32) & MASK32, seeds & MASK32
    h = mix32((hi + 0x9E3779B9) & MASK32)
    h = mix32(h ^ lo)
    h = mix32(h ^ ((counters >> 32) & MASK32) ^ 0x85EBCA6B)
    h = mix32(h ^ (counters & MASK32))
    return (h >> 8).to(torch.float32) * 2.0 ** -24


def filtered_probs(logp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Each row's probabilities with SGLang's filters applied in its order: top-k (ties with the k-th kept), then
    top-p over the mass left, then min-p against the largest; not renormalised (sampling scales by the total).

    logp: [B, V] log-probabilities; top_k [B] (<= 0 or >= V: off), top_p [B] in (0, 1], min_p [B] in [0, 1].
    """
    probs = logp.exp()
    vocab = probs.shape[-1]
    ordered, order = probs.sort(dim=-1, descending=True)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    keep = ordered >= ordered.gather(1, (k - 1)[:, None])
    left = ordered * keep
    keep &= (left.cumsum(dim=-1) - left < top_p[:, None]) | (top_p[:, None] >= 1.0)  # 1: off (no rounding at the tail)
    keep &= ordered >= min_p[:, None] * ordered[:, :1]
    return torch.zeros_like(probs).scatter(1, order, ordered * keep)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row where its cumulative (unnormalised) probability first passes u times the row's total."""
    cdf = probs.cumsum(dim=-1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None])[:, 0].clamp(max=probs.shape[-1] - 1)
