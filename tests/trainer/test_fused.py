"""trainer.fused_kernels on CPU: each Triton kernel (clawr1/trainer/fused) against the plain op it replaces, and the
trainer's model with all of them against the plain model, under Triton's CPU interpreter (tests/triton_interpreter.py)."""
from __future__ import annotations

import json
import sys

import pytest
import torch

from benchmarks.gpu_trainer import SHAPES
from clawr1.config import Config
from tests.numerics import REDUCTIONS_PER_LAYER, tolerance
from tests.triton_interpreter import run_interpreted, triton_path  # noqa: F401 (a fixture)


def test_fused_kernels_and_the_fused_model_match_the_plain_ones(triton_path, tiny_model):
    done = run_interpreted(triton_path, ["-m", "tests.trainer.fused_worker", str(tiny_model)])
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for what in ("rmsnorm", "swiglu", "rope dim 64 rot 64", "rope dim 64 rot 48", "lmhead", "the tiny model",
                 "a Qwen3 model"):
        assert f"[fused_worker] {what}" in done.stdout, done.stdout


def test_the_gpu_benchmarks_fused_stage_runs_on_a_cpu_under_the_interpreter(triton_path, tmp_path):
    """benchmarks/gpu_trainer.py's fused stage, dry-run on the tiny shape with one kernel (the GPU run's timings
    mean nothing here; the interpreter is slow): the fused model steps and its log-probs are the plain model's."""
    done = run_interpreted(triton_path, ["benchmarks/gpu_trainer.py", "--device", "cpu", "--threads", "1", "--fused",
                                         "swiglu"], OUT=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    fused = json.loads(done.stdout.strip().splitlines()[-1])["shapes"]["tiny"]["fused"]
    assert fused["ok"] and set(fused["speedup"]) == {"swiglu", "all", "all_2x_microbatch"}, fused
    assert fused["all_2x_microbatch"]["microbatch_tokens"] == 2 * fused["all"]["microbatch_tokens"]
    assert fused["swiglu"]["steps"] >= 1 and fused["all"]["tokens_per_step"] == fused["plain"]["tokens_per_step"]
    # the same log-probs up to fp32 rounding: each reduction of the tiny shape's forward rounding once differently
    gap, depth = fused["logprob_gap"], REDUCTIONS_PER_LAYER * SHAPES["tiny"]["num_hidden_layers"] + 2
    assert gap["max_abs_diff"] <= tolerance(torch.float32, gap["magnitude"], depth), gap


def test_fused_kernels_need_triton_and_on_a_cpu_its_interpreter(monkeypatch):
    from clawr1.trainer.main import fused_kernels

    assert fused_kernels([]) == ()
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails, as in the main environment
    with pytest.raises(RuntimeError, match="needs triton"):
        fused_kernels(["rmsnorm"])


def test_fused_kernels_and_transformer_engine_on_are_refused_together():
    with pytest.raises(ValueError, match="lmhead computes the softmax over the whole vocabulary"):
        Config.model_validate({"trainer": {"fused_kernels": ["lmhead"], "tensor_parallel": 2}})
    with pytest.raises(ValueError, match="fused_kernels replace"):
        Config.model_validate({"trainer": {"fused_kernels": ["swiglu"], "transformer_engine": "on"}})
    assert Config.model_validate({"trainer": {"fused_kernels": ["rope", "rmsnorm"]}}).trainer.fused_kernels == [
        "rope", "rmsnorm"]
