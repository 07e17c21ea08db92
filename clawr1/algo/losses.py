"""Policy losses, KL estimators, top-k distillation and importance weights: pure tensor functions, no I/O.

All token tensors are flat (response tokens of many samples end to end).
"""
from __future__ import annotations

import torch
from torch import Tensor

AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


def ppo_clipped_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, eps_low: float,
                           eps_high: float, dual_clip: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token PPO surrogate with asymmetric clipping ("clip-higher") and optional dual clip.

        r = exp(logp - old)
        loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
        with dual_clip = c > 1, for A < 0 the loss is capped at -c A (Ye et al., 2020)

    Returns (loss per token, clipped-at-low mask, clipped-at-high mask, dual-clipped mask).
    A clip mask is set where the clipped branch is the one that counts (its gradient is 0).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    low = (ratio < 1.0 - eps_low) & (advantages < 0)
    high = (ratio > 1.0 + eps_high) & (advantages > 0)
    dual = torch.zeros_like(low)
    if dual_clip:
        if dual_clip <= 1.0:
            raise ValueError("dual_clip must be > 1 (or 0 to disable)")
        cap = -dual_clip * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
    return loss, low, high, dual


def aggregation_weights(sample_index: Tensor, mask: Tensor, mode: str, total_tokens: int | Tensor,
                        total_samples: int | Tensor, tokens_per_sample: Tensor) -> Tensor:
    """Per-token weights whose dot product with a per-token loss is the batch loss.

    - token-mean: every counted token of the batch weighs the same, 1 / total_tokens;
    - seq-mean-token-mean: each sample's tokens are averaged, then samples are
      averaged: 1 / (tokens of its sample * total_samples).
    The totals are those of the whole batch, so the result does not depend on how
    samples are split into micro-batches or data-parallel ranks. Totals given per token
    (tensors shaped like `mask`) take each mean within a part of the batch, e.g. one user's.
    """
    total_tokens = torch.as_tensor(total_tokens, dtype=mask.dtype, device=mask.device).clamp(min=1)
    total_samples = torch.as_tensor(total_samples, dtype=mask.dtype, device=mask.device).clamp(min=1)
    if mode == "token-mean":
        return mask / total_tokens
    if mode == "seq-mean-token-mean":
        per_token = tokens_per_sample[sample_index].clamp(min=1)
        return mask / per_token / total_samples
    raise ValueError(f"loss aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, kind: str) -> Tensor:
    """Per-token estimators of KL(policy || reference) from samples of the policy (Schulman's k1, k2, k3).

        k1 = log p - log q                 unbiased, high variance, can be negative
        k2 = (log p - log q)^2 / 2         biased, low variance
        k3 = q/p - 1 - log(q/p)            unbiased, low variance, never negative ("low_var_kl")
    """
    diff = logprobs - ref_logprobs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff**2
    if kind in ("k3", "low_var_kl"):
        return torch.exp(-diff) + diff - 1.0
    raise ValueError(f"kl estimator must be k1, k2 or k3, got {kind!r}")


def truncated_importance_weights(old_logprobs: Tensor, rollout_logprobs: Tensor, cap: float) -> Tensor:
    """TIS: min(pi_old / pi_rollout, cap) per token, no gradient.

    Corrects for the gap between the policy the trainer recomputes and the one
    that sampled (stale weights, or engine numerics); capped so a few tokens
    cannot dominate.
    """
    return torch.exp(old_logprobs - rollout_logprobs).clamp(max=cap).detach()


def topk_reverse_kl(student_topk_logprobs: Tensor, teacher_topk_logprobs: Tensor, eps: float = 1e-8) -> Tensor:
    """KL(student || teacher) over the teacher's top-k tokens plus one tail bin, per token.

    Both inputs are [T, k] log-probs of the same k token ids (the teacher's top k),
    each normalized over the full vocabulary. The tail bin holds the remaining
    mass, 1 - sum of the k probabilities, for each distribution. When k covers the
    whole vocabulary the tail is empty and this is the exact reverse KL.
    """
    def with_tail(logp: Tensor) -> Tensor:
        tail = (1.0 - logp.exp().sum(dim=-1, keepdim=True)).clamp(min=eps)
        return torch.cat([logp, tail.log()], dim=-1)

    s, t = with_tail(student_topk_logprobs), with_tail(teacher_topk_logprobs)
    return (s.exp() * (s - t)).sum(dim=-1)
