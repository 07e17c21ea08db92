"""Advantages: pure tensor functions, no I/O.

Per-sample tensors have one entry per sample. Token tensors are flat: the
response tokens of many samples laid end to end, with `sample_index[t]` naming
the sample token t belongs to.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, has_reward: Tensor, group_index: Tensor, normalize_std: bool = True,
                    eps: float = 1e-6) -> Tensor:
    """GRPO: each reward minus its group's mean, optionally divided by the group's std (+ eps).

    Samples without a reward neither get an advantage (0) nor count in their
    group's statistics. A group whose rewards are all equal gets 0 everywhere.
    The std is the population std (divide by n), as in the GRPO paper's code.
    """
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    w = has_reward.to(rewards.dtype)
    r = torch.where(has_reward, rewards, torch.zeros_like(rewards))
    count = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, w)
    mean = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, r) / count.clamp(min=1)
    centered = (r - mean[group_index]) * w
    if normalize_std:
        var = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, group_index, centered**2) / count.clamp(min=1)
        centered = centered / (var.sqrt()[group_index] + eps)
    return centered


def ema_advantages(rewards: Tensor, has_reward: Tensor, task_keys: list[str], baselines: dict[str, float],
                   decay: float) -> tuple[Tensor, dict[str, float]]:
    """Reward minus a per-task exponential moving average baseline, for groups of one (live traffic).

    Plain group-of-one GRPO is REINFORCE without a baseline; this subtracts the
    task's running mean reward instead. The baseline each sample sees is the one
    from before this batch; the returned baselines include this batch
    (b <- decay * b + (1 - decay) * mean reward of the task in the batch). A task
    seen for the first time starts at its batch mean.
    """
    new = dict(baselines)
    sums: dict[str, list[float]] = {}
    for r, ok, key in zip(rewards.tolist(), has_reward.tolist(), task_keys):
        if ok:
            sums.setdefault(key, []).append(r)
    for key, values in sums.items():
        batch_mean = sum(values) / len(values)
        new[key] = decay * baselines[key] + (1 - decay) * batch_mean if key in baselines else batch_mean
    seen = torch.tensor([baselines.get(k, new.get(k, 0.0)) for k in task_keys], dtype=rewards.dtype)
    adv = torch.where(has_reward, rewards - seen, torch.zeros_like(rewards))
    return adv, new


def rl_token_advantages(sample_advantages: Tensor, has_reward: Tensor, sample_index: Tensor) -> Tensor:
    """Each token gets its sample's advantage; 0 where the sample has no reward."""
    per_sample = torch.where(has_reward, sample_advantages, torch.zeros_like(sample_advantages))
    return per_sample[sample_index]


def opd_token_advantages(teacher_logprobs: Tensor, old_logprobs: Tensor, has_teacher: Tensor) -> Tensor:
    """Teacher minus student log-prob of each sampled token, 0 where the token's sample has no teacher.

    Positive when the hint-conditioned teacher is more confident in the sampled
    token than the student was. A sample without a teacher contributes exactly
    0: never a stand-in teacher equal to the student.
    """
    gap = teacher_logprobs - old_logprobs
    return torch.where(has_teacher, gap, torch.zeros_like(gap))


def center_per_sample(advantages: Tensor, sample_index: Tensor, active: Tensor) -> Tensor:
    """Each active token's advantage minus its sample's mean over the sample's active tokens.

    A hinted teacher is less confident on almost every token, so the raw OPD gap is negative on
    average and, summed over a response, penalizes length whatever the response says; centring
    keeps only which tokens the hint favours over the others of the same response.
    """
    n = int(sample_index.max()) + 1 if sample_index.numel() else 0
    w = active.to(advantages.dtype)
    sums = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_add_(0, sample_index, advantages * w)
    counts = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_add_(0, sample_index, w)
    mean = sums / counts.clamp(min=1)
    return torch.where(active, advantages - mean[sample_index], torch.zeros_like(advantages))


def clip_advantages(advantages: Tensor, limit: float) -> Tensor:
    """Advantages bounded to [-limit, limit] (limit 0: unchanged)."""
    return advantages.clamp(-limit, limit) if limit else advantages


def shaped_opd_advantages(teacher_logprobs: Tensor, baseline_logprobs: Tensor, has_teacher: Tensor, loss_mask: Tensor,
                          sample_index: Tensor, center: bool, clip: float) -> Tensor:
    """OPD's advantage of each token, shaped: the teacher's log-prob of the sampled token minus the baseline's
    (`opd_token_advantages`), with `center` minus its sample's mean (`center_per_sample`), bounded to
    [-clip, clip] (`clip_advantages`, 0: unbounded). 0 on every token OPD does not score. `baseline_logprobs`:
    what the teacher is measured against, the student's own log-probs of the sampled tokens.

    The scored tokens are those of a sample with a teacher (`has_teacher`, per token) that the loss trains
    (`loss_mask`): centring is there so that each trained response's OPD advantages sum to 0, and a token the
    loss leaves out (a tool's output inside the response) was not the student's choice; counted in the mean,
    its gap would shift every trained token of its response by an amount the loss never sees, and the balance
    planner, which measures the spread over the trained tokens, would plan for other values than the loss uses.
    """
    scored = has_teacher & loss_mask.bool()
    gap = opd_token_advantages(teacher_logprobs, baseline_logprobs, scored)
    if center:
        gap = center_per_sample(gap, sample_index, scored)
    return clip_advantages(gap, clip)


def combined_token_advantages(rl: Tensor, opd: Tensor, w_rl: float, w_opd: float) -> Tensor:
    """A = w_rl * A_rl + w_opd * A_opd."""
    return w_rl * rl + w_opd * opd


def balance_scales(rl: Tensor, opd: Tensor, floor: float = 1e-3) -> tuple[float, float]:
    """1 / standard deviation of each signal's token values (`rl`: the rewarded tokens' advantages, `opd`: the
    teacher-scored tokens' gaps), so that the weighted sum adds signals of equal spread. A signal with fewer than
    two tokens, or a spread below `floor`, keeps scale 1 (a batch of one value says nothing of its spread)."""

    def scale(values: Tensor) -> float:
        if values.numel() < 2:
            return 1.0
        std = float(values.double().std(unbiased=False))
        return 1.0 / std if std > floor else 1.0

    return scale(rl), scale(opd)


def signal_auc(gaps: list[float], rewards: list[float]) -> tuple[Optional[float], int]:
    """How well the teacher's summed gap sorts the judge's positives above its negatives: the AUC (ties count
    half; None without both classes) and the smaller class's size."""
    pos = [g for g, r in zip(gaps, rewards) if r > 0]
    neg = [g for g, r in zip(gaps, rewards) if r < 0]
    if not pos or not neg:
        return None, 0
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg)), min(len(pos), len(neg))


def opd_gate(gaps: list[float], rewards: list[float], min_class: int = 16) -> float:
    """1.0 while OPD's signal agrees with the judge's scores, or too little is known to tell; 0.0 once the AUC of
    the teacher's summed gap against the scores is not above chance by two standard errors.

    A teacher that does not understand the hints (worded as it never learned) pushes tokens at random or the
    wrong way; the scalar rewards, noisy as they are, show it. The standard error is the conservative
    sqrt(AUC (1 - AUC) / n) of the smaller class.
    """
    auc, n = signal_auc(gaps, rewards)
    if auc is None or n < min_class:
        return 1.0
    return 1.0 if auc - 2 * math.sqrt(max(auc * (1 - auc), 1e-12) / n) > 0.5 else 0.0
