"""Advantages: pure tensor functions, no I/O.

Token tensors are flat: the response tokens of many samples laid end to end,
with `sample_index[t]` naming the sample token t belongs to.
"""
from __future__ import annotations

import torch
from torch import Tensor


def rl_token_advantages(rewards: Tensor, has_reward: Tensor, sample_index: Tensor) -> Tensor:
    """The scalar reward of each token's sample, 0 where the sample has no reward."""
    per_sample = torch.where(has_reward, rewards, torch.zeros_like(rewards))
    return per_sample[sample_index]


def opd_token_advantages(teacher_logprobs: Tensor, old_logprobs: Tensor, has_teacher: Tensor) -> Tensor:
    """Teacher minus student log-prob of each sampled token, 0 where the token's sample has no teacher.

    Positive when the hint-conditioned teacher is more confident in the sampled
    token than the student was.
    """
    gap = teacher_logprobs - old_logprobs
    return torch.where(has_teacher, gap, torch.zeros_like(gap))


def combined_token_advantages(rl: Tensor, opd: Tensor, w_rl: float, w_opd: float) -> Tensor:
    """A = w_rl * A_rl + w_opd * A_opd."""
    return w_rl * rl + w_opd * opd
