"""Hand-computed values for the issue-2 objective: combined advantage under a PPO clipped loss."""
import torch

from clawr1.algo.advantages import combined_token_advantages, opd_token_advantages, rl_token_advantages
from clawr1.algo.losses import ppo_clipped_token_loss, token_mean


def test_missing_branches_contribute_exactly_zero():
    idx = torch.tensor([0, 0, 1, 1, 1])
    rl = rl_token_advantages(torch.tensor([-1.0, 0.0]), torch.tensor([True, False]), idx)
    assert rl.tolist() == [-1.0, -1.0, 0.0, 0.0, 0.0]
    teacher = torch.tensor([-0.5, -2.0, 0.0, 0.0, 0.0])
    old = torch.tensor([-1.0, -1.0, -3.0, -3.0, -3.0])
    opd = opd_token_advantages(teacher, old, torch.tensor([True, True, False, False, False]))
    assert opd.tolist() == [0.5, -1.0, 0.0, 0.0, 0.0]  # teacher more confident -> positive
    assert combined_token_advantages(rl, opd, 2.0, 0.5).tolist() == [-1.75, -2.5, 0.0, 0.0, 0.0]


def test_ppo_clip_values():
    old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 1.0]))
    adv = torch.tensor([1.0, -1.0, -1.0, 2.0])
    loss, low, high = ppo_clipped_token_loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # r=1.5,A=1: min(1.5, 1.28) = 1.28 -> -1.28 (clipped high); r=1.5,A=-1: min(-1.5,-1.28) = -1.5 -> 1.5
    # r=0.5,A=-1: min(-0.5, -0.8) = -0.8 -> 0.8 (clipped low); r=1,A=2 -> -2
    assert torch.allclose(loss, torch.tensor([-1.28, 1.5, 0.8, -2.0]))
    assert high.tolist() == [True, False, False, False] and low.tolist() == [False, False, True, False]


def test_token_mean_divides_by_the_whole_batch():
    assert token_mean(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 0.0, 1.0]), total_tokens=8).item() == 0.5
