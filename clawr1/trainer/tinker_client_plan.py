"""A pool batch as Tinker Datums (trainer.backend=tinker), before any SDK type is involved.

Each sample becomes one datum over its whole token sequence, as Tinker's RL losses expect:

    model_input   = tokens[:-1]          position i predicts target_tokens[i]
    target_tokens = tokens[1:]
    logprobs      = 0 over the prompt, then the rollout's log-prob of each response token (the sampler's)
    advantages    = 0 over the prompt, then A = w_rl * A_rl + w_opd * A_opd per response token, times the
                    loss-aggregation weight, and 0 where the loss mask is 0 (tool output, earlier turns)

A_rl and A_opd are the Megatron trainer's own (`token_advantages`, same staleness drops, GRPO / EMA baselines,
OPD centring, clipping and gating). Two things differ because Tinker runs the model, not this process:
OPD's student baseline is the rollout log-prob (Tinker gives no pre-step log-probs without a second pass,
which is also OpenClaw-RL's choice), and the PPO ratio is taken against the sampler (no separate TIS weight).
Tinker's losses sum over tokens, so the aggregation weight (1 / tokens for token-mean) goes into the advantage:
the losses are linear in it, so this is exactly the weighted mean the Megatron trainer takes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.algo.losses import aggregation_weights
from clawr1.trainer.step import BatchPlan, Totals, flat_field, token_advantages


@dataclass
class PlannedDatum:
    """What one sample asks of Tinker: all lists have len(tokens) - 1 entries."""

    sample_id: str
    model_input: list[int]
    target_tokens: list[int]
    logprobs: list[float]
    advantages: list[float]


@dataclass
class PlannedAdvantages:
    """Per response token of the plan's samples, laid end to end: RL's and OPD's parts and what is trained."""

    rl: torch.Tensor
    opd: torch.Tensor
    trained: torch.Tensor  # the combined advantage times the aggregation weight (0 where masked)


def planned_advantages(plan: BatchPlan, algo: AlgoConfig) -> PlannedAdvantages:
    samples = plan.samples
    index = torch.tensor([i for i, s in enumerate(samples) for _ in range(s.response_len)], dtype=torch.long)
    mask = flat_field(samples, "loss_mask")
    rollout = flat_field(samples, "rollout_logprobs")
    a_rl, a_opd, combined = token_advantages(samples, plan, algo, rollout, index, mask)
    total_tokens, total_samples = Totals.of(samples).per_token(samples, index)
    tokens_per_sample = torch.tensor([float(sum(s.loss_mask)) for s in samples])
    weights = aggregation_weights(index, mask, algo.loss_aggregation, total_tokens, total_samples, tokens_per_sample)
    return PlannedAdvantages(a_rl, a_opd, combined * weights * mask)


def planned_datums(plan: BatchPlan, algo: AlgoConfig) -> tuple[list[PlannedDatum], PlannedAdvantages]:
    """One datum per sample the plan trains, and the advantages they carry."""
    if not plan.samples:  # every sample was dropped as stale
        empty = torch.zeros(0)
        return [], PlannedAdvantages(empty, empty, empty)
    adv = planned_advantages(plan, algo)
    per_sample = adv.trained.tolist()
    datums, start = [], 0
    for s in plan.samples:
        n = s.response_len
        trained, start = per_sample[start:start + n], start + n
        datums.append(datum_of(s, trained))
    return datums, adv


def datum_of(s: Sample, advantages: list[float]) -> PlannedDatum:
    """`advantages`: one per response token (already 0 where the loss mask is 0)."""
    pad = [0.0] * (s.prompt_len - 1)
    sampled = [lp if m else 0.0 for lp, m in zip(s.rollout_logprobs, s.loss_mask)]
    return PlannedDatum(sample_id=s.sample_id, model_input=list(s.tokens[:-1]), target_tokens=list(s.tokens[1:]),
                        logprobs=pad + sampled, advantages=pad + list(advantages))


def ppo_loss_config(loss_fn: str, algo: AlgoConfig) -> dict[str, float]:
    """Tinker's clip thresholds on the ratio to the sampler, from the PPO clip the Megatron trainer uses."""
    if loss_fn != "ppo":
        return {}
    return {"clip_low_threshold": 1.0 - algo.eps_clip_low, "clip_high_threshold": 1.0 + algo.eps_clip_high}
