"""Core attention for packed (THD) sequences without TransformerEngine.

megatron-core's local `DotProductAttention` refuses packed sequences; on GPU,
TransformerEngine's attention takes them natively. This module plugs into the
local layer spec in its place: it runs causal scaled-dot-product attention
separately on each packed sequence (cu_seqlens), so attention costs the sum of
each sequence's squared length, not the squared length of the whole pack, and
needs no mask tensor at all.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class VarlenCoreAttention(MegatronModule):
    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None, pg_collection=None):
        super().__init__(config=config)
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
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        outputs = []
        for start, end in zip(bounds[:-1], bounds[1:]):  # query/key/value: [t, heads, head_dim]
            q = query[start:end].transpose(0, 1)
            k = key[start:end].transpose(0, 1)
            v = value[start:end].transpose(0, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                                 enable_gqa=self.heads != self.groups)
            outputs.append(out.transpose(0, 1).reshape(end - start, -1))
        return torch.cat(outputs)


def packed_seq_params(lengths: list[int], device: torch.device) -> PackedSeqParams:
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    longest = max(lengths)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                           max_seqlen_kv=longest)
