"""One optimizer step on a batch of Samples: pack, forward, advantages, PPO loss, backward, step."""
from __future__ import annotations

from typing import Any

import torch

from clawr1.algo.advantages import combined_token_advantages, opd_token_advantages, rl_token_advantages
from clawr1.algo.losses import ppo_clipped_token_loss, token_mean
from clawr1.config import AlgoConfig
from clawr1.protocol import Sample
from clawr1.trainer.model import Policy, pack, packed_logprobs
from clawr1.trainer.parallel import all_reduce_sum, dp_shard


def micro_batches(samples: list[Sample], max_tokens: int) -> list[list[Sample]]:
    """Consecutive samples packed up to `max_tokens` each (a longer sample gets a micro-batch of its own)."""
    out: list[list[Sample]] = []
    current, size = [], 0
    for s in samples:
        if current and size + len(s.tokens) > max_tokens:
            out.append(current)
            current, size = [], 0
        current.append(s)
        size += len(s.tokens)
    if current:
        out.append(current)
    return out


def _flat(samples: list[Sample], field: str, fill: float = 0.0) -> torch.Tensor:
    values: list[float] = []
    for s in samples:
        v = getattr(s, field)
        values += v if v is not None else [fill] * s.response_len
    return torch.tensor(values, dtype=torch.float32)


def micro_batch_loss(policy: Policy, samples: list[Sample], algo: AlgoConfig, total_tokens: int,
                     chunk_tokens: int = 1024) -> tuple[torch.Tensor, dict]:
    packed = pack([s.tokens for s in samples], [s.prompt_len for s in samples])
    logp = packed_logprobs(policy, packed, algo.temperature, chunk_tokens)
    device = logp.device
    old = logp.detach()  # one update per batch: the policy that sampled "old" is the one being trained
    idx = packed.sample_index.to(device)
    mask = _flat(samples, "loss_mask").to(device)
    rewards = torch.tensor([s.reward if s.reward is not None else 0.0 for s in samples], device=device)
    has_reward = torch.tensor([s.reward is not None for s in samples], device=device)
    has_teacher = torch.tensor([s.teacher_logprobs is not None for s in samples], device=device)[idx]
    a_rl = rl_token_advantages(rewards, has_reward, idx)
    a_opd = opd_token_advantages(_flat(samples, "teacher_logprobs").to(device), old, has_teacher)
    adv = combined_token_advantages(a_rl, a_opd, algo.w_rl, algo.w_opd)
    token_loss, low, high = ppo_clipped_token_loss(logp, old, adv, algo.eps_clip_low, algo.eps_clip_high)
    loss = token_mean(token_loss, mask, total_tokens)
    rollout = _flat(samples, "rollout_logprobs").to(device)
    sums = {
        "pg_loss": float(loss.detach()),
        "clip_low_tokens": float((low.float() * mask).sum()), "clip_high_tokens": float((high.float() * mask).sum()),
        "logprob_abs_diff_sum": float(((rollout - old).abs() * mask).sum()),
        "adv_rl_sum": float((a_rl * mask).sum()), "adv_opd_sum": float((a_opd * mask).sum()),
        "opd_tokens": float((has_teacher.float() * mask).sum()),
    }
    return loss, sums


def train_step(policy: Policy, optimizer, samples: list[Sample], algo: AlgoConfig, max_tokens_per_microbatch: int,
               chunk_tokens: int = 1024, dp_rank: int = 0, dp: int = 1) -> dict[str, Any]:
    """One optimizer step on the whole batch; with dp > 1, this rank works on its share of it."""
    total_tokens = int(sum(sum(s.loss_mask) for s in samples))  # of the whole batch, on every rank
    optimizer.zero_grad()
    keys = ["pg_loss", "clip_low_tokens", "clip_high_tokens", "logprob_abs_diff_sum", "adv_rl_sum", "adv_opd_sum",
            "opd_tokens"]
    sums = dict.fromkeys(keys, 0.0)
    for mb in micro_batches(dp_shard(samples, dp_rank, dp), max_tokens_per_microbatch):
        loss, part = micro_batch_loss(policy, mb, algo, total_tokens, chunk_tokens)
        loss.backward()
        for k, v in part.items():
            sums[k] += v
    sums = dict(zip(keys, all_reduce_sum([sums[k] for k in keys], dp)))
    opt = optimizer.step()
    rewards = [s.reward for s in samples if s.reward is not None]
    n_tok = max(total_tokens, 1)
    return {
        "pg_loss": sums["pg_loss"], **opt,
        "clip_frac_low": sums["clip_low_tokens"] / n_tok, "clip_frac_high": sums["clip_high_tokens"] / n_tok,
        "logprob_abs_diff": sums["logprob_abs_diff_sum"] / n_tok,
        "adv_rl_mean": sums["adv_rl_sum"] / n_tok,
        "adv_opd_mean": sums["adv_opd_sum"] / max(sums["opd_tokens"], 1.0),
        "samples": len(samples), "response_tokens": total_tokens, "tokens": sum(len(s.tokens) for s in samples),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward_frac": len(rewards) / len(samples),
        "hint_rate": sum(s.teacher_logprobs is not None for s in samples) / len(samples),
    }
