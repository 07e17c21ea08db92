"""Batched forward passes over an HF decoder (Qwen2, Qwen3, Llama) with a slot-based KV cache.

The runner reuses the HF model's own modules (norms, projections, rotary
embedding, MLP), so its numbers are the model's numbers. What it adds is a KV
cache with one slot per running request:

- `prefill(ids, slot)` runs a new request's prompt and fills its slot;
- `decode(tokens, slots)` advances every running request by one token in one
  batch: projections and MLP batched, and one attention call per layer over
  the slots' caches (a mask hides each slot's unused tail).

New requests are prefilled between decode steps and join the next batch
(continuous batching). Nothing in the cache is shared between requests or kept
for later ones: `take` hands out a slot whose length is 0 and `prefill` writes
it from position 0, so a request never reads keys and values another request
(or another weight version) wrote. The engine retracts running requests on a
weight change and prefills them again (clawr1/serving/engine.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class SlotCache:
    """Keys and values for `slots` requests of up to `capacity` tokens, per layer."""

    def __init__(self, layers: int, slots: int, kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device = torch.device("cpu")):
        shape = (slots, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.capacity = capacity
        self.free = list(range(slots - 1, -1, -1))

    def take(self) -> int:
        slot = self.free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)


class ModelRunner:
    def __init__(self, hf_model: torch.nn.Module, slots: int, capacity: int):
        self.model = hf_model.eval()
        cfg = hf_model.config
        self.config = cfg
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.decoder = hf_model.model
        self.lm_head = hf_model.lm_head
        weight = next(hf_model.parameters())
        self.device = weight.device
        self.cache = SlotCache(cfg.num_hidden_layers, slots, self.kv_heads, capacity, self.head_dim, weight.dtype,
                               self.device)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, slot: int) -> torch.Tensor:
        """Hidden states [n, hidden] of a new request's prompt; its keys and values fill `slot`."""
        n = ids.numel()
        positions = torch.arange(n, device=self.device)
        x = self.decoder.embed_tokens(ids)[None]
        cos, sin = self._rotary(x, positions)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x)[0], cos, sin)  # [n, heads, hd]
            self.cache.keys[i][slot, :, :n] = k.transpose(0, 1)
            self.cache.values[i][slot, :, :n] = v.transpose(0, 1)
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                 attn_mask=causal, enable_gqa=True)[0]
            x = x + layer.self_attn.o_proj(out.transpose(0, 1).reshape(n, -1))[None]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.cache.lengths[slot] = n
        return self.decoder.norm(x)[0]

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """Hidden states [B, hidden] after one more token for each slot; the caches grow by one."""
        slot_idx = torch.tensor(slots, device=self.device)
        positions = self.cache.lengths[slot_idx]
        longest = int(positions.max()) + 1
        x = self.decoder.embed_tokens(tokens)[None]  # [1, B, hidden]
        cos, sin = self._rotary(x, positions)
        visible = torch.arange(longest, device=self.device)[None, :] <= positions[:, None]  # [B, L]: each slot's filled part
        mask = visible[:, None, None, :]
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x)[0], cos, sin)  # [B, heads, hd]
            keys, values = self.cache.keys[i], self.cache.values[i]
            keys[slot_idx, :, positions] = k
            values[slot_idx, :, positions] = v
            if len(slots) == 1:  # a view of the one slot instead of a gathered copy
                s = slots[0]
                ks, vs, m = keys[s:s + 1, :, :longest], values[s:s + 1, :, :longest], None
            else:
                ks, vs, m = keys[slot_idx, :, :longest], values[slot_idx, :, :longest], mask
            out = F.scaled_dot_product_attention(q[:, :, None], ks, vs, attn_mask=m, enable_gqa=True)  # [B, heads, 1, hd]
            x = x + layer.self_attn.o_proj(out[:, :, 0].reshape(len(slots), -1))[None]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.cache.lengths[slot_idx] += 1
        return self.decoder.norm(x)[0]

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.decoder.rotary_emb(x, positions[None])
        return cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, head_dim]

    def _qkv(self, layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        attn = layer.self_attn
        q = attn.q_proj(h).view(-1, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(-1, self.kv_heads, self.head_dim)
        v = attn.v_proj(h).view(-1, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
