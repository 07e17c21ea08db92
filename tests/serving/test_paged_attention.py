"""serve.decode_attention=paged on CPU, under Triton's interpreter (tests/triton_interpreter.py): the kernel
against attention on a dense copy, and the embedded engine's decode steps against the gather path."""
from __future__ import annotations

import sys

import pytest
import torch

from tests.triton_interpreter import run_interpreted, triton_path  # noqa: F401 (a fixture)


def test_paged_decode_attention_equals_the_gather_path(triton_path, tiny_model):
    done = run_interpreted(triton_path, ["-m", "tests.serving.paged_attention_worker", str(tiny_model)])
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for what in ("kernel", "runner"):
        assert f"[paged_worker] {what}" in done.stdout, done.stdout


def test_paged_decode_attention_without_triton_is_refused_by_name(monkeypatch, tiny_model):
    from transformers import AutoModelForCausalLM

    from clawr1.serving.model_runner import ModelRunner

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails, as in the main environment
    with pytest.raises(RuntimeError, match="decode_attention=paged needs triton"):
        ModelRunner(model, slots=2, pool_tokens=64, decode_attention="paged")
    with pytest.raises(ValueError, match="gather or paged"):
        ModelRunner(model, slots=2, pool_tokens=64, decode_attention="flash")
