"""clawr1/serving/sglang_cpu.py: the kernel stand-in fails loudly, and the pin_memory workaround changes exactly
SGLang's pinning calls (the real install is checked in tests/sglang)."""
from __future__ import annotations

import importlib
import sys

import pytest

from clawr1.serving.sglang_cpu import PATCH_MARK, PINNING_FILES, patch_pinning, unpin


def test_every_name_of_the_stand_in_raises_when_called_naming_itself():
    standin = importlib.import_module("clawr1.serving.sgl_kernel_standin")
    with pytest.raises(standin.KernelMissing, match=r"clawr1\.serving\.sgl_kernel_standin\.fused_add_rmsnorm was called"):
        standin.fused_add_rmsnorm(1, 2)
    sub = importlib.import_module("clawr1.serving.sgl_kernel_standin.kvcacheio")
    with pytest.raises(NotImplementedError, match=r"kvcacheio\.transfer_kv_all_layer was called"):
        sub.transfer_kv_all_layer()
    with pytest.raises(standin.KernelMissing, match=r"\.flash_attn\.varlen\.fwd was called"):
        standin.flash_attn.varlen.fwd()
    assert not hasattr(standin, "__wrapped__")  # dunder lookups stay AttributeErrors (inspect, pickle, copy)
    assert "clawr1.serving.sgl_kernel_standin.kvcacheio" in sys.modules


def test_unpin_replaces_pinning_with_unpinned_copies_and_nothing_else():
    source = ("a = torch.tensor(x, dtype=torch.int32, pin_memory=True, device='cpu')\n"
              "b = (torch.zeros(3)\n      .pin_memory()\n)\n"
              "c = y.cpu().pin_memory()\nd = pin_memory_available\n")
    patched, count = unpin(source)
    assert count == 3
    assert patched == ("a = torch.tensor(x, dtype=torch.int32, pin_memory=False, device='cpu')\n"
                       "b = (torch.zeros(3)\n      .clone()\n)\n"
                       "c = y.cpu().clone()\nd = pin_memory_available\n")


def test_patch_pinning_once_and_refuses_a_release_it_does_not_know(tmp_path):
    for rel in PINNING_FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("t = torch.empty(2, pin_memory=True)\n")
    assert patch_pinning(tmp_path) == [f"{rel}: 1 pinning calls unpinned" for rel in PINNING_FILES]
    assert (tmp_path / PINNING_FILES[0]).read_text() == PATCH_MARK + "t = torch.empty(2, pin_memory=False)\n"
    assert patch_pinning(tmp_path) == [f"{rel}: already unpinned" for rel in PINNING_FILES]
    (tmp_path / PINNING_FILES[1]).write_text("t = torch.empty(2)\n")
    with pytest.raises(SystemExit, match="pins no host memory"):
        patch_pinning(tmp_path)
