"""benchmarks/gpu_smoke.py, the device smoke test of issue 15: its CPU mode (tiny Qwen2, fp32, gloo) end to end.

The GPU mode (the 0.5B shape in bf16, megatron's distributed optimizer, NCCL) runs the same steps; its
test here is marked cuda and skipped without a GPU.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_smoke.py"


def smoke(*args: str, timeout: float) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                         timeout=timeout)
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    assert [line for line in lines[:-1] if line.startswith("[gpu_smoke] ")], "no progress lines"
    assert out.returncode == (0 if result["ok"] else 1), out.stdout[-3000:] + out.stderr[-3000:]
    return result


def test_cpu_tiny_mode_passes_every_check(tmp_path):
    r = smoke("--device", "cpu", "--tiny", "--threads", "1", "--workdir", str(tmp_path), timeout=300)
    steps = r["steps"]
    assert r["ok"], json.dumps(steps, indent=1)[-4000:]
    assert (r["benchmark"], r["mode"], r["device"], r["precision"]) == ("gpu_smoke", "tiny", "cpu", "float32")
    # 1: the trainer's own build, and on CPU it says which optimizer stands in for the distributed one
    assert steps["build"]["backend"] == "gloo" and steps["build"]["optimizer"] == "TorchAdamW"
    assert not steps["build"]["distributed_optimizer"] and "needs CUDA" in steps["build"]["note"]
    assert steps["build"]["arch"]["tied"] and steps["build"]["arch"]["qkv_bias"]
    # 2: packed Megatron log-probs against HF fp32, far below the spread of the log-probs themselves
    lp = steps["logprobs"]
    assert lp["tokens"] > 50 and lp["max_abs_diff"] < lp["tolerance"]["max"] == 1e-3
    assert lp["mean_abs_diff"] < lp["tolerance"]["mean"] and lp["mean_abs_diff"] < 0.01 * lp["ref_spread"]
    # 3: two optimizer steps
    train = steps["train"]
    assert len(train["steps"]) == 2
    assert all(math.isfinite(s["pg_loss"]) and s["grad_norm"] > 0 for s in train["steps"])
    assert train["loss_finite"] and train["grad_norm_positive"] and train["weights_changed"]
    assert train["changed_tensors"] == train["total_tensors"] > 0 and train["max_abs_change"] > 0
    # 4: checkpoint round trip: identical weights, and the optimizer state carries the next step exactly
    ckpt = steps["checkpoint"]
    assert ckpt["fresh_model_differed_before_load"] and ckpt["weights_equal"] and ckpt["next_step_matches"]
    assert ckpt["next_step_weights_max_abs_diff"] == 0.0 and "meta.json" in ckpt["files"]
    # 5: the published HF state: names and shapes of the HF model's state_dict, and the trained values
    pub = steps["publish"]
    assert pub["names_match"] and pub["shapes_match"] and pub["values_ok"]
    assert (pub["missing"], pub["unexpected"], pub["shape_mismatches"]) == ([], [], [])
    assert pub["trained_max_abs_diff"] < 1e-3
    # 6: the weight sender over gloo, every tensor checked on the receiving side; NCCL skipped with a reason
    sender = steps["weight_sender"]
    assert sender["gloo"]["pushed"] and sender["gloo"]["bytes_equal"] and sender["gloo"]["protocol_ok"]
    assert sender["gloo"]["received_tensors"] == pub["tensors"]
    assert "/begin_weight_update" in sender["gloo"]["engine_calls"]
    assert "no CUDA" in sender["nccl"]["skipped"]
    # 7: throughput is measured; no MFU without a bf16 peak
    tp = steps["throughput"]
    assert tp["tokens_per_s"] > 0 and tp["mfu"] is None and tp["peak_tflops"] is None
    assert r["summary"]["logprob_max_abs_diff"] == lp["max_abs_diff"]


def test_gpu_mode_refuses_clearly_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--device cpu --tiny" in json.loads(out.stdout.strip().splitlines()[-1])["error"]


@pytest.mark.cuda
def test_gpu_mode_passes_every_check(tmp_path):
    r = smoke("--workdir", str(tmp_path), timeout=1800)
    assert r["ok"], json.dumps(r["steps"], indent=1)[-6000:]
    assert r["precision"] == "bfloat16" and r["steps"]["build"]["distributed_optimizer"]
    assert r["steps"]["throughput"]["tokens_per_s"] > 0
