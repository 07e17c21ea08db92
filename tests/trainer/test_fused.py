"""trainer.fused_kernels on CPU: each Triton kernel (clawr1/trainer/fused) against the plain op it replaces, and the
trainer's model with all of them against the plain model, under Triton's CPU interpreter.

The main environment has no triton (with it, torch and megatron-core import it at every start). These tests borrow
the pinned triton of SGLang's environment (scripts/setup_sglang.sh) and run in a subprocess with it on the path;
without that environment they skip (fail under CLAWR1_REQUIRE_SGLANG=1, as CI sets)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clawr1.config import Config
from clawr1.devtools import REPO
from benchmarks.gpu_trainer import SHAPES
from tests.numerics import REDUCTIONS_PER_LAYER, tolerance
from tests.sglang.conftest import sglang_python


@pytest.fixture(scope="module")
def triton_path(tmp_path_factory) -> Path:
    """A directory holding only `triton` (a link to SGLang's environment's copy)."""
    python = sglang_python()
    probe = subprocess.run([str(python), "-c", "import os, triton; print(os.path.dirname(triton.__file__))"],
                           capture_output=True, text=True) if python.exists() else None
    if probe is None or probe.returncode != 0:
        why = f"no triton in SGLang's environment ({python}; run scripts/setup_sglang.sh)"
        if os.environ.get("CLAWR1_REQUIRE_SGLANG") == "1":
            pytest.fail(why)
        pytest.skip(why)
    path = tmp_path_factory.mktemp("triton")
    (path / "triton").symlink_to(probe.stdout.strip())
    return path


def test_fused_kernels_and_the_fused_model_match_the_plain_ones(triton_path, tiny_model):
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(triton_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.trainer.fused_worker", str(tiny_model)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for what in ("rmsnorm", "swiglu", "rope dim 64 rot 64", "rope dim 64 rot 48", "the tiny model", "a Qwen3 model"):
        assert f"[fused_worker] {what}" in done.stdout, done.stdout


def test_the_gpu_benchmarks_fused_stage_runs_on_a_cpu_under_the_interpreter(triton_path, tmp_path):
    """benchmarks/gpu_trainer.py's fused stage, dry-run on the tiny shape with one kernel (the GPU run's timings
    mean nothing here; the interpreter is slow): the fused model steps and its log-probs are the plain model's."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OUT": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(triton_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "benchmarks/gpu_trainer.py", "--device", "cpu", "--threads", "1",
                           "--fused", "swiglu"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    fused = json.loads(done.stdout.strip().splitlines()[-1])["shapes"]["tiny"]["fused"]
    assert fused["ok"] and set(fused["speedup"]) == {"swiglu", "all"}, fused
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
    with pytest.raises(ValueError, match="fused_kernels replace"):
        Config.model_validate({"trainer": {"fused_kernels": ["swiglu"], "transformer_engine": "on"}})
    assert Config.model_validate({"trainer": {"fused_kernels": ["rope", "rmsnorm"]}}).trainer.fused_kernels == [
        "rope", "rmsnorm"]
