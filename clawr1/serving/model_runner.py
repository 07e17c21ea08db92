"""Batched forward passes over an HF decoder (Qwen2, Qwen3, Llama) with a paged KV cache.

The runner reuses the HF model's own modules (norms, projections, rotary
embedding, MLP), so its numbers are the model's numbers. What it adds is one
pool of KV positions shared by the running requests (SGLang's token pool):

- `cache.take(tokens)` reserves pages for a request's prompt and the reply it
  may write (`cache.fits(tokens)` says whether they are free: the engine admits
  a request only then, and it waits otherwise);
- `prefill(ids, slot)` runs a new request's prompt and fills its pages;
- `decode(tokens, slots)` advances every running request by one token in one
  batch: projections and MLP batched, and one attention call per layer over
  each request's positions, gathered from the pool.

New requests are prefilled between decode steps and join the next batch
(continuous batching). Nothing in the pool is shared between requests or kept
for later ones: `prefill` writes a request's pages from position 0, and a
request only ever reads positions it wrote, so it never sees keys and values
another request (or another weight version) wrote. The engine retracts running
requests on a weight change and prefills them again (clawr1/serving/engine.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from clawr1.triton_kernels import require_triton


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


PAGE_TOKENS = 16  # positions per page of the pool


class TokenPool:
    """Keys and values of the running requests in one pool of `tokens` positions per layer, handed out in pages.

    A request holds a slot (an index below `slots`) with the pages of the tokens it reserved. The pool's memory
    is reserved at start but, on CPU, only touched where requests write.
    """

    def __init__(self, layers: int, slots: int, tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device = torch.device("cpu")):
        pages = tokens // PAGE_TOKENS
        if pages < 1:
            raise ValueError(f"a KV pool of {tokens} tokens holds no page of {PAGE_TOKENS}")
        shape = (pages * PAGE_TOKENS, kv_heads, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.tokens = pages * PAGE_TOKENS
        self.device = device
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.page_table = torch.zeros(slots, pages, dtype=torch.int32, device=device)  # each slot's pages, in order
        self.positions: list[torch.Tensor] = [torch.empty(0, dtype=torch.long, device=device)] * slots
        self.free_slots = list(range(slots - 1, -1, -1))
        self.free_pages = list(range(pages - 1, -1, -1))

    @staticmethod
    def pages_for(tokens: int) -> int:
        return -(-tokens // PAGE_TOKENS)

    def fits(self, tokens: int) -> bool:
        return bool(self.free_slots) and len(self.free_pages) >= self.pages_for(tokens)

    @property
    def free_tokens(self) -> int:
        return len(self.free_pages) * PAGE_TOKENS

    def take(self, tokens: int) -> int:
        """A slot with pages for `tokens` positions, its length 0 (the caller checked `fits`)."""
        slot = self.free_slots.pop()
        pages = torch.tensor([self.free_pages.pop() for _ in range(self.pages_for(tokens))], device=self.device)
        self.positions[slot] = (pages[:, None] * PAGE_TOKENS + torch.arange(PAGE_TOKENS, device=self.device)).flatten()
        self.page_table[slot, :pages.numel()] = pages.to(torch.int32)
        self.lengths[slot] = 0
        return slot

    def copy_prefix(self, source: int, target: int, tokens: int) -> None:
        """`target`'s first `tokens` keys and values (every layer) become `source`'s: a request with the same tokens."""
        src, dst = self.positions[source][:tokens], self.positions[target][:tokens]
        for keys, values in zip(self.keys, self.values):
            keys[dst] = keys[src]
            values[dst] = values[src]
        self.lengths[target] = tokens

    def release(self, slot: int) -> None:
        self.free_pages.extend((self.positions[slot][::PAGE_TOKENS] // PAGE_TOKENS).tolist())
        self.positions[slot] = self.positions[slot][:0]
        self.free_slots.append(slot)

    def gather_index(self, slots: list[int], longest: int) -> torch.Tensor:
        """[B, longest] pool positions of each slot's tokens 0..longest-1; past a slot's own filled part (length
        + 1), its first position, so only written positions are read (the mask hides them)."""
        rows = []
        for slot in slots:
            own = self.positions[slot][:min(int(self.lengths[slot]) + 1, longest)]
            rows.append(torch.cat([own, own[:1].expand(longest - own.numel())]))
        return torch.stack(rows)


class ModelRunner:
    def __init__(self, hf_model: torch.nn.Module, slots: int, pool_tokens: int, decode_attention: str = "gather",
                 cuda_graph: bool = False):
        if decode_attention not in ("gather", "paged"):
            raise ValueError(f"decode_attention is gather or paged, not {decode_attention!r}")
        self.paged = decode_attention == "paged"  # serve.decode_attention
        if self.paged:
            require_triton("serve.decode_attention=paged", next(hf_model.parameters()).device.type == "cpu",
                           "use serve.decode_attention=gather")
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
        # with CUDA graphs, one more slot: the padding rows' scratch (clawr1/serving/decode_graphs.py)
        scratch = 1 if cuda_graph else 0
        self.cache = TokenPool(cfg.num_hidden_layers, slots + scratch, pool_tokens + PAGE_TOKENS * scratch,
                               self.kv_heads, self.head_dim, weight.dtype, self.device)
        self.graphs = None
        if cuda_graph:
            from clawr1.serving.decode_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self, slots)

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor, slot: int) -> torch.Tensor:
        """Hidden states [n, hidden] of a new request's prompt; its keys and values fill `slot`'s first positions."""
        n = ids.numel()
        written = self.cache.positions[slot][:n]
        positions = torch.arange(n, device=self.device)
        x = self.decoder.embed_tokens(ids)[None]
        cos, sin = self._rotary(x, positions)
        causal = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x)[0], cos, sin)  # [n, heads, hd]
            self.cache.keys[i][written] = k
            self.cache.values[i][written] = v
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                                 attn_mask=causal, enable_gqa=True)[0]
            x = x + layer.self_attn.o_proj(out.transpose(0, 1).reshape(n, -1))[None]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.cache.lengths[slot] = n
        return self.decoder.norm(x)[0]

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """Hidden states [B, hidden] after one more token for each slot; the caches grow by one."""
        if self.graphs is not None:
            return self.graphs.decode(tokens, slots)
        if self.paged:
            return self._decode_paged(tokens, torch.tensor(slots, device=self.device))
        slot_idx = torch.tensor(slots, device=self.device)
        positions = self.cache.lengths[slot_idx]
        longest = int(positions.max()) + 1
        index = self.cache.gather_index(slots, longest)  # [B, L] pool positions
        written = index.gather(1, positions[:, None])[:, 0]  # where each slot's new token goes
        x = self.decoder.embed_tokens(tokens)[None]  # [1, B, hidden]
        cos, sin = self._rotary(x, positions)
        visible = torch.arange(longest, device=self.device)[None, :] <= positions[:, None]  # [B, L]: each slot's filled part
        mask = visible[:, None, None, :] if len(slots) > 1 else None
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x)[0], cos, sin)  # [B, heads, hd]
            keys, values = self.cache.keys[i], self.cache.values[i]
            keys[written] = k
            values[written] = v
            ks, vs = keys[index].transpose(1, 2), values[index].transpose(1, 2)  # [B, kv_heads, L, hd]
            out = F.scaled_dot_product_attention(q[:, :, None], ks, vs, attn_mask=mask, enable_gqa=True)  # [B, heads, 1, hd]
            x = x + layer.self_attn.o_proj(out[:, :, 0].reshape(len(slots), -1))[None]
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.cache.lengths[slot_idx] += 1
        return self.decoder.norm(x)[0]

    def _decode_paged(self, tokens: torch.Tensor, slot_idx: torch.Tensor) -> torch.Tensor:
        """decode with the attention read from the pool in place (serve.decode_attention=paged): no host work per
        request, and every tensor's shape fixed by the batch size."""
        from clawr1.serving.paged_attention import paged_decode_attention

        positions = self.cache.lengths[slot_idx]
        table = self.cache.page_table[slot_idx]
        written = table.gather(1, (positions // PAGE_TOKENS)[:, None])[:, 0].long() * PAGE_TOKENS + positions % PAGE_TOKENS
        attend = (positions + 1).to(torch.int32)  # each slot's filled part, the new token included
        x = self.decoder.embed_tokens(tokens)[None]  # [1, B, hidden]
        cos, sin = self._rotary(x, positions)
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = self._qkv(layer, layer.input_layernorm(x)[0], cos, sin)  # [B, heads, hd]
            self.cache.keys[i][written] = k
            self.cache.values[i][written] = v
            out = paged_decode_attention(q, self.cache.keys[i], self.cache.values[i], table, attend, PAGE_TOKENS,
                                         self.head_dim ** -0.5)
            x = x + layer.self_attn.o_proj(out.reshape(slot_idx.numel(), -1))[None]
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
