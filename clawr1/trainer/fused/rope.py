"""The rotary embedding of a packed row in one Triton kernel each way, for the trainer's own core attention
(`VarlenCoreAttention.rotate`).

Megatron's unfused path (`_apply_rotary_pos_emb_bshd`, not interleaved) computes cos and sin of every angle,
rounds them to the input's dtype, and builds `rotate_half(t)` and two products as temporaries. Here each
(token, head) is one program: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin over the first `rot` channels (x1 the
first half of them, x2 the second), the rest copied; in fp32, rounded once. The backward is the same rotation by
the opposite angle. Angles come as megatron makes them: [tokens, 1, 1, rot], the two halves equal.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _rotate(x_ptr, freqs_ptr, y_ptr, heads, dim, rot, sign, HALF: tl.constexpr, REST: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    base = (token * heads + tl.program_id(1)) * dim
    half = rot // 2
    offs = tl.arange(0, HALF)
    mask = offs < half
    angle = tl.load(freqs_ptr + token * rot + offs, mask=mask, other=0.0).to(tl.float32)
    cos, sin = tl.cos(angle), sign * tl.sin(angle)
    x1 = tl.load(x_ptr + base + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + half + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + base + offs, (x1 * cos - x2 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + base + half + offs, (x2 * cos + x1 * sin).to(y_ptr.dtype.element_ty), mask=mask)
    if REST > 0:  # channels past the rotary ones pass through
        rest = tl.arange(0, REST)
        keep = rest < dim - rot
        tl.store(y_ptr + base + rot + rest, tl.load(x_ptr + base + rot + rest, mask=keep), mask=keep)


def _apply(x: Tensor, freqs: Tensor, sign: float) -> Tensor:
    tokens, heads, dim = x.shape
    rot = freqs.shape[-1]
    x = x.contiguous()
    y = torch.empty_like(x)
    if tokens and heads:
        rest = dim - rot
        _rotate[(tokens, heads)](x, freqs, y, heads, dim, rot, sign, HALF=triton.next_power_of_2(rot // 2),
                                 REST=triton.next_power_of_2(rest) if rest else 0)
    return y


class _RopeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, freqs: Tensor) -> Tensor:
        ctx.save_for_backward(freqs)
        return _apply(x, freqs, 1.0)

    @staticmethod
    def backward(ctx, dy: Tensor):
        (freqs,) = ctx.saved_tensors
        return _apply(dy, freqs, -1.0), None


def rotary(x: Tensor, freqs: Tensor) -> Tensor:
    """`x` [tokens, heads, dim] rotated by `freqs` [tokens, 1, 1, rot] (rot even, <= dim; not interleaved)."""
    if x.dim() != 3 or freqs.shape[0] != x.shape[0] or freqs.shape[-1] % 2 or freqs.shape[-1] > x.shape[-1]:
        raise ValueError(f"rotary needs x [tokens, heads, dim] and freqs [tokens, 1, 1, even rot <= dim], got "
                         f"{tuple(x.shape)} and {tuple(freqs.shape)}")
    return _RopeFn.apply(x, freqs.reshape(freqs.shape[0], freqs.shape[-1]).float().contiguous())
