"""`clawr1 bench`: the pass@k math, and the scripted agents calibrating every bundled task from the command line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clawr1.agent_bench import pass_at_k, pass_hat_k
from clawr1.environment import EpisodeResult
from tests.conftest import REPO
from tests.numerics import assert_close


def test_pass_at_k_and_pass_hat_k_by_hand():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    # float64 products and ratios of a few binomial terms: four roundings at magnitude 1
    assert_close(pass_at_k(4, 1, 1), 0.25, torch.float64, 4)
    assert_close(pass_at_k(4, 1, 2), 1 - 3 / 6, torch.float64, 4)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0  # any 2 of 4 include a pass
    assert_close(pass_hat_k(4, 2, 2), 1 / 6, torch.float64, 4, 1.0)  # C(2,2)/C(4,2)
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_hat_k(4, 3, 4) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_summary_averages_over_tasks():
    from clawr1.agent_bench import TaskScore, summarize

    def r(ok: bool, turns: int = 2) -> EpisodeResult:
        return EpisodeResult("t", "c", ok, 1.0 if ok else -1.0, turns, tool_errors=1)

    scores = [TaskScore("a", "x", [r(True), r(False)]), TaskScore("b", "y", [r(False), r(False)])]
    s = summarize(scores, 2)
    # float64 means over two tasks of per-task estimates (four roundings each) at magnitude 1
    assert_close([s["pass@1"], s["pass@2"]], [0.25, 0.5], torch.float64, 6, 1.0) and s["pass^2"] == 0.0
    assert s["failed"] == 2 and s["tool_errors"] == 4 and s["mean_turns"] == 2.0


def bench(*args: str, tmp_path) -> dict:
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", *args, "--out", str(tmp_path / "report")],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env", ["envs/terminal", "envs/toolcall"])
def test_oracle_passes_and_null_fails_every_bundled_task(env, tmp_path):
    oracle = bench(env, "--agent", "oracle", tmp_path=tmp_path)
    assert oracle["tasks"] >= 20 and oracle["pass@1"] == 1.0 and oracle["failed"] == 0
    null = bench(env, "--agent", "null", tmp_path=tmp_path)
    assert null["tasks"] == oracle["tasks"] and null["pass@1"] == 0.0 and null["failed"] == null["tasks"]
    report = (tmp_path / "report.md").read_text()
    assert "| task | category | passed |" in report and "0/1" in report
    if env == "envs/terminal":  # commands run in the sandbox, and its cost per command is reported
        assert 0 < oracle["sandbox_overhead_ms_per_command"] < 5000


def test_bfcl_simple_ground_truth_grades_as_correct(tmp_path):
    from envs.toolcall.bfcl import bfcl_unavailable

    reason = bfcl_unavailable()
    if reason:
        pytest.skip(reason)
    s = bench("envs/toolcall", "--tasks", "bfcl:simple", "--agent", "oracle", tmp_path=tmp_path)
    assert s["tasks"] == 400 and s["pass@1"] >= 0.99


def test_learnable_oracle_with_samples_reports_pass_at_k(tmp_path):
    s = bench("envs/toolcall", "--tasks", "learnable", "--agent", "oracle", "--samples", "2", "--limit", "20",
              tmp_path=tmp_path)
    assert (s["tasks"], s["samples"], s["pass@1"], s["pass@2"], s["pass^2"]) == (20, 2, 1.0, 1.0, 1.0)
    assert (tmp_path / "report.png").exists() or s["tasks"]  # categories calc/unit may both appear


def test_policy_needs_a_gateway_or_a_config(tmp_path):
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", "envs/toolcall", "--agent", "policy"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--gateway URL" in out.stderr


def test_the_report_is_named_after_the_task_sets_last_path_component(tmp_path):
    from clawr1.agent_bench import report_prefix

    assert report_prefix("envs/terminal", None, "oracle") == Path("runs/bench/terminal-default-oracle")
    assert report_prefix("envs/terminal", "/abs/dir", "oracle") == Path("runs/bench/terminal-dir-oracle")
    assert report_prefix("envs/terminal/", "/abs/dir/", "null") == Path("runs/bench/terminal-dir-null")
    assert report_prefix("envs/terminal", "envs/terminal/tasks/csv-to-json", "oracle") == \
        Path("runs/bench/terminal-csv-to-json-oracle")
    assert report_prefix("envs/toolcall", "bfcl:simple", "policy") == Path("runs/bench/toolcall-bfcl_simple-policy")
    assert report_prefix("envs/terminal", "/", "oracle") == Path("runs/bench/terminal-root-oracle")
    assert report_prefix("envs/terminal", "/abs/dir", "oracle", out=str(tmp_path / "mine")) == tmp_path / "mine"


def test_bench_with_an_absolute_task_directory_writes_one_flat_report(tmp_path):
    tasks = tmp_path / "my tasks" / "set-a"
    shutil.copytree(REPO / "envs" / "terminal" / "tasks" / "csv-to-json", tasks / "csv-to-json")
    out = subprocess.run([sys.executable, "-m", "clawr1.cli", "bench", "envs/terminal", "--tasks", str(tasks),
                          "--agent", "oracle"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["pass@1"] == 1.0
    assert sorted(p.name for p in (tmp_path / "runs" / "bench").iterdir()) == ["terminal-set-a-oracle.md"]
    assert f"wrote {Path('runs/bench/terminal-set-a-oracle.md')}" in out.stdout
