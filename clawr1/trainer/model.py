"""The policy as a megatron-core GPTModel, and a packed forward that returns per-token log-probs.

Samples of different lengths are packed into one row: a block-diagonal causal
mask keeps them apart and each one's rotary positions restart at 0, so a
packed row computes exactly what separate rows would, without padding.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from clawr1.trainer.convert import ArchSpec, hf_to_megatron


def transformer_config(a: ArchSpec, tp: int, dtype: torch.dtype):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=a.num_layers, hidden_size=a.hidden, num_attention_heads=a.heads, num_query_groups=a.kv_heads,
        kv_channels=a.head_dim, ffn_hidden_size=a.ffn, normalization="RMSNorm", layernorm_epsilon=a.norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=a.qkv_bias,
        qk_layernorm=a.qk_norm, tensor_model_parallel_size=tp, use_cpu_initialization=True, params_dtype=dtype,
        bf16=dtype == torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, attention_softmax_in_fp32=True,
    )


def layer_spec(a: ArchSpec, use_te: bool):
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=a.qk_norm)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=a.qk_norm, normalization="RMSNorm")


def padded_vocab_size(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def hf_inv_freq(hf_config) -> Tensor:
    """The HF model's rotary inverse frequencies (any scaling rule it applies), for exact parity."""
    family = hf_config.model_type
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    cls = next(getattr(module, n) for n in dir(module) if n.endswith("RotaryEmbedding"))
    return cls(hf_config).inv_freq.float()


@dataclass
class Policy:
    model: torch.nn.Module  # megatron GPTModel
    arch: ArchSpec
    hf_config: object
    tp: int

    @property
    def vocab(self) -> int:
        return self.arch.vocab


def build_policy(hf_path: str | Path, tp: int = 1, tp_rank: int = 0, dtype: torch.dtype = torch.float32,
                 use_te: bool = False) -> Policy:
    """GPTModel with the HF checkpoint's weights (this rank's shard)."""
    from megatron.core.models.gpt import GPTModel
    from transformers import AutoConfig

    from clawr1.trainer.hf_io import load_hf_state

    hf_config = AutoConfig.from_pretrained(hf_path)
    a = ArchSpec.from_hf(hf_config)
    vocab = padded_vocab_size(a.vocab, tp)
    model = GPTModel(
        config=transformer_config(a, tp, dtype), transformer_layer_spec=layer_spec(a, use_te), vocab_size=vocab,
        max_sequence_length=a.max_positions, pre_process=True, post_process=True,
        share_embeddings_and_output_weights=a.tied, position_embedding_type="rope", rotary_base=int(a.rope_theta),
    )
    with torch.no_grad():
        model.rotary_pos_emb.inv_freq.copy_(hf_inv_freq(hf_config))
    state = hf_to_megatron(load_hf_state(Path(hf_path)), a, tp_rank, tp, padded_vocab=vocab)
    load_megatron_state(model, state)
    return Policy(model=model, arch=a, hf_config=hf_config, tp=tp)


def load_megatron_state(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    own = {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"megatron state does not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name, t in state.items():
            if own[name].shape != t.shape:
                raise ValueError(f"{name}: shape {tuple(t.shape)} does not fit {tuple(own[name].shape)}")
            own[name].copy_(t)


def megatron_state(model: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.detach() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


# ---------------------------------------------------------------- packed forward
@dataclass
class Packed:
    """Samples laid end to end in one row."""

    input_ids: Tensor  # [1, S]
    position_ids: Tensor  # [1, S]
    attention_mask: Tensor  # [1, 1, S, S] bool, True where attention is NOT allowed
    predict_at: Tensor  # [T] positions whose next-token prediction is a response token
    targets: Tensor  # [T] those response tokens
    sample_index: Tensor  # [T] which sample each response token belongs to


def pack(token_lists: list[list[int]], prompt_lens: list[int]) -> Packed:
    ids, pos, predict_at, targets, owner = [], [], [], [], []
    offset = 0
    for i, (toks, p) in enumerate(zip(token_lists, prompt_lens)):
        n = len(toks)
        ids += toks
        pos += range(n)
        predict_at += range(offset + p - 1, offset + n - 1)
        targets += toks[p:]
        owner += [i] * (n - p)
        offset += n
    size = offset
    allowed = torch.zeros(size, size, dtype=torch.bool)
    offset = 0
    for toks in token_lists:
        n = len(toks)
        allowed[offset:offset + n, offset:offset + n] = torch.ones(n, n, dtype=torch.bool).tril()
        offset += n
    return Packed(
        input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]), attention_mask=~allowed[None, None],
        predict_at=torch.tensor(predict_at), targets=torch.tensor(targets), sample_index=torch.tensor(owner),
    )


def hidden_states(policy: Policy, packed: Packed) -> Tensor:
    """Final hidden states [S, hidden] of a packed row."""
    m = policy.model
    device = next(m.parameters()).device
    ids, pos = packed.input_ids.to(device), packed.position_ids.to(device)
    emb = m.embedding(input_ids=ids, position_ids=pos)  # [S, 1, H]
    freqs = m.rotary_pos_emb(int(pos.max()) + 1)  # [max_pos, 1, 1, D]
    rotary = freqs[pos[0]]  # per-token positions: restart at 0 for every packed sample
    h = m.decoder(hidden_states=emb, attention_mask=packed.attention_mask.to(device), rotary_pos_emb=rotary)
    return h[:, 0]


def token_logprobs(policy: Policy, hidden: Tensor, targets: Tensor, temperature: float = 1.0,
                   chunk_tokens: int = 1024) -> Tensor:
    """log p(target | context) for each row of `hidden` ([T, H]), computed in chunks of tokens.

    Works under tensor parallelism: the output layer holds a vocabulary shard and
    megatron's vocab-parallel cross-entropy combines the shards.
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    m = policy.model
    weight = m.shared_embedding_or_output_weight() if m.share_embeddings_and_output_weights else None
    out = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h = hidden[start:start + chunk_tokens][:, None]  # [t, 1, H]
        logits, _ = m.output_layer(h, weight=weight)
        logits = _mask_padded_vocab(logits.float() / temperature, policy)
        tgt = targets[start:start + chunk_tokens].to(logits.device)[:, None]
        out.append(-vocab_parallel_cross_entropy(logits, tgt)[:, 0])
    return torch.cat(out) if out else hidden.new_zeros(0)


def _mask_padded_vocab(logits: Tensor, policy: Policy) -> Tensor:
    """Rows added to divide the vocabulary over TP ranks must never get probability."""
    shard = logits.shape[-1]
    from megatron.core import parallel_state

    start = parallel_state.get_tensor_model_parallel_rank() * shard
    if start + shard <= policy.vocab:
        return logits
    ids = torch.arange(start, start + shard, device=logits.device)
    return logits.masked_fill(ids >= policy.vocab, float("-inf"))


def packed_logprobs(policy: Policy, packed: Packed, temperature: float = 1.0) -> Tensor:
    hidden = hidden_states(policy, packed)
    return token_logprobs(policy, hidden[packed.predict_at.to(hidden.device)], packed.targets, temperature)
