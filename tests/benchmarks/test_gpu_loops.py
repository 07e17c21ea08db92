"""benchmarks/gpu_loops.py, the four loops on one GPU (issue 44): its CPU mode runs every loop of the combined
recipe with the tiny model and external openai clients, and prints the JSON line the GPU run is read from."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu_loops.py"
STEPS = 4


@pytest.mark.slow
def test_cpu_mode_runs_the_loops_and_reports_every_figure(tiny_model, tmp_path):  # tiny_model: built before
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", str(STEPS), "--budget-s", "420",
                          "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=540,
                         env={"OUT": str(tmp_path), **__import__("os").environ})
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stderr[-4000:]
    r = json.loads(lines[0])
    assert json.loads((tmp_path / "gpu_loops.json").read_text()) == r
    assert r["stages"] == {k: "ok" for k in ("imports", "device", "model", "start", "loops")}, \
        json.dumps(r, indent=1)[-4000:] + out.stderr[-3000:]
    assert out.returncode == 0 and r["run_exit_code"] == 0
    assert r["steps"] == STEPS and r["step_s"] > 0 and r["train_s"] > 0 and r["wait_s"] >= 0
    assert 0 < r["handover_s"] < r["step_s"] and r["handover_ms_per_gb"] > 0 and r["handover_gb"] > 0
    assert r["engine_tokens_per_s"] > 0 and r["trainer_tokens_per_s"] > 0 and r["judged"] > 0
    client = r["client"]
    assert client["requests"] > 0 and client["chunks"] > 0 and client["failed"] == 0, client
    gap = r["logprob_gap"]
    assert gap["mean_all_steps"] is not None and gap["mean_all_steps"] >= 0
    assert {"engine", "teacher", "gateway", "judge", "pool", "train", "rollout"} <= set(r["peak_rss_mb"]), r["peak_rss_mb"]
    assert all(mb > 0 for mb in r["peak_rss_mb"].values())
    assert r["peak_gpu_mb"] == {}  # no GPU, nothing sampled


def test_a_failed_stage_still_prints_the_json_line_with_its_error(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--budget-s", "60", "--workdir",
                          str(tmp_path), "--tokenizer-dir", str(tmp_path / "absent")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1
    failed = [v for v in r["stages"].values() if v.startswith("error")]
    assert failed, r["stages"]
    assert r["stages"]["start"].startswith("skipped") and "run_exit_code" not in r
