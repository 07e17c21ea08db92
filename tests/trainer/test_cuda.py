"""The GPU path: CUDA, bf16, TransformerEngine when installed, megatron's distributed optimizer.

Skipped on machines without CUDA (CI). Run on a GPU machine with `pytest -m cuda`.
"""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.cuda


def test_bf16_step_on_cuda_matches_fp32_logprobs(tiny_model, tmp_path):
    from clawr1.config import AlgoConfig, TrainerConfig
    from clawr1.trainer.main import use_transformer_engine
    from clawr1.trainer.megatron_setup import init_parallel
    from clawr1.trainer.model import build_policy, pack, packed_logprobs
    from clawr1.trainer.optim import MegatronDistributedAdam, wrap_ddp
    from clawr1.trainer.step import train_step
    from tests.trainer.test_parallel import synthetic_samples

    init_parallel(tp=1, seed=0)
    use_te = use_transformer_engine("auto")
    samples = synthetic_samples(8)
    packed = pack([s.tokens for s in samples], [s.prompt_len for s in samples])
    fp32 = build_policy(tiny_model)
    fp32.model.cuda()
    bf16 = build_policy(tiny_model, dtype=torch.bfloat16, use_te=use_te)
    bf16.model.cuda()
    with torch.no_grad():
        ref, got = packed_logprobs(fp32, packed), packed_logprobs(bf16, packed)
    assert (ref - got).abs().mean().item() < 5e-2  # bf16 weights: agreement to bf16 precision
    ddp = wrap_ddp(bf16.model)
    opt = MegatronDistributedAdam(ddp, TrainerConfig(lr=1e-4), total_steps=10, bf16=True)
    stats = train_step(bf16, opt, samples, AlgoConfig(), max_tokens_per_microbatch=4096)
    assert torch.isfinite(torch.tensor(stats["pg_loss"])) and stats["grad_norm"] > 0


def test_per_user_adapters_train_on_a_frozen_bf16_base_on_cuda(tiny_model, megatron_tp1):
    """LoRA's CUDA path: fp32 adapters hooked onto bf16 linears, two users' adapters in one step."""
    from clawr1.config import AlgoConfig, TrainerConfig
    from clawr1.trainer.lora import TARGETS, LoraAdapters, LoraShape
    from clawr1.trainer.model import build_policy
    from clawr1.trainer.optim import SlotAdamW
    from clawr1.trainer.step import train_step
    from tests.trainer.test_parallel import synthetic_samples

    policy = build_policy(tiny_model, dtype=torch.bfloat16)
    policy.model.cuda().requires_grad_(False)
    policy.lora = LoraAdapters(policy.model, policy.arch, LoraShape(4, 8.0, TARGETS, 2), 1, 0, seed=0)
    policy.lora.cuda()
    opt = SlotAdamW([policy.lora.slot_parameters(k) for k in range(2)], TrainerConfig(lr=1e-3), 10, 1, 1)
    samples = synthetic_samples(8, seed=21, topk=0)
    for i, s in enumerate(samples):
        s.adapter_slot = i % 2
    base = [p.detach().clone() for p in policy.model.parameters()]
    adapters = [p.detach().clone() for p in policy.lora.parameters()]
    stats = train_step(policy, opt, samples, AlgoConfig(w_rl=1.0, w_opd=0.5), max_tokens_per_microbatch=100_000)
    assert stats["slots_stepped"] == 2 and math.isfinite(stats["pg_loss"])
    assert stats["grad_norm_slot0"] > 0 and stats["grad_norm_slot1"] > 0
    assert all(torch.equal(a, b) for a, b in zip(base, policy.model.parameters()))  # the base stays frozen
    assert any(not torch.equal(a, b) for a, b in zip(adapters, policy.lora.parameters()))
