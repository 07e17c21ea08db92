"""Exact weight conversion between HF checkpoints and megatron-core's GPTModel.

Families: Qwen2/Qwen2.5 (qkv bias), Qwen3 (q/k norm, no bias), Llama 3.
Under tensor parallelism each rank converts to, and from, its own shard:
column-parallel weights (qkv, fc1, embeddings, output layer) split along rows,
row-parallel weights (attention proj, fc2) along columns.

Megatron's fused qkv weight is laid out by query group: for each group, its
query heads, then its key head, then its value head. Its fc1 weight is the
gate projection stacked on the up projection (per shard under TP).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from clawr1.model_dir import SUPPORTED_FAMILIES



@dataclass(frozen=True)
class ArchSpec:
    """The facts of an HF config that the conversion and model build need."""

    family: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    norm_eps: float
    rope_theta: float
    max_positions: int

    @classmethod
    def from_hf(cls, cfg) -> "ArchSpec":
        family = cfg.model_type
        if family not in SUPPORTED_FAMILIES:
            raise ValueError(f"model_type {family!r} is not supported; supported: {', '.join(SUPPORTED_FAMILIES)}")
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        return cls(
            family=family, num_layers=cfg.num_hidden_layers, hidden=cfg.hidden_size, heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads, head_dim=head_dim, ffn=cfg.intermediate_size, vocab=cfg.vocab_size,
            tied=bool(cfg.tie_word_embeddings), qkv_bias=family == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            qk_norm=family == "qwen3", norm_eps=cfg.rms_norm_eps,
            rope_theta=float(theta or getattr(cfg, "rope_theta", 10000.0)), max_positions=cfg.max_position_embeddings,
        )


def _shard(t: Tensor, dim: int, tp_rank: int, tp: int) -> Tensor:
    return t.chunk(tp, dim=dim)[tp_rank].clone()


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, a: ArchSpec) -> Tensor:
    """HF's q, k and v rows (weights, biases, or LoRA B) -> megatron's fused qkv rows, query group by group."""
    per_group = a.heads // a.kv_heads
    tail = q.shape[1:]
    q = q.reshape(a.kv_heads, per_group * a.head_dim, *tail)
    k = k.reshape(a.kv_heads, a.head_dim, *tail)
    v = v.reshape(a.kv_heads, a.head_dim, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def split_qkv(qkv: Tensor, a: ArchSpec, kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """Fused qkv rows holding `kv_heads` query groups (one TP shard's) -> their q, k and v rows."""
    per_group = a.heads // a.kv_heads
    tail = qkv.shape[1:]
    g = qkv.reshape(kv_heads, (per_group + 2) * a.head_dim, *tail)
    q, k, v = g.split([per_group * a.head_dim, a.head_dim, a.head_dim], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def hf_to_megatron(hf: dict[str, Tensor], a: ArchSpec, tp_rank: int = 0, tp: int = 1,
                   padded_vocab: int | None = None) -> dict[str, Tensor]:
    """HF state dict -> this TP rank's megatron state dict (local layer spec names)."""
    if a.kv_heads % tp:
        raise ValueError(f"{a.kv_heads} key/value heads cannot be split over tensor_parallel={tp}")
    out: dict[str, Tensor] = {}
    emb = _pad_vocab(hf["model.embed_tokens.weight"], padded_vocab)
    out["embedding.word_embeddings.weight"] = _shard(emb, 0, tp_rank, tp)
    for i in range(a.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"].clone()
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"].clone()
        att = h + "self_attn."
        qkv = fuse_qkv(hf[att + "q_proj.weight"], hf[att + "k_proj.weight"], hf[att + "v_proj.weight"], a)
        out[m + "self_attention.linear_qkv.weight"] = _shard(qkv, 0, tp_rank, tp)
        if a.qkv_bias:
            b = fuse_qkv(hf[att + "q_proj.bias"], hf[att + "k_proj.bias"], hf[att + "v_proj.bias"], a)
            out[m + "self_attention.linear_qkv.bias"] = _shard(b, 0, tp_rank, tp)
        if a.qk_norm:
            out[m + "self_attention.q_layernorm.weight"] = hf[att + "q_norm.weight"].clone()
            out[m + "self_attention.k_layernorm.weight"] = hf[att + "k_norm.weight"].clone()
        out[m + "self_attention.linear_proj.weight"] = _shard(hf[att + "o_proj.weight"], 1, tp_rank, tp)
        gate = _shard(hf[h + "mlp.gate_proj.weight"], 0, tp_rank, tp)
        up = _shard(hf[h + "mlp.up_proj.weight"], 0, tp_rank, tp)
        out[m + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[m + "mlp.linear_fc2.weight"] = _shard(hf[h + "mlp.down_proj.weight"], 1, tp_rank, tp)
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"].clone()
    if not a.tied:
        out["output_layer.weight"] = _shard(_pad_vocab(hf["lm_head.weight"], padded_vocab), 0, tp_rank, tp)
    return out


def megatron_to_hf(shards: list[dict[str, Tensor]], a: ArchSpec) -> dict[str, Tensor]:
    """All TP ranks' megatron state dicts (in rank order) -> one HF state dict."""
    tp = len(shards)
    s0 = shards[0]
    cat = lambda name, dim: torch.cat([s[name] for s in shards], dim=dim)  # noqa: E731
    out: dict[str, Tensor] = {"model.embed_tokens.weight": cat("embedding.word_embeddings.weight", 0)[: a.vocab].clone()}
    for i in range(a.num_layers):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[h + "input_layernorm.weight"] = s0[m + "input_layernorm.weight"].clone()
        out[h + "post_attention_layernorm.weight"] = s0[m + "pre_mlp_layernorm.weight"].clone()
        att = h + "self_attn."
        parts = [split_qkv(s[m + "self_attention.linear_qkv.weight"], a, a.kv_heads // tp) for s in shards]
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[att + name + ".weight"] = torch.cat([p[j] for p in parts], dim=0)
        if a.qkv_bias:
            parts = [split_qkv(s[m + "self_attention.linear_qkv.bias"], a, a.kv_heads // tp) for s in shards]
            for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                out[att + name + ".bias"] = torch.cat([p[j] for p in parts], dim=0)
        if a.qk_norm:
            out[att + "q_norm.weight"] = s0[m + "self_attention.q_layernorm.weight"].clone()
            out[att + "k_norm.weight"] = s0[m + "self_attention.k_layernorm.weight"].clone()
        out[att + "o_proj.weight"] = cat(m + "self_attention.linear_proj.weight", 1)
        fc1 = [s[m + "mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
        out[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in fc1], dim=0)
        out[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in fc1], dim=0)
        out[h + "mlp.down_proj.weight"] = cat(m + "mlp.linear_fc2.weight", 1)
    out["model.norm.weight"] = s0["decoder.final_layernorm.weight"].clone()
    if not a.tied:  # a tied model's lm_head is its embedding; HF checkpoints leave it out
        out["lm_head.weight"] = cat("output_layer.weight", 0)[: a.vocab].clone()
    return out


def _pad_vocab(t: Tensor, padded: int | None) -> Tensor:
    if padded is None or padded == t.shape[0]:
        return t
    return torch.cat([t, t.new_zeros(padded - t.shape[0], *t.shape[1:])], dim=0)


# TransformerEngine layer specs fuse each pre-norm into the linear after it.
_TE_FUSED_NORMS = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


def to_te_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Local-spec megatron names -> TransformerEngine-spec names."""
    out = {}
    for name, t in state.items():
        for local, te in _TE_FUSED_NORMS.items():
            if name.endswith(local):
                name = name[: -len(local)] + te
        out[name] = t
    return out


def from_te_names(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """TransformerEngine-spec names -> local-spec megatron names (extra TE state dropped)."""
    out = {}
    for name, t in state.items():
        if name.endswith("_extra_state"):
            continue
        for local, te in _TE_FUSED_NORMS.items():
            if name.endswith(te):
                name = name[: -len(te)] + local
        out[name] = t
    return out
