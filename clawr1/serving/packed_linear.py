"""The embedded engine's linear layers on CPU with their weights prepacked for oneDNN.

torch's default CPU product (MKL's sgemm) repacks the weight on every call. At decode's few rows that costs more
than the product itself; oneDNN with the weight packed once does not. Measured on 2 cores of an AMD EPYC (AVX2,
Qwen2.5-0.5B's shapes, fp32; benchmarks/cpu_real_model.py measures the engine both ways): [8, 896] x [896, 4864]
3.5 ms -> 2.0 ms, the LM head at 8 rows 177 -> 67 ms, at 128 rows still 1.5x; at the trainer's ~1,000 rows
neither wins, so only the engine packs.

Only weights of at least MIN_PACKED_WEIGHTS are packed. A packed weight is a second copy (oneDNN's layout) kept
beside the module's own, which stays the one weight updates and adapters read. It is packed again whenever the
weight changes: an update copies into the weight in place, which bumps its version counter, or replaces it,
which changes its storage.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# Smaller weights stay on MKL's product: oneDNN's per-call conversions cost more than a small product (the tiny
# model's engine, whose largest weight is 131K, decoded at half the speed with every linear packed). Qwen2.5-0.5B
# packs its MLPs and LM head, 90 % of its weights
MIN_PACKED_WEIGHTS = 1 << 20


def prepacked_dtype_ok(dtype: torch.dtype, device: torch.device) -> bool:
    """Where packing pays: fp32 on a CPU whose torch has oneDNN."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedForward:
    """`module.forward` for one nn.Linear: its product with the weight packed for oneDNN (forward hooks still run)."""

    def __init__(self, module: torch.nn.Linear):
        self.module = module
        self.key: Optional[tuple] = None
        self.weight = self.bias = None

    def _packed(self) -> tuple[Tensor, Optional[Tensor]]:
        w, b = self.module.weight, self.module.bias
        key = (w.data_ptr(), w._version, None if b is None else (b.data_ptr(), b._version))
        if key != self.key:
            self.weight = w.detach().to_mkldnn()
            self.bias = None if b is None else b.detach().to_mkldnn()
            self.key = key
        return self.weight, self.bias

    def __call__(self, x: Tensor) -> Tensor:
        weight, bias = self._packed()
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch._C._nn.mkldnn_linear(flat.to_mkldnn(), weight, bias).to_dense()
        return out.view(*x.shape[:-1], out.shape[-1])


def pack_linears(model: torch.nn.Module) -> int:
    """Every fp32 CPU nn.Linear of `model` with at least MIN_PACKED_WEIGHTS weights computes through its packed
    weight; returns how many."""
    count = 0
    for module in model.modules():
        if (isinstance(module, torch.nn.Linear) and module.weight.numel() >= MIN_PACKED_WEIGHTS
                and prepacked_dtype_ok(module.weight.dtype, module.weight.device)):
            module.forward = PackedForward(module)
            count += 1
    return count
