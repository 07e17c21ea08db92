"""Every supported family: exact HF<->Megatron round trip, and Megatron logits equal transformers logits."""
from __future__ import annotations

import pytest
import torch

from clawr1.trainer.convert import ArchSpec, hf_to_megatron, megatron_to_hf
from clawr1.trainer.hf_io import load_hf_state
from tests.numerics import assert_close, forward_depth
from tests.trainer.families import FAMILIES, save_random_model


@pytest.fixture(scope="module", params=FAMILIES)
def family_model(request, tmp_path_factory):
    return request.param, save_random_model(request.param, tmp_path_factory.mktemp(request.param))


def test_round_trip_is_bit_exact(family_model):
    from transformers import AutoConfig

    name, path = family_model
    arch = ArchSpec.from_hf(AutoConfig.from_pretrained(path))
    hf = load_hf_state(path)
    for tp in (1, 2):
        back = megatron_to_hf([hf_to_megatron(hf, arch, r, tp) for r in range(tp)], arch)
        expected = set(hf) - ({"lm_head.weight"} if arch.tied else set())
        assert set(back) == expected, name
        assert all(torch.equal(hf[k], back[k]) for k in back), name


def test_megatron_logits_equal_transformers_logits(family_model, megatron_tp1):
    from transformers import AutoModelForCausalLM

    from clawr1.trainer.model import build_policy, full_logits, megatron_state, pack

    name, path = family_model
    policy = build_policy(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 250, (n,), generator=g).tolist() for n in (37, 80, 5)]  # 80 > 64: rope scaling matters
    ours = full_logits(policy, pack(seqs, [1, 1, 1]))
    with torch.no_grad():
        theirs = torch.cat([hf(input_ids=torch.tensor([s])).logits[0] for s in seqs])
    # megatron and transformers: the same layers, the same sums in another order
    assert_close(ours, theirs, torch.float32, forward_depth(path), what=name)
    back = megatron_to_hf([megatron_state(policy.model)], policy.arch)
    hf_state = load_hf_state(path)
    assert all(torch.equal(hf_state[k], back[k]) for k in back), name
