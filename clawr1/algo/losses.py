"""Policy losses: pure tensor functions, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PolicyLossStats:
    clip_frac_low: float
    clip_frac_high: float
    approx_kl_old: float


def ppo_clipped_token_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor,
                           eps_low: float, eps_high: float) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO surrogate -min(r A, clip(r, 1-eps_low, 1+eps_high) A) with r = exp(logp - old).

    Returns (loss per token, clipped-at-low mask, clipped-at-high mask).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    low = (ratio < 1.0 - eps_low) & (advantages < 0)
    high = (ratio > 1.0 + eps_high) & (advantages > 0)
    return loss, low, high


def token_mean(values: Tensor, mask: Tensor, total_tokens: int) -> Tensor:
    """Sum over masked tokens divided by the tokens of the whole batch.

    Dividing by the batch's token count (not the micro-batch's) makes the
    accumulated gradient independent of how samples were split into micro-batches.
    """
    return (values * mask).sum() / max(total_tokens, 1)
