"""Advantages against values worked out by hand (written out, not recomputed with the code under test)."""
import pytest
import torch

from clawr1.algo.advantages import (balance_scales, combined_token_advantages, ema_advantages, grpo_advantages,
                                    opd_token_advantages, rl_token_advantages, shaped_opd_advantages)
from tests.numerics import assert_close

REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 2.0])
HAS = torch.tensor([True, True, True, True, True, True, False, True])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])


def test_grpo_mean_only():
    # group 0: mean 0.75; group 1: all equal; group 2: one rewarded sample (its own mean), one without reward
    adv = grpo_advantages(REWARDS, HAS, GROUPS, normalize_std=False)
    # a mean of four (sum, divide) and a difference: three fp32 roundings at magnitude 1
    assert_close(adv, torch.tensor([0.25, -0.75, 0.25, 0.25, 0.0, 0.0, 0.0, 0.0]), torch.float32, 3)


def test_grpo_with_std():
    # group 0: var = (3 * 0.25^2 + 0.75^2) / 4 = 0.1875, std = 0.4330127; 0.25 / (std + eps 1e-6) = 0.5773489
    adv = grpo_advantages(REWARDS, HAS, GROUPS, normalize_std=True)
    expected = torch.tensor([0.5773489, -1.7320468, 0.5773489, 0.5773489, 0.0, 0.0, 0.0, 0.0])
    # mean, difference, variance (square, sum, divide), sqrt, division: seven fp32 roundings, one more for the
    # 7-digit literals
    assert_close(adv, expected, torch.float32, 8)


def test_grpo_group_with_equal_rewards_gives_exact_zeros():
    adv = grpo_advantages(torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([True] * 3), torch.tensor([0, 0, 0]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_ema_baseline_per_task():
    # task a has baseline 0.5; task b is new and starts at its batch mean (1.0)
    adv, new = ema_advantages(torch.tensor([1.0, -1.0, 1.0]), torch.tensor([True, True, True]), ["a", "a", "b"],
                              {"a": 0.5}, decay=0.9)
    assert_close(adv, torch.tensor([0.5, -1.5, 0.0]), torch.float32, 3)  # a mean of two, a difference
    # a: 0.9 * 0.5 + 0.1 * mean(1, -1): two products, a mean and a sum, and 0.45's own rounding
    assert set(new) == {"a", "b"}
    assert_close([new["a"], new["b"]], [0.45, 1.0], torch.float32, 5)


def test_ema_ignores_samples_without_reward():
    adv, new = ema_advantages(torch.tensor([3.0, 1.0]), torch.tensor([False, True]), ["a", "a"], {"a": 0.0}, 0.5)
    assert adv.tolist() == [0.0, 1.0] and new == {"a": 0.5}


def test_opd_sign_teacher_more_confident_is_positive():
    teacher = torch.tensor([-0.1, -3.0])
    old = torch.tensor([-2.0, -1.0])
    adv = opd_token_advantages(teacher, old, torch.tensor([True, True]))
    assert_close(adv, torch.tensor([1.9, -2.0]), torch.float32, 3)  # the inputs' rounding, the difference, 1.9's


def test_combined_with_missing_branches_contributes_exact_zeros():
    idx = torch.tensor([0, 0, 1, 1, 2])
    # sample 0: reward only; sample 1: teacher only; sample 2: both
    rl = rl_token_advantages(torch.tensor([-1.0, 5.0, 2.0]), torch.tensor([True, False, True]), idx)
    assert rl.tolist() == [-1.0, -1.0, 0.0, 0.0, 2.0]
    teacher = torch.tensor([9.0, 9.0, -0.5, -2.0, -1.0])  # the values for sample 0 must be ignored
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0, -1.5])
    opd = opd_token_advantages(teacher, old, torch.tensor([False, False, True, True, True]))
    assert opd.tolist() == [0.0, 0.0, 0.5, -1.0, 0.5]
    assert combined_token_advantages(rl, opd, 2.0, 0.5).tolist() == [-2.0, -2.0, 0.25, -0.5, 4.25]
    assert combined_token_advantages(rl, opd, 1.0, 0.0).tolist() == rl.tolist()  # binary RL
    assert combined_token_advantages(rl, opd, 0.0, 1.0).tolist() == opd.tolist()  # OPD


def test_opd_centring_per_sample_and_clipping_by_hand():
    from clawr1.algo.advantages import center_per_sample, clip_advantages

    gap = torch.tensor([-1.0, -3.0, 5.0, 0.0, 2.0])
    index = torch.tensor([0, 0, 0, 1, 1])
    active = torch.tensor([True, True, True, False, False])  # sample 1 has no teacher
    out = center_per_sample(gap, index, active)
    # sample 0's mean is 1/3: a sum, a division, a difference, and the literals' rounding
    assert_close(out, torch.tensor([-4 / 3, -10 / 3, 14 / 3, 0.0, 0.0]), torch.float32, 4)
    # a uniformly less confident teacher no longer penalizes length: the centred values sum to 0 (two more sums)
    assert_close(float(out[:3].sum()), 0.0, torch.float32, 6, 14 / 3)
    assert clip_advantages(torch.tensor([-5.0, 0.5, 9.0]), 2.0).tolist() == [-2.0, 0.5, 2.0]
    assert clip_advantages(torch.tensor([-5.0]), 0.0).tolist() == [-5.0]


def test_shaped_opd_centres_over_the_trained_tokens_of_samples_with_a_teacher():
    """Where the loss mask and the teacher disagree (a tool's output inside a response: a teacher, no loss), the
    mean is over the trained tokens, so each trained response's OPD advantages sum to 0. Values chosen to be exact
    in fp32: every sum, mean and difference below is a small integer."""
    from clawr1.algo.advantages import center_per_sample, opd_token_advantages, shaped_opd_advantages

    teacher = torch.tensor([-7.0, -1.0, -1.0, -2.0, -2.0, -1.0, -3.0])
    baseline = torch.tensor([-1.0, -2.0, -4.0, -1.0, -1.0, -1.0, -1.0])  # gaps -6 1 3 | -1 -1 | 0 -2
    has_teacher = torch.tensor([True, True, True, False, False, True, True])  # sample 1 has no teacher
    loss_mask = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # sample 0's first token is not trained
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2])

    def shaped(center: bool, clip: float) -> list[float]:
        return shaped_opd_advantages(teacher, baseline, has_teacher, loss_mask, index, center, clip).tolist()

    assert shaped(False, 0.0) == [0.0, 1.0, 3.0, 0.0, 0.0, 0.0, -2.0]
    assert shaped(True, 0.0) == [0.0, -1.0, 1.0, 0.0, 0.0, 1.0, -1.0]  # sample 0's mean is 2, not -2/3
    assert shaped(True, 0.5) == [0.0, -0.5, 0.5, 0.0, 0.0, 0.5, -0.5]
    # the other rule (centring over every token of a sample with a teacher: sample 0's mean -2/3) leaves its
    # trained tokens at 5/3 and 11/3, summing to 16/3: the length bias centring is there to remove
    other = center_per_sample(opd_token_advantages(teacher, baseline, has_teacher), index, has_teacher)
    assert_close(float(other[1:3].sum()), 16 / 3, torch.float32, 4)


def test_signal_auc_counts_ties_half():
    from clawr1.algo.advantages import signal_auc

    assert signal_auc([3.0, 1.0, 2.0, 0.0], [1, -1, 1, -1]) == (1.0, 2)
    assert signal_auc([1.0, 1.0], [1, -1]) == (0.5, 1)
    assert signal_auc([1.0, 2.0], [1, 1]) == (None, 0)  # one class: nothing to sort


def test_opd_gate_closes_only_on_evidence_that_the_teacher_disagrees_with_the_scores():
    import random

    from clawr1.algo.advantages import opd_gate

    rng = random.Random(0)
    rewards = [rng.choice((1.0, -1.0)) for _ in range(200)]
    agreeing = [r + rng.gauss(0, 1.0) for r in rewards]  # AUC about 0.92
    random_gaps = [rng.gauss(0, 1.0) for _ in rewards]
    inverted = [-g for g in agreeing]
    assert opd_gate(agreeing, rewards) == 1.0
    assert opd_gate(random_gaps, rewards) == 0.0 and opd_gate(inverted, rewards) == 0.0
    assert opd_gate(inverted[:20], rewards[:20]) == 1.0  # under 16 of a class: too little to tell, OPD stays on
    # a judge flipping 30% of its scores blurs a good teacher's AUC toward 0.5, but 200 samples still show it
    noisy = [-r if rng.random() < 0.3 else r for r in rewards]
    assert opd_gate(agreeing, noisy) == 1.0


def test_balance_scales_are_one_over_each_signals_spread():
    rl = torch.tensor([2.0, -2.0, 2.0, -2.0])  # std 2
    opd = torch.tensor([0.0, 0.0, 0.0, 4.0])  # mean 1, std sqrt(3)
    s_rl, s_opd = balance_scales(rl, opd)
    # in float64: mean, squares, sum, division, sqrt, reciprocal
    assert_close([s_rl, s_opd], [0.5, 1 / 3**0.5], torch.float64, 6)
    # one token, or no spread: nothing to scale by
    assert balance_scales(torch.tensor([5.0]), torch.zeros(0)) == (1.0, 1.0)
    assert balance_scales(torch.full((6,), 0.7), torch.tensor([1.0, 1.0])) == (1.0, 1.0)


def test_the_contrastive_gap_is_what_the_hint_changes_in_the_teacher():
    """algo.opd_baseline=teacher: the hinted teacher against itself without the hint. A hint that changes nothing
    gives exactly 0 on every token, however far the student has moved from the teacher; a hint that makes the
    teacher surer of a token gives it a positive advantage, less sure a negative one."""
    student = torch.tensor([-0.1, -0.2, -4.0, -0.3])  # a policy that has learned away from its base
    unhinted = torch.tensor([-2.0, -1.0, -0.5, -3.0])
    index, trained, scored = torch.tensor([0, 0, 1, 1]), torch.ones(4), torch.ones(4, dtype=torch.bool)
    for center, clip in ((False, 0.0), (True, 0.0), (True, 0.5)):
        assert shaped_opd_advantages(unhinted, unhinted, scored, trained, index, center, clip).tolist() == [0.0] * 4
        # against the student, the same teacher pulls every token back toward the base
        assert shaped_opd_advantages(unhinted, student, scored, trained, index, False, 0.0).abs().min() > 0.3
    hinted = torch.tensor([-0.5, -1.0, -2.5, -3.0])  # the hint favours token 0 and disfavours token 2
    gap = shaped_opd_advantages(hinted, unhinted, scored, trained, index, False, 0.0)
    assert gap.tolist() == [1.5, 0.0, -2.0, 0.0]
