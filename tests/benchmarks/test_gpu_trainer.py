"""benchmarks/gpu_trainer.py in its CPU mode (the tiny shape, fp32): the JSON the GPU run will print."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_trainer.py"


def bench(tmp_path, *args: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--threads", "1", *args], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                           "OUT": str(tmp_path)})
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1])
    assert json.loads((tmp_path / "gpu_trainer.json").read_text()) == result
    return out.returncode, result


def test_cpu_mode_measures_both_attention_forms_and_profiles_and_a_failed_stage_leaves_the_rest(tmp_path):
    rc, r = bench(tmp_path, "--shapes", "no-such-shape,tiny")
    assert r["benchmark"] == "gpu_trainer" and r["device"] == "cpu" and r["precision"] == "float32"
    # the failing shape reports its error; the tiny shape after it still runs every stage
    assert "KeyError" in r["shapes"]["no-such-shape"]["build"]["error"]
    assert rc == 1 and r["ok"] is False
    tiny = r["shapes"]["tiny"]
    assert tiny["build"]["ok"] and tiny["build"]["optimizer"] == "TorchAdamW"
    att = tiny["attention"]
    assert att["ok"] and att["baseline"] == "per_sequence/megatron" and att["new_path"] == "masked/core"
    for variant in ("per_sequence/megatron", "masked/megatron", "masked/core"):
        kind, rotary = variant.split("/")
        assert att[variant]["ran_as"] == kind and att[variant]["rotary"] == rotary
        assert att[variant]["tokens_per_s"] > 0 and att[variant]["steps"] >= 1
        assert att[variant]["mfu"] is None  # no bf16 peak for a CPU
    assert set(att["speedup"]) == {"masked/megatron", "masked/core"}
    parity = tiny["parity"]  # the new path's log-probs are the old path's, up to fp32 rounding
    assert parity["ok"] and parity["compared"] == ["masked/core", "per_sequence/megatron"] and parity["tokens"] > 50
    assert parity["mean_abs_diff"] < parity["mean_tolerance"]
    prof = tiny["profile"]
    assert prof["ok"] and prof["variant"] == "masked/core" and prof["top_ops"]
    assert set(prof["groups_share"]) == {"attention", "optimizer", "log-prob", "matmul", "norm", "rotary", "copy",
                                         "other"}
    assert abs(sum(prof["groups_share"].values()) - 1.0) <= 0.001 * len(prof["groups_share"])  # rounded to 3 places
    assert prof["groups_ms"]["matmul"] > 0
    assert "compiled" not in tiny  # CUDA only
    fused = tiny["fused"]  # no triton in this environment: the plain model measured, each kernel's refusal named
    assert fused["plain"]["tokens_per_s"] > 0 and not fused["ok"]
    for name in ("rmsnorm", "swiglu", "rope", "lmhead", "all"):
        assert "needs triton" in fused[name]["error"], fused[name]
    assert r["summary"]["tiny"]["masked/core"]["tokens_per_s"] == att["masked/core"]["tokens_per_s"]


def test_a_spent_budget_skips_stages_and_still_prints_its_json(tmp_path):
    rc, r = bench(tmp_path, "--budget-s", "0")
    assert rc == 1 and r["ok"] is False
    assert "time budget" in r["shapes"]["tiny"]["build"]["skipped"]
