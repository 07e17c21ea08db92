"""trainer.precision=bf16 on CPU: a frozen bf16 base under fp32 LoRA adapters (their gradients and AdamW in fp32),
the fallback to fp32 where the CPU has no bf16 instructions, and log-probs computed only at response tokens."""
from __future__ import annotations

import copy
import logging

import pytest
import torch

from clawr1.config import AlgoConfig, load_config
from clawr1.trainer.main import build, cpu_base_dtype
from clawr1.trainer.model import build_policy, full_logits, pack, packed_logprobs_entropy
from clawr1.trainer.optim import SlotAdamW
from clawr1.trainer.step import train_step
from tests.numerics import assert_all_close, assert_close, forward_depth, grad_depth, magnitude_of
from tests.trainer.test_lora import ROWS, GradRecorder, attach
from tests.trainer.test_parallel import synthetic_samples


B_SCALE = 40.0


def lora_config(tiny_model, *overrides: str):
    return load_config(None, [f"model.path={tiny_model}", "lora.enabled=true", "lora.rank=4", "trainer.precision=bf16",
                              *overrides])


def one_step(tiny_model, dtype: torch.dtype, samples) -> tuple:
    """(the policy, its adapters, their gradients on `samples`, the logits of ROWS) over a base in `dtype`."""
    policy = build_policy(tiny_model, dtype=dtype)
    adapters = attach(policy, seed=3)  # a seeded, non-zero B, scaled up: the adapters move the logits a lot
    with torch.no_grad():
        for b in adapters.b.values():
            b.mul_(B_SCALE)
    recorder = GradRecorder(adapters)
    train_step(policy, recorder, copy.deepcopy(samples), AlgoConfig(w_rl=1.0, w_opd=1.0), max_tokens_per_microbatch=100_000)
    with torch.no_grad():
        logits = full_logits(policy, pack(ROWS, [1, 1]))
    return policy, adapters, recorder.grads, logits


def test_a_bf16_base_under_fp32_adapters_trains_as_the_fp32_reference_within_bf16s_error(tiny_model, megatron_tp1):
    samples = synthetic_samples(6, seed=5, topk=0)
    _, _, ref_grads, ref_logits = one_step(tiny_model, torch.float32, samples)
    policy, adapters, grads, logits = one_step(tiny_model, torch.bfloat16, samples)
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}  # the base really ran in bf16
    assert {p.dtype for p in adapters.parameters()} == {torch.float32}
    assert {g.dtype for g in grads.values()} == {torch.float32}
    assert_close(logits, ref_logits, torch.bfloat16, forward_depth(tiny_model), what="logits")
    assert_all_close(grads, ref_grads, torch.bfloat16, grad_depth(tiny_model), what="adapter gradients")
    # the comparison can fail: the base alone (adapters routed off) is further from the reference than bf16 may be
    with torch.no_grad():
        base = full_logits(policy, pack(ROWS, [1, 1], slots=[-1, -1]))
    with pytest.raises(AssertionError):
        assert_close(base, ref_logits, torch.bfloat16, forward_depth(tiny_model), what="the base alone")


def test_adamw_steps_the_fp32_adapters_over_a_bf16_base_and_keeps_its_state_in_fp32(tiny_model, megatron_tp1):
    cfg = lora_config(tiny_model, "run.cpu_bf16=on")
    policy = build_policy(tiny_model, dtype=torch.bfloat16)
    adapters = attach(policy, seed=3)
    optimizer = SlotAdamW([adapters.slot_parameters(0)], cfg.trainer, 4, 1, 1)
    before = {n: p.detach().clone() for n, p in adapters.named_parameters()}
    train_step(policy, optimizer, synthetic_samples(6, seed=5, topk=0), AlgoConfig(), max_tokens_per_microbatch=100_000)
    assert any(not torch.equal(p, before[n]) for n, p in adapters.named_parameters())
    state = optimizer.slots[0].optimizer.state
    assert state and {t.dtype for s in state.values() for t in s.values() if t.dim()} == {torch.float32}


def test_a_cpu_without_bf16_falls_back_to_fp32_and_says_why(tiny_model, megatron_tp1, caplog):
    cfg = lora_config(tiny_model, "run.cpu_bf16=off")  # as a CPU without avx512_bf16 or AMX would decide
    with caplog.at_level(logging.WARNING, logger="clawr1.trainer"):
        policy, _ = build(cfg, megatron_tp1, tiny_model)
    assert {p.dtype for p in policy.model.parameters()} == {torch.float32}
    assert "bf16 falls back to fp32" in caplog.text and "run.cpu_bf16=off" in caplog.text
    forced = lora_config(tiny_model, "run.cpu_bf16=on")
    assert cpu_base_dtype(forced) == torch.bfloat16


def test_bf16_on_cpu_without_lora_is_refused_with_what_to_set(tiny_model):
    cfg = lora_config(tiny_model, "lora.enabled=false", "run.cpu_bf16=on")
    with pytest.raises(ValueError, match="lora.enabled=true"):
        cpu_base_dtype(cfg)


def test_log_probs_at_response_tokens_only_equal_the_full_computation_with_its_gradients(tiny_model, megatron_tp1):
    """The trainer computes the LM head only where a response token is predicted; the same loss and adapter gradients
    as full logits over every position, then picked at those positions."""
    policy = build_policy(tiny_model)
    adapters = attach(policy, seed=4)
    packed = pack([s.tokens for s in synthetic_samples(4, seed=8, topk=0)],
                  [s.prompt_len for s in synthetic_samples(4, seed=8, topk=0)])
    weights = torch.linspace(-1.0, 2.0, packed.targets.numel())  # any per-token loss weights

    def loss_and_grads(compute) -> tuple[torch.Tensor, torch.Tensor, dict]:
        adapters.zero_grad(set_to_none=True)
        logp, entropy = compute()
        (logp * weights).sum().add(entropy.sum()).backward()
        return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in adapters.named_parameters()}

    def response_only():
        logp, entropy, _ = packed_logprobs_entropy(policy, packed, chunk_tokens=7)  # several chunks
        return logp, entropy

    def full():
        logits = full_logits(policy, packed)[packed.predict_at]
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(1, packed.targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)

    assert packed.targets.numel() < packed.input_ids.numel()  # the prompt tokens are skipped
    logp, entropy, grads = loss_and_grads(response_only)
    ref_logp, ref_entropy, ref_grads = loss_and_grads(full)
    depth = forward_depth(tiny_model)
    assert_close(logp, ref_logp, torch.float32, depth, magnitude=magnitude_of(full_logits(policy, packed)), what="log p")
    assert_close(entropy, ref_entropy, torch.float32, depth, magnitude=magnitude_of(full_logits(policy, packed)),
                 what="entropy")
    assert_all_close(grads, ref_grads, torch.float32, grad_depth(tiny_model), what="adapter gradients")
