"""Random tiny HF checkpoints of each supported family, for conversion and parity tests."""
from __future__ import annotations

from pathlib import Path

import torch

COMMON = dict(vocab_size=250, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)


def family_config(name: str, **overrides):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    COMMON = {**globals()["COMMON"], **overrides}
    if name == "qwen2-tied":
        return Qwen2Config(**COMMON, tie_word_embeddings=True, rope_theta=10000.0)
    if name == "qwen2.5-untied":
        return Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=1000000.0)
    if name == "qwen3":
        return Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True, rope_theta=1000000.0)
    if name == "llama3":
        return LlamaConfig(**COMMON, tie_word_embeddings=False, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    raise ValueError(name)


FAMILIES = ["qwen2-tied", "qwen2.5-untied", "qwen3", "llama3"]


def save_random_model(name: str, out: Path, seed: int = 0, **overrides) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(name, **overrides), dtype=torch.float32)
    with torch.no_grad():  # norms start at 1.0 in HF: randomize them so a swapped norm would show
        for n, p in model.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
            elif "bias" in n:
                p.normal_(0, 0.1)
    model.save_pretrained(out, safe_serialization=True)
    return out
