"""Losses, estimators and weights against values worked out by hand."""

import pytest
import torch

from clawr1.algo.losses import (aggregation_weights, kl_estimate, ppo_clipped_token_loss, topk_reverse_kl,
                                truncated_importance_weights)
from tests.numerics import assert_close, gap, tolerance


def test_ppo_clipping_at_both_bounds():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.0]))
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss, low, high, dual = ppo_clipped_token_loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # r=1.5, A=1: min(1.5, 1.28) -> -1.28 (clipped high)   r=1.5, A=-1: min(-1.5, -1.28) -> 1.5 (not clipped)
    # r=0.5, A=-1: min(-0.5, -0.8) -> 0.8 (clipped low)     r=1, A=2 -> -2
    # exp(log r) - 1 back to r, the clip, the product, and the literals' rounding: four fp32 roundings
    assert_close(loss, torch.tensor([-1.28, 1.5, 0.8, -2.0]), torch.float32, 4)
    assert high.tolist() == [True, False, False, False] and low.tolist() == [False, False, True, False]
    assert not dual.any()


def test_clipped_tokens_get_no_gradient_and_others_do():
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1])).requires_grad_()
    loss, *_ = ppo_clipped_token_loss(logp, torch.zeros(3), torch.tensor([1.0, -1.0, 1.0]), 0.2, 0.28)
    loss.sum().backward()
    assert logp.grad[0] == 0 and logp.grad[1] == 0 and gap(logp.grad[2], -1.1) <= tolerance(torch.float32, 1.1, 4)


def test_dual_clip_caps_negative_advantage_losses():
    old = torch.zeros(3)
    logp = torch.log(torch.tensor([2.0, 1.2, 3.0]))
    adv = torch.tensor([-1.0, -1.0, 1.0])
    loss, low, high, dual = ppo_clipped_token_loss(logp, old, adv, 0.2, 0.28, dual_clip=1.5)
    # r=2, A=-1: PPO loss 2.0, capped at 1.5;  r=1.2, A=-1: 1.2 < 1.5 stays;  A>0 never dual-clipped: -1.28
    assert_close(loss, torch.tensor([1.5, 1.2, -1.28]), torch.float32, 4)  # as above
    assert dual.tolist() == [True, False, False]
    with pytest.raises(ValueError, match="> 1"):
        ppo_clipped_token_loss(logp, old, adv, 0.2, 0.28, dual_clip=0.5)


def test_kl_estimators_match_their_closed_forms():
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.25, 0.5])
    k1 = kl_estimate(p.log(), q.log(), "k1")
    k2 = kl_estimate(p.log(), q.log(), "k2")
    k3 = kl_estimate(p.log(), q.log(), "k3")
    # KL(p||q) = 0.5 ln 2 + 0.25 ln 0.5 = 0.1732868; k1 and k3 are unbiased, their expectations under p equal it
    # logs, the estimator (three ops), products and a sum of three, each at the terms' magnitude ln 2 / 2
    assert_close((p * k1).sum(), 0.1732868, torch.float32, 8, 0.35)
    assert_close((p * k3).sum(), 0.1732868, torch.float32, 8, 0.35)
    # E_p[k2] = 0.5 * (0.5 ln^2 2 + 0.25 ln^2 0.5) = 0.1801699
    assert_close((p * k2).sum(), 0.1801699, torch.float32, 8, 0.35)
    # per token: k3 at x=0 is q/p - 1 - ln(q/p) = 0.5 - 1 + ln 2 = 0.1931472; k3 is never negative
    assert_close(k3[0], 0.1931472, torch.float32, 6, 0.7) and (k3 >= 0).all() and (k1 < 0).any()
    with pytest.raises(ValueError):
        kl_estimate(p, q, "k9")


def test_truncated_importance_weights():
    w = truncated_importance_weights(torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-1.5, -1.0, -0.2]), cap=1.5)
    assert_close(w, torch.tensor([1.5, 1.0, 0.4493290]), torch.float32, 3)  # e^0.5 = 1.65 -> capped; e^-0.8


def test_topk_kl_with_a_tail_bin():
    # student top-2 [0.5, 0.3] (tail 0.2), teacher [0.4, 0.4] (tail 0.2):
    # 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2) = 0.1115718 - 0.0863046 = 0.0252672
    kl = topk_reverse_kl(torch.tensor([[0.5, 0.3]]).log(), torch.tensor([[0.4, 0.4]]).log())
    # logs, ratios, products and a sum whose terms (0.11) are four times the result: at the terms' magnitude
    assert_close(kl, torch.tensor([0.0252672]), torch.float32, 8, 0.12)


def test_topk_kl_equals_dense_kl_when_k_is_the_vocabulary():
    g = torch.Generator().manual_seed(0)
    s_logits, t_logits = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g)
    order = t_logits.argsort(dim=-1, descending=True)  # the teacher's "top 6" of 6
    s_lp, t_lp = s_logits.log_softmax(-1), t_logits.log_softmax(-1)
    kl = topk_reverse_kl(s_lp.gather(1, order), t_lp.gather(1, order))
    dense = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=s_logits),
                                              torch.distributions.Categorical(logits=t_logits))
    # the same sums in another order: log-softmax over 6 (max, exp, sum, log), the products, the sum over 6
    assert_close(kl, dense, torch.float32, 8, float((s_lp.exp() * (s_lp - t_lp)).abs().sum(-1).max()))


def test_aggregations_and_their_invariance_to_packing():
    # sample A has 3 tokens with losses 1, 2, 3; sample B one token with loss 4
    loss = torch.tensor([1.0, 2.0, 3.0, 4.0])
    idx, mask, per_sample = torch.tensor([0, 0, 0, 1]), torch.ones(4), torch.tensor([3.0, 1.0])
    token = (loss * aggregation_weights(idx, mask, "token-mean", 4, 2, per_sample)).sum()
    seq = (loss * aggregation_weights(idx, mask, "seq-mean-token-mean", 4, 2, per_sample)).sum()
    # fp32 weights (a count, a division), products and a sum of four, at the terms' magnitude 4
    assert_close([token, seq], [2.5, 3.0], torch.float32, 6, 4.0)  # 10/4 and (2 + 4)/2
    # B packed first, each sample in its own micro-batch: the same totals
    parts = [(torch.tensor([4.0]), torch.tensor([0]), torch.tensor([1.0])),
             (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), torch.tensor([3.0]))]
    for mode, expected in (("token-mean", 2.5), ("seq-mean-token-mean", 3.0)):
        total = sum((l * aggregation_weights(i, torch.ones(len(l)), mode, 4, 2, n)).sum() for l, i, n in parts)
        assert_close(total, expected, torch.float32, 6 + 1, 4.0)  # as above, and the sum of the two parts
    with pytest.raises(ValueError, match="aggregation"):
        aggregation_weights(idx, mask, "sum", 4, 2, per_sample)
