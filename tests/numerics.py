"""One way to compare floats in tests, with the error each comparison allows stated by its caller.

Two claims:
- `assert_close(actual, expected, dtype, depth)`: the two are the same computation rounded differently (the same
  sums in another order, another kernel, a split reduction). Each of `depth` roundings that may differ between them
  moves a value by at most about one eps of `dtype` at the magnitude the rounding happens at, so
  |actual - expected| <= depth * eps * magnitude. `magnitude` defaults to the largest |expected| (the scale the
  last reduction works at); pass the sum of |terms| where the terms are larger than the result.
  Like torch.testing.assert_close with rtol=0 and atol=depth*eps*magnitude, the atol derived, not fitted.
- `assert_as_exact_as(actual, exact, honest)`: against an fp64 `exact`, `actual` errs by at most `factor` times
  what an `honest` computation in the same dtype errs, or `factor` eps at the magnitude, whichever is larger:
  "as exact as fp32 allows" (the way benchmarks/fp32_floor.py measured the engine against HF).

Exact equality (bit for bit) is `torch.equal` or `==`; use it where the code promises the same operations in the
same order (a resumed step, the same kernel on the same shapes), not these helpers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _tensor(x) -> torch.Tensor:
    return x.detach().double() if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)


def tolerance(dtype: torch.dtype, magnitude: float, depth: int) -> float:
    """The gap `depth` differing roundings of `dtype` can leave at `magnitude`."""
    return depth * eps(dtype) * magnitude


def gap(actual, expected) -> float:
    """The largest |actual - expected| (shapes must match)."""
    a, e = _tensor(actual), _tensor(expected)
    assert a.shape == e.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}"
    return float((a - e).abs().max()) if a.numel() else 0.0


def magnitude_of(x) -> float:
    t = _tensor(x)
    return float(t.abs().max()) if t.numel() else 0.0


def assert_close(actual, expected, dtype: torch.dtype, depth: int, magnitude: float | None = None,
                 what: str = "") -> None:
    """|actual - expected| <= depth * eps(dtype) * magnitude for every element (one magnitude for the whole
    tensor: an element's rounding happens at the scale of the sums it came from), and no NaN."""
    assert depth >= 1
    scale = magnitude_of(expected) if magnitude is None else magnitude
    bound, got = tolerance(dtype, scale, depth), gap(actual, expected)
    assert math.isfinite(got) and got <= bound, (
        f"{what}: gap {got:.4g} > {depth} x eps({dtype}) x magnitude {scale:.4g} = {bound:.4g} "
        f"({got / (eps(dtype) * scale) if scale else math.inf:.1f} eps at the magnitude)")


def assert_all_close(actual: dict, expected: dict, dtype: torch.dtype, depth: int, magnitude: float | None = None,
                     what: str = "") -> None:
    """`assert_close` for each tensor of two dicts with the same keys; the magnitude is the largest over them all
    unless given (a small gradient's error comes from the sums the large ones also go through)."""
    assert set(actual) == set(expected), f"{what}: keys differ"
    scale = max(magnitude_of(v) for v in expected.values()) if magnitude is None else magnitude
    for key in expected:
        assert_close(actual[key], expected[key], dtype, depth, scale, what=f"{what}[{key}]")


def assert_as_exact_as(actual, exact, honest, dtype: torch.dtype = torch.float32, factor: float = 4.0,
                       what: str = "") -> None:
    """|actual - exact| <= factor * max(|honest - exact|, eps(dtype) * |exact|), each the largest over the tensor."""
    floor = eps(dtype) * magnitude_of(exact)
    bound, got = factor * max(gap(honest, exact), floor), gap(actual, exact)
    assert math.isfinite(got) and got <= bound, (
        f"{what}: error vs fp64 {got:.4g} > {factor} x max(honest {dtype} error {gap(honest, exact):.4g}, "
        f"one eps at the magnitude {floor:.4g}) = {bound:.4g}")


# The error model of a transformer computed twice (TP or DP against one process, batched against alone, another
# implementation of the same layers): the same sums in another order. Each reduction on the path to a value may
# round once differently, at about the value's magnitude (the layers are normalized, gain ~1).
REDUCTIONS_PER_LAYER = 10  # two norms, QKV, scores, softmax, scores x V, output projection, FC1, FC2, residuals


def forward_depth(model: str | Path) -> int:
    """Reductions on the path to a logit of the HF model at `model`: each layer's, the final norm, the LM head."""
    layers = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    return REDUCTIONS_PER_LAYER * layers + 2


def grad_depth(model: str | Path) -> int:
    """A gradient goes forward, then back: two matmuls (input and weight gradients) for each forward one."""
    return 3 * forward_depth(model)


def logit_magnitude(model: str | Path, sequences: list[list[int]]) -> float:
    """The largest |logit| of the HF model over these sequences (fp32): the scale at which a log-prob rounds, as
    log_softmax(z)_i = z_i - logsumexp(z) (a greedy token's log-prob near 0 says nothing of it)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        return max(float(hf(input_ids=torch.tensor([ids])).logits.abs().max()) for ids in sequences)
