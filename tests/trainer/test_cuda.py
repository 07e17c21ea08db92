"""The GPU path: CUDA, bf16, TransformerEngine when installed, megatron's distributed optimizer.

Skipped on machines without CUDA (CI). Run on a GPU machine with `pytest -m cuda`.
"""
from __future__ import annotations

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
