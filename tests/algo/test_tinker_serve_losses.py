"""Tinker's loss functions against their documented definitions, on cases worked by hand.

Values and gradients (d loss / d logp of each token) are computed here from the definitions in
closed form; the functions under test compute them with autograd. fp64 throughout: the bound is a
few ulps of the terms (|terms| < 10), far below any wrong branch (which differs by >= 0.01).
"""
from __future__ import annotations

import math

import pytest
import torch

from clawr1.algo.tinker_serve_losses import LossInputError, check_loss_call, tinker_loss

TOL = 1e-12
LOGP = [-0.5, -1.0, -2.0, -0.1]
SAMPLING = [-0.5, -1.5, -1.0, -0.4]  # ratios: 1, e^0.5 = 1.649, e^-1 = 0.368, e^0.3 = 1.350
ADV = [1.0, 1.0, -2.0, -1.0]


def run(loss_fn: str, config=None, **inputs):
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    tensors = {"target_tokens": torch.tensor([5, 6, 7, 8]), "logprobs": torch.tensor(SAMPLING, dtype=torch.float64),
               "advantages": torch.tensor(ADV, dtype=torch.float64),
               **{k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}}
    loss = tinker_loss(loss_fn, logp, tensors, config)
    loss.backward()
    return loss.item(), logp.grad.tolist()


def ratios() -> list[float]:
    return [math.exp(a - b) for a, b in zip(LOGP, SAMPLING)]


def close(got, want):
    assert got == pytest.approx(want, abs=TOL, rel=TOL)


def test_cross_entropy_is_the_weighted_negative_log_likelihood():
    loss, grad = run("cross_entropy", weights=[0.0, 1.0, 1.0, 0.5])
    close(loss, 1.0 + 2.0 + 0.05)
    close(grad, [-0.0, -1.0, -1.0, -0.5])
    close(run("cross_entropy")[0], 3.6)  # without weights every token counts


def test_importance_sampling_is_the_ratio_weighted_advantage():
    loss, grad = run("importance_sampling")
    r = ratios()
    close(loss, -sum(ri * a for ri, a in zip(r, ADV)))
    close(grad, [-ri * a for ri, a in zip(r, ADV)])  # d(r)/d(logp) = r


def test_ppo_clips_the_ratio_where_the_clipped_term_is_the_smaller():
    loss, grad = run("ppo")
    r = ratios()  # 1.0 (inside), 1.649 > 1.2 with A > 0 (clipped: 1.2), 0.368 < 0.8 with A < 0 (clipped: 0.8),
    # 1.350 > 1.2 with A < 0: unclipped r A = -1.350 is the smaller, so it counts
    close(loss, -(1.0 * 1.0 + 1.2 * 1.0 + 0.8 * -2.0 + r[3] * -1.0))
    close(grad, [-1.0, 0.0, 0.0, r[3]])  # a clipped term has no gradient


def test_ppo_thresholds_come_from_the_config():
    loss, _ = run("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0})
    r = ratios()  # nothing is clipped at 0.5..2.0 except the third token (0.368 < 0.5, A < 0)
    close(loss, -(r[0] * 1.0 + r[1] * 1.0 + 0.5 * -2.0 + r[3] * -1.0))


def test_cispo_weights_logp_by_the_clipped_ratio_held_constant():
    loss, grad = run("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5})
    clipped = [min(max(ri, 0.5), 1.5) for ri in ratios()]  # 1.0, 1.5, 0.5, 1.350
    close(loss, -sum(c * lp * a for c, lp, a in zip(clipped, LOGP, ADV)))
    close(grad, [-c * a for c, a in zip(clipped, ADV)])  # the ratio is detached: only logp carries gradient
    default_loss, _ = run("cispo")  # defaults 0.0 and 4.0: no ratio here is clipped
    close(default_loss, -sum(ri * lp * a for ri, lp, a in zip(ratios(), LOGP, ADV)))


@pytest.mark.parametrize("loss_fn, names, config, message", [
    ("dpo", {"target_tokens"}, None, "unsupported loss_fn 'dpo'"),
    ("ppo", {"target_tokens", "logprobs"}, None, "needs loss_fn_inputs advantages"),
    ("importance_sampling", {"target_tokens", "logprobs", "advantages"}, {"clip_low_threshold": 0.9},
     "takes no loss_fn_config key clip_low_threshold"),
    ("ppo", {"target_tokens", "logprobs", "advantages"}, {"eps": 0.2}, "takes no loss_fn_config key eps"),
])
def test_a_loss_call_it_cannot_compute_is_refused_by_name(loss_fn, names, config, message):
    with pytest.raises(LossInputError, match=message):
        check_loss_call(loss_fn, names, config)
