"""Core attention for packed (THD) sequences without TransformerEngine.

megatron-core's local `DotProductAttention` refuses packed sequences; on GPU,
TransformerEngine's attention takes them natively. This module plugs into the
local layer spec in its place. Attention never crosses packed sequences
(cu_seqlens), in one of three forms:

  varlen        the whole pack in one call to torch's flash varlen kernel
                (`torch.nn.attention.varlen`, CUDA, bf16/fp16); cost: the sum of squared lengths
  masked        one scaled-dot-product call over the pack with a block-diagonal causal mask;
                one kernel, but it computes the squared length of the whole pack (any device)
  per_sequence  one causal SDPA call per packed sequence (a Python loop; any device)

`auto` picks varlen where it can run and per_sequence elsewhere (CPU, fp32).
A pack laid out as prefix trees (trainer.share_prefixes) always runs per_sequence, each tree with its ancestor
mask: a token attends to itself and its ancestors only.

Rotary embeddings: megatron applies them per packed sequence, with a device sync (`.tolist()`) twice
per layer, which stops the CPU from queueing work ahead of the GPU. With `PackedRotaryParams` the
model hands each token's rotary angles (positions restarting at 0 for every sample) to this module
instead, which applies them to the whole pack at once with megatron's own rotary function: the same
operations on the same values, with no sync.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

ATTENTION_KINDS = ("auto", "varlen", "masked", "per_sequence")
_chosen_kind = "auto"
_rotary_in_core = True


def use_attention(kind: str) -> None:
    """Which form every VarlenCoreAttention runs from now on (process-wide; benchmarks compare them)."""
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention kind {kind!r} is not one of {ATTENTION_KINDS}")
    global _chosen_kind
    _chosen_kind = kind


def use_rotary_in_core(flag: bool) -> None:
    """False: leave rotary to megatron's per-sequence path, as before (benchmarks compare the two)."""
    global _rotary_in_core
    _rotary_in_core = flag


@lru_cache(maxsize=1)
def _torch_varlen_attn():
    """torch's varlen attention and its keyword names (they changed between torch 2.10 and 2.12), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16) and _torch_varlen_attn() is not None


def resolve_attention(kind: str, device: torch.device, dtype: torch.dtype) -> str:
    if kind == "auto":
        return "varlen" if varlen_available(device, dtype) else "per_sequence"
    if kind == "varlen" and not varlen_available(device, dtype):
        raise RuntimeError(f"varlen attention needs CUDA, bf16/fp16 and torch.nn.attention.varlen "
                           f"(here: {device.type}, {dtype}, torch {torch.__version__})")
    return kind


@dataclass
class PackedRotaryParams(PackedSeqParams):
    rotary_freqs: Optional[torch.Tensor] = None  # [t, 1, 1, rotary dim]: each packed token's rotary angles
    # a prefix tree (clawr1/trainer/prefix_tree.py): per packed sequence, its [n, n] ancestor mask (None: causal)
    tree_masks: Optional[list[Optional[torch.Tensor]]] = None


class VarlenCoreAttention(MegatronModule):
    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None, pg_collection=None,
                 fused_rope: bool = False):
        super().__init__(config=config)
        if fused_rope and (config.rotary_interleaved or config.multi_latent_attention):
            raise ValueError("the fused rotary kernel does the plain (not interleaved, not MLA) rotary only")
        self.fused_rope = fused_rope  # trainer.fused_kernels has rope: clawr1/trainer/fused/rope.py
        if config.context_parallel_size != 1:
            raise ValueError("VarlenCoreAttention does not do context parallelism (use TransformerEngine on GPU)")
        tp = config.tensor_model_parallel_size
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Optional[torch.Tensor] = None,
                packed_seq_params: Optional[PackedSeqParams] = None) -> torch.Tensor:
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("VarlenCoreAttention needs packed_seq_params with qkv_format='thd'")
        if attention_bias is not None:
            raise ValueError("attention_bias is not supported")
        freqs = getattr(packed_seq_params, "rotary_freqs", None)
        if freqs is not None:  # megatron skipped rotary (the model passed none): apply it here, to the whole pack
            query, key = self.rotate(query, freqs), self.rotate(key, freqs)
        if getattr(packed_seq_params, "tree_masks", None) is not None:  # each tree on its own, whatever the kind
            return self.per_sequence(query, key, value, packed_seq_params)
        kind = resolve_attention(_chosen_kind, query.device, query.dtype)
        attend = {"varlen": self.varlen, "masked": self.masked, "per_sequence": self.per_sequence}[kind]
        return attend(query, key, value, packed_seq_params)  # query/key/value: [t, heads, head_dim]

    def rotate(self, t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """What megatron's unfused packed rotary computes: [t, heads, dim] as one [t, 1, heads, dim] row."""
        if self.fused_rope:
            from clawr1.trainer.fused.rope import rotary

            return rotary(t, freqs)
        return _apply_rotary_pos_emb_bshd(t.unsqueeze(1), freqs, rotary_interleaved=self.config.rotary_interleaved,
                                          multi_latent_attention=self.config.multi_latent_attention).squeeze(1)

    def per_sequence(self, query, key, value, params: PackedSeqParams) -> torch.Tensor:
        """One SDPA call per packed sequence: causal, or a prefix tree's ancestor mask."""
        bounds = params.cu_seqlens_q.tolist()
        masks = getattr(params, "tree_masks", None) or [None] * (len(bounds) - 1)
        outputs = []
        for start, end, mask in zip(bounds[:-1], bounds[1:], masks):
            q = query[start:end].transpose(0, 1)
            k = key[start:end].transpose(0, 1)
            v = value[start:end].transpose(0, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                 enable_gqa=self.heads != self.groups)
            outputs.append(out.transpose(0, 1).reshape(end - start, -1))
        return torch.cat(outputs)

    def masked(self, query, key, value, params: PackedSeqParams) -> torch.Tensor:
        mask = block_causal_mask(params.cu_seqlens_q, query.shape[0])
        out = F.scaled_dot_product_attention(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1),
                                             attn_mask=mask, scale=self.scale, enable_gqa=self.heads != self.groups)
        return out.transpose(0, 1).reshape(query.shape[0], -1)

    def varlen(self, query, key, value, params: PackedSeqParams) -> torch.Tensor:
        varlen_attn, names = _torch_varlen_attn()
        kwargs = {}
        if self.heads != self.groups:
            if "enable_gqa" in names:
                kwargs["enable_gqa"] = True
            else:  # torch < 2.12: one kv head per query head, as SDPA's enable_gqa repeats them
                key = key.repeat_interleave(self.heads // self.groups, dim=1)
                value = value.repeat_interleave(self.heads // self.groups, dim=1)
        if "window_size" in names:
            kwargs["window_size"] = (-1, 0)  # causal
        else:
            kwargs["is_causal"] = True
        if "scale" in names:
            kwargs["scale"] = self.scale
        else:  # the kernel scales by 1/sqrt(head_dim)
            query = query * (self.scale * math.sqrt(query.shape[-1]))
        cu = params.cu_seqlens_q.to(torch.int32)
        out = varlen_attn(query, key, value, cu, cu, params.max_seqlen_q, params.max_seqlen_kv, **kwargs)
        return out.reshape(query.shape[0], -1)


def block_causal_mask(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """[total, total] bool: True where token i may attend to token j (same sequence, j <= i)."""
    positions = torch.arange(total, device=cu_seqlens.device)
    sequence = torch.bucketize(positions, cu_seqlens[1:].to(positions.dtype), right=True)
    return (sequence[:, None] == sequence[None, :]) & (positions[:, None] >= positions[None, :])


def packed_seq_params(lengths: list[int], device: torch.device, rotary_freqs: Optional[torch.Tensor] = None,
                      tree_masks: Optional[list[Optional[torch.Tensor]]] = None) -> PackedRotaryParams:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    longest = max(lengths)
    return PackedRotaryParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                              max_seqlen_kv=longest, rotary_freqs=rotary_freqs, tree_masks=tree_masks)


def applies_rotary(model: torch.nn.Module) -> bool:
    """Whether the model's attention is this module (the local layer spec), which can apply rotary itself.
    Asked on every forward: which attention a model has is looked up once and kept on it."""
    if not hasattr(model, "_clawr1_core_attention"):
        model._clawr1_core_attention = any(isinstance(m, VarlenCoreAttention) for m in model.modules())
    return _rotary_in_core and model._clawr1_core_attention
