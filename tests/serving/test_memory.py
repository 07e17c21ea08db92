"""The embedded engine works out its memory before loading: a context of serve.context_length, not the model's
maximum, and a clear refusal (never the kernel's kill) when the weights and one whole context exceed the budget."""
from __future__ import annotations

import httpx
import pytest

from clawr1.model_path import CPU_DEFAULT_CONTEXT, engine_context
from clawr1.serving.memory import plan_engine
from tests.conftest import make_config


def test_the_context_is_the_configured_one_or_at_most_the_cpu_default():
    assert engine_context(8192, 0) == CPU_DEFAULT_CONTEXT == 4096
    assert engine_context(1024, 0) == 1024
    assert engine_context(40960, 2048) == 2048


def test_the_plan_counts_the_weights_and_the_cache_exactly(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    c = model.config
    plan = plan_engine(tiny_model, "float32", slots=6, context_length=100)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    assert plan.context == 100 and plan.slots == 6
    assert plan.kv_cache_bytes == 2 * c.num_hidden_layers * 6 * 100 * c.num_key_value_heads * head_dim * 4
    stored = sum(p.numel() for p in model.state_dict().values()) - (
        model.lm_head.weight.numel() if c.tie_word_embeddings else 0)  # tied: one tensor on disk
    assert plan.weights_bytes == stored * 4
    assert plan_engine(tiny_model, "bfloat16", 6, 100).total_bytes * 2 == plan.total_bytes
    # serve.cpu_prepack holds a second copy of the weights, packed for oneDNN
    assert plan_engine(tiny_model, "float32", 6, 100, prepacked=True).weights_bytes == 2 * plan.weights_bytes


def test_an_engine_that_does_not_fit_refuses_to_start_and_says_why(tiny_model, tmp_path, loops):
    import torch

    from clawr1.serving.packed_linear import prepacked_dtype_ok

    prepacked = prepacked_dtype_ok(torch.float32, torch.device("cpu"))  # serve.cpu_prepack, as the engine decides
    plan = plan_engine(tiny_model, "float32", slots=1, context_length=0, prepacked=prepacked)
    budget = (plan.weights_bytes + plan.context * plan.token_bytes) / 0.85 / (1 << 30) * 0.9  # 10% short
    cfg = make_config(tmp_path, f"serve.memory_budget_gb={budget:.6f}")
    engine = loops(cfg, "serve")
    assert engine.proc.wait(timeout=120) == 2
    log = engine.log_path.read_text()
    assert "the engine needs" in log and f"serve.memory_budget_gb is {budget:.2f} GiB" in log
    assert "one request of" in log and "serve.context_length" in log


def test_the_gateway_refuses_a_prompt_longer_than_the_engines_context(tiny_model, tmp_path, loops):
    cfg = make_config(tmp_path, "serve.context_length=48")
    engine, gateway = loops(cfg, "serve"), loops(cfg, "gateway")
    engine.wait_http(f"{cfg.engine_url}/health")
    gateway.wait_http(f"{cfg.gateway_url}/health")
    assert httpx.get(f"{cfg.engine_url}/get_server_info").json()["context_length"] == 48
    long = httpx.post(f"{cfg.gateway_url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "three plus four " * 30}], "max_tokens": 4})
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    short = httpx.post(f"{cfg.gateway_url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert short.status_code == 200


def test_beside_the_trainer_the_engines_and_the_trainer_must_fit_the_card_together(tiny_model):
    from clawr1.serving.memory import (CUDA_CONTEXT_BYTES, GIB, TRAINER_BYTES_PER_PARAM, EngineMemoryError,
                                       check_colocation, parameter_count, trainer_bytes)

    need = trainer_bytes(tiny_model, "bf16", microbatch_tokens=1024, logprob_chunk_tokens=256)
    assert need > parameter_count(tiny_model) * TRAINER_BYTES_PER_PARAM["bf16"] + CUDA_CONTEXT_BYTES
    assert trainer_bytes(tiny_model, "bf16", 2048, 256) > need  # a larger micro-batch keeps more activations
    total = 2 * (GIB + CUDA_CONTEXT_BYTES) + need
    check_colocation(GIB, engines=2, trainer_need=need, device_total=total)  # exactly fits
    with pytest.raises(EngineMemoryError) as refused:
        check_colocation(GIB, engines=2, trainer_need=need, device_total=total - 1)
    text = str(refused.value)
    assert "2 engine(s) x 1.00 GiB" in text and f"the trainer's {need / GIB:.2f} GiB" in text
    assert f"the device has {(total - 1) / GIB:.2f} GiB" in text and "serve.memory_budget_gb" in text


def test_only_a_cuda_engine_on_an_unpartitioned_machine_shares_the_trainers_gpu(tmp_path):
    from clawr1.serving.main import engines_beside_trainer

    assert engines_beside_trainer(make_config(tmp_path, "serve.device=cpu")) == 0
    assert engines_beside_trainer(make_config(tmp_path, "serve.device=cuda", "judge.teacher=frozen")) == 2
    assert engines_beside_trainer(make_config(tmp_path, "serve.device=cuda", "cluster.actor_gpus=[0]",
                                              "cluster.rollout_gpus=[1]")) == 0


def test_a_colocated_engine_without_a_budget_is_refused(tiny_model, tmp_path):
    from clawr1.serving.main import check_memory
    from clawr1.serving.memory import EngineMemoryError

    cfg = make_config(tmp_path, "serve.device=cuda")
    plan = plan_engine(tiny_model, "float32", slots=2, context_length=64)
    with pytest.raises(EngineMemoryError, match="set serve.memory_budget_gb"):
        check_memory(cfg, tiny_model, plan)
