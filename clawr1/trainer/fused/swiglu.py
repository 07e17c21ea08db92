"""SwiGLU in one Triton kernel forward and one backward: for fc1's output [..., 2F] = [gate | up] (megatron's
layout, `torch.chunk(x, 2, -1)`), y = silu(gate) * up, [..., F].

The plain path (megatron's `glu`) makes silu(gate) as a temporary and multiplies it in a second pass, and its
backward runs four elementwise ops; here each is one pass, in fp32, rounded once to the input's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 1024


@triton.jit
def _forward(x_ptr, y_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    gate = tl.load(x_ptr + row * 2 * width + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + offs, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(y_ptr + row * width + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward(dy_ptr, x_ptr, dx_ptr, width, BLOCK: tl.constexpr):
    """d gate = dy * up * sig * (1 + gate * (1 - sig)), d up = dy * silu(gate)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < width
    gate = tl.load(x_ptr + row * 2 * width + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * width + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    d_gate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    d_up = dy * gate * sig
    tl.store(dx_ptr + row * 2 * width + offs, d_gate.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dx_ptr + row * 2 * width + width + offs, d_up.to(dx_ptr.dtype.element_ty), mask=mask)


def _grid(rows: int, width: int) -> tuple[int, int]:
    return rows, triton.cdiv(width, BLOCK)


class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        if x.shape[-1] % 2:
            raise ValueError(f"SwiGLU needs [gate | up] of even width, got {x.shape[-1]}")
        width = x.shape[-1] // 2
        x2 = x.reshape(-1, 2 * width).contiguous()
        y = torch.empty(x2.shape[0], width, dtype=x.dtype, device=x.device)
        if x2.shape[0]:
            _forward[_grid(x2.shape[0], width)](x2, y, width, BLOCK=BLOCK)
        ctx.save_for_backward(x2)
        return y.reshape(*x.shape[:-1], width)

    @staticmethod
    def backward(ctx, dy: Tensor) -> Tensor:
        (x2,) = ctx.saved_tensors
        width = x2.shape[1] // 2
        dx = torch.empty_like(x2)
        if x2.shape[0]:
            _backward[_grid(x2.shape[0], width)](dy.reshape(-1, width).contiguous(), x2, dx, width, BLOCK=BLOCK)
        return dx.reshape(*dy.shape[:-1], 2 * width)


def swiglu(x: Tensor) -> Tensor:
    """silu(gate) * up of `x` = [gate | up] along its last dimension."""
    return _SwiGLUFn.apply(x)


class FusedSwiGLU(torch.nn.Module):
    """MLP's activation module (megatron builds it with `config=` when `use_te_activation_func` is set); it
    takes fc1's whole [gate | up] output, as megatron's own `glu` does."""

    def __init__(self, config=None):
        super().__init__()
        if config is not None and getattr(config, "activation_func_clamp_value", None) is not None:
            raise ValueError("FusedSwiGLU does not clamp (activation_func_clamp_value is set)")
        if config is not None and getattr(config, "glu_linear_offset", 0.0):
            raise ValueError("FusedSwiGLU has no linear offset (glu_linear_offset is set)")

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x)
