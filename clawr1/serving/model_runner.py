"""Batched forward passes over an HF decoder (Qwen2, Qwen3, Llama) with per-request KV caches.

The runner reuses the HF model's own modules (norms, projections, rotary
embedding, MLP), so its numbers are the model's numbers; what it adds is a KV
cache per request, which lets requests of different lengths decode together in
one batch and lets new requests join between decode steps (continuous
batching). Attention runs per request against its own cache; everything else
runs batched.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class KVCache:
    """Keys and values of one request, per layer, with room to grow."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 64):
        self.length = 0
        self.keys = [torch.empty(kv_heads, capacity, head_dim, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.empty(kv_heads, capacity, head_dim, dtype=dtype) for _ in range(num_layers)]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add k, v ([kv_heads, n, head_dim]) at the current length; return the whole cache of the layer."""
        n, end = k.shape[1], self.length + k.shape[1]
        if end > self.keys[layer].shape[1]:
            grow = max(end, 2 * self.keys[layer].shape[1])
            for store in (self.keys, self.values):
                old = store[layer]
                store[layer] = torch.empty(old.shape[0], grow, old.shape[2], dtype=old.dtype)
                store[layer][:, : self.length] = old[:, : self.length]
        self.keys[layer][:, self.length:end] = k
        self.values[layer][:, self.length:end] = v
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    def advance(self, n: int) -> None:
        self.length += n


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ModelRunner:
    def __init__(self, hf_model: torch.nn.Module):
        self.model = hf_model.eval()
        cfg = hf_model.config
        self.config = cfg
        self.num_layers = cfg.num_hidden_layers
        self.num_heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dtype = next(hf_model.parameters()).dtype
        self.decoder = hf_model.model
        self.lm_head = hf_model.lm_head

    def new_cache(self) -> KVCache:
        return KVCache(self.num_layers, self.kv_heads, self.head_dim, self.dtype)

    @torch.inference_mode()
    def forward(self, token_chunks: list[torch.Tensor], caches: list[KVCache]) -> list[torch.Tensor]:
        """Run each request's new tokens (1-D id tensors) after its cached ones.

        Returns, per request, the final hidden states of its new tokens [n_i, hidden];
        the caches are extended in place.
        """
        lengths = [c.numel() for c in token_chunks]
        positions = torch.cat([torch.arange(c.length, c.length + n) for c, n in zip(caches, lengths)])
        x = self.decoder.embed_tokens(torch.cat(token_chunks))[None]  # [1, T, hidden]
        cos, sin = self.decoder.rotary_emb(x, positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, head_dim]
        for i, layer in enumerate(self.decoder.layers):
            x = x + self._attention(i, layer, layer.input_layernorm(x)[0], cos, sin, lengths, caches)[None]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for c, n in zip(caches, lengths):
            c.advance(n)
        hidden = self.decoder.norm(x)[0]
        return list(hidden.split(lengths))

    def _attention(self, index, layer, h, cos, sin, lengths, caches) -> torch.Tensor:
        attn = layer.self_attn
        q = attn.q_proj(h).view(-1, self.num_heads, self.head_dim)
        k = attn.k_proj(h).view(-1, self.kv_heads, self.head_dim)
        v = attn.v_proj(h).view(-1, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        outs = []
        start = 0
        for n, cache in zip(lengths, caches):
            qi = q[start:start + n].transpose(0, 1)  # [heads, n, hd]
            ki, vi = cache.append(index, k[start:start + n].transpose(0, 1), v[start:start + n].transpose(0, 1))
            outs.append(self._sdpa(qi, ki, vi, cache.length).transpose(0, 1).reshape(n, -1))
            start += n
        return attn.o_proj(torch.cat(outs))

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int) -> torch.Tensor:
        n, total = q.shape[1], k.shape[1]
        mask = None
        if n > 1:  # new tokens see the cache and the new tokens before them
            mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=past)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
