"""benchmarks/gpu_engine.py in its CPU mode (the tiny shape, fp32): the JSON the GPU run will print; the paged path
under Triton's interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.triton_interpreter import run_interpreted, triton_path  # noqa: F401 (a fixture)

SCRIPT = "benchmarks/gpu_engine.py"


def last_json(stdout: str, out_dir) -> dict:
    result = json.loads(stdout.strip().splitlines()[-1])
    assert json.loads((out_dir / "gpu_engine.json").read_text()) == result
    return result


def test_cpu_mode_measures_each_concurrency_and_a_path_that_cannot_run_reports_why(tmp_path):
    done = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--paths", "gather,graphs", "--concurrency", "1,3",
                           "--new-tokens", "6"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OUT": str(tmp_path)})
    r = last_json(done.stdout, tmp_path)
    assert r["benchmark"] == "gpu_engine" and r["device"] == "cpu" and r["shape"] == "tiny"
    gather = r["paths"]["gather"]
    for c in ("1", "3"):  # every request generated all its tokens: the first at its prefill, then one a step
        assert gather[c]["ok"] and gather[c]["tokens"] == int(c) * 6 and gather[c]["tokens_per_s"] > 0
        assert 6 - 1 <= gather[c]["steps"] <= 6 + int(c)
    why = r["paths"]["graphs"]["error"]  # graphs are CUDA only, on a paged step that needs triton
    assert "decode_cuda_graph needs serve.device=cuda" in why or "decode_attention=paged needs triton" in why, why
    assert done.returncode == 1 and r["ok"] is False


def test_the_paged_path_runs_under_the_interpreter_and_is_compared_with_gather(triton_path, tmp_path):
    done = run_interpreted(triton_path, [SCRIPT, "--device", "cpu", "--paths", "gather,paged", "--concurrency", "2",
                                         "--new-tokens", "4"], OUT=str(tmp_path))
    r = last_json(done.stdout, tmp_path)
    assert done.returncode == 0 and r["ok"], done.stderr[-3000:]
    assert r["paths"]["paged"]["2"]["tokens"] == 8 and set(r["speedup"]) == {"paged"} and "2" in r["speedup"]["paged"]
