"""The engine's linears with oneDNN-prepacked weights (clawr1/serving/packed_linear.py): nn.Linear's numbers, a
weight that changes is packed again, and forward hooks (LoRA adapters) still see every call."""
from __future__ import annotations

import pytest
import torch

from clawr1.serving import packed_linear
from clawr1.serving.packed_linear import PackedForward, pack_linears, prepacked_dtype_ok
from tests.numerics import assert_close

pytestmark = pytest.mark.skipif(not prepacked_dtype_ok(torch.float32, torch.device("cpu")),
                                reason="this torch has no oneDNN")


@pytest.fixture(autouse=True)
def pack_any_size(monkeypatch):
    """These tests' linears are small; the engine packs only large ones (see the last test)."""
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHTS", 1)


def assert_linear(module: torch.nn.Linear, x: torch.Tensor, out: torch.Tensor) -> None:
    """The same dot products summed in another order: at most one rounding per term, at the scale of |x| |W|."""
    with torch.no_grad():
        expected = torch.nn.functional.linear(x.double(), module.weight.double(),
                                              None if module.bias is None else module.bias.double())
        terms = x.double().abs() @ module.weight.double().abs().t()
    assert_close(out, expected, torch.float32, module.in_features + 1, magnitude=float(terms.max()) + 1.0)


def test_packed_products_are_the_linears_for_any_rows_and_leading_shape():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 40, bias=False))
    assert pack_linears(model) == 2
    assert all(isinstance(m.forward, PackedForward) for m in model)
    for shape in ((1, 64), (8, 64), (1, 5, 64), (300, 64)):
        x = torch.randn(*shape)
        with torch.inference_mode():
            out = model[0](x)
        assert out.shape == (*shape[:-1], 96)
        assert_linear(model[0], x, out)


def test_a_weight_updated_in_place_or_replaced_is_packed_again():
    torch.manual_seed(1)
    linear = torch.nn.Linear(32, 16)
    pack_linears(linear)
    x = torch.randn(4, 32)
    before = linear(x)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(16, 32))  # an engine weight update copies in place
        linear.bias.add_(1.0)
    after = linear(x)
    assert_linear(linear, x, after)
    assert (after - before).abs().max() > 0.1
    linear.weight = torch.nn.Parameter(torch.randn(16, 32))
    assert_linear(linear, x, linear(x))


def test_forward_hooks_still_run_on_a_packed_linear():
    linear = torch.nn.Linear(8, 8)
    pack_linears(linear)
    linear.register_forward_hook(lambda module, args, out: out + 100.0)
    x = torch.randn(2, 8)
    assert_linear(linear, x, linear(x) - 100.0)


def test_bf16_and_cuda_linears_are_left_as_they_are():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8).to(torch.bfloat16))
    assert pack_linears(model) == 0
    assert not prepacked_dtype_ok(torch.float32, torch.device("cuda"))



def test_only_weights_large_enough_to_pay_for_the_conversions_are_packed(monkeypatch):
    monkeypatch.setattr(packed_linear, "MIN_PACKED_WEIGHTS", 1 << 20)
    small, large = torch.nn.Linear(128, 384), torch.nn.Linear(896, 4864, bias=False)  # the tiny model's; Qwen's MLP
    assert pack_linears(torch.nn.Sequential(small, large)) == 1
    assert isinstance(large.forward, PackedForward) and not isinstance(small.forward, PackedForward)
