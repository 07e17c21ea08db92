"""Tinker's built-in loss functions, as its documentation defines them: pure tensor functions, no I/O.

Each takes the learner's log-probability of every target token (`logprobs`, with grad) and one
datum's `loss_fn_inputs`, and returns the datum's loss, a sum over its tokens (Tinker reports
`loss:sum`; no mean, no normalization):

    cross_entropy        -sum(weights * logp)
    importance_sampling  -sum(r * A),                       r = exp(logp - sampling_logp)
    ppo                  -sum(min(r * A, clip(r, lo, hi) * A)),  lo, hi = 0.8, 1.2 by default
    cispo                -sum(sg(clip(r, lo, hi)) * logp * A),   lo, hi = 0.0, 4.0 by default

`lo` and `hi` are ratio thresholds (`loss_fn_config`: `clip_low_threshold`, `clip_high_threshold`).
The policy-gradient losses take no weights: a token that must not train has advantage 0.
"""
from __future__ import annotations

from typing import Mapping, Optional

import torch
from torch import Tensor

DEFAULT_THRESHOLDS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}
POLICY_GRADIENT_INPUTS = ("target_tokens", "logprobs", "advantages")
REQUIRED_INPUTS = {"cross_entropy": ("target_tokens",), "importance_sampling": POLICY_GRADIENT_INPUTS,
                   "ppo": POLICY_GRADIENT_INPUTS, "cispo": POLICY_GRADIENT_INPUTS}
LOSS_FUNCTIONS = tuple(REQUIRED_INPUTS)
CONFIG_KEYS = ("clip_low_threshold", "clip_high_threshold")


class LossInputError(ValueError):
    """A loss function named that does not exist, an input it needs missing, or a config key it does not take."""


def check_loss_call(loss_fn: str, input_names: set[str], config: Optional[Mapping[str, float]]) -> None:
    """Refuse what the loss cannot compute, naming what is wrong."""
    if loss_fn not in REQUIRED_INPUTS:
        raise LossInputError(f"unsupported loss_fn {loss_fn!r}; supported: {', '.join(LOSS_FUNCTIONS)}")
    missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in input_names]
    if missing:
        raise LossInputError(f"loss_fn {loss_fn!r} needs loss_fn_inputs {', '.join(missing)}")
    unknown = sorted(set(config or {}) - (set(CONFIG_KEYS) if loss_fn in DEFAULT_THRESHOLDS else set()))
    if unknown:
        raise LossInputError(f"loss_fn {loss_fn!r} takes no loss_fn_config key {', '.join(unknown)}")


def thresholds(loss_fn: str, config: Optional[Mapping[str, float]]) -> tuple[float, float]:
    low, high = DEFAULT_THRESHOLDS[loss_fn]
    config = config or {}
    return float(config.get("clip_low_threshold", low)), float(config.get("clip_high_threshold", high))


def tinker_loss(loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor],
                config: Optional[Mapping[str, float]] = None) -> Tensor:
    """One datum's loss (a 0-dim tensor) from the learner's target log-probs and its loss_fn_inputs."""
    check_loss_call(loss_fn, set(inputs), config)
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        return -(logprobs if weights is None else weights.to(logprobs.dtype) * logprobs).sum()
    advantages = inputs["advantages"].to(logprobs.dtype)
    ratio = torch.exp(logprobs - inputs["logprobs"].to(logprobs.dtype))
    if loss_fn == "importance_sampling":
        return -(ratio * advantages).sum()
    low, high = thresholds(loss_fn, config)
    if loss_fn == "ppo":
        return -torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages).sum()
    return -(ratio.clamp(low, high).detach() * logprobs * advantages).sum()
