"""HF <-> Megatron conversion of the tiny model: exact both ways."""
from __future__ import annotations

import torch

from clawr1.trainer.convert import ArchSpec, hf_to_megatron, megatron_to_hf
from clawr1.trainer.hf_io import load_hf_state


def test_round_trip_is_bit_exact(tiny_model):
    from transformers import AutoConfig

    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(tiny_model))
    hf = load_hf_state(tiny_model)
    back = megatron_to_hf([hf_to_megatron(hf, arch)], arch)
    assert set(back) == set(hf) - {"lm_head.weight"}
    assert all(torch.equal(hf[k], back[k]) for k in back)


def test_tensor_parallel_shards_reassemble_exactly(tiny_model):
    from transformers import AutoConfig

    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(tiny_model))
    hf = load_hf_state(tiny_model)
    shards = [hf_to_megatron(hf, arch, tp_rank=r, tp=2) for r in range(2)]
    qkv = shards[0]["decoder.layers.0.self_attention.linear_qkv.weight"]
    per_rank_rows = (arch.heads + 2 * arch.kv_heads) * arch.head_dim // 2
    assert qkv.shape == (per_rank_rows, arch.hidden)
    back = megatron_to_hf(shards, arch)
    assert all(torch.equal(hf[k], back[k]) for k in back)


def test_megatron_model_holds_the_converted_weights(tiny_model, megatron_tp1):
    from clawr1.trainer.model import build_policy, megatron_state

    policy = build_policy(tiny_model)
    back = megatron_to_hf([megatron_state(policy.model)], policy.arch)
    hf = load_hf_state(tiny_model)
    assert all(torch.equal(hf[k], back[k]) for k in back)


def test_bf16_model_has_bf16_parameters_and_publishes_bf16(tiny_model, megatron_tp1):
    """Without TransformerEngine, megatron's torch-norm fallback makes fp32 norms in a bf16 model: the
    published state then mixes dtypes and megatron's distributed optimizer fails to save its state."""
    from clawr1.trainer.model import build_policy, megatron_state

    policy = build_policy(tiny_model, dtype=torch.bfloat16, use_te=False)
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    published = megatron_to_hf([megatron_state(policy.model)], policy.arch)
    assert {t.dtype for t in published.values()} == {torch.bfloat16}
    hf = load_hf_state(tiny_model)
    assert all(torch.equal(hf[k].to(torch.bfloat16), published[k]) for k in published)
