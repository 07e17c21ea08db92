"""launch/<recipe>.sh: partition checks and the processes each one would start (`--dry-run`).

A machine's GPUs are what `nvidia-smi -L` lists; the tests put a script of
that name first on PATH to stand for an 8-GPU node (no GPU code runs in a
dry run), or a PATH without one for a CPU machine.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

RECIPES = ["binary_rl", "opd", "combined", "swe", "gui"]


def launch(recipe: str, tmp_path: Path, gpus: int, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if gpus:
        fake.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus)))
        fake.chmod(0o755)
    elif fake.exists():
        fake.unlink()
    path = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    return subprocess.run(["bash", f"launch/{recipe}.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PATH": path, "HOME": os.environ.get("HOME", str(tmp_path)),
                                            "RUN_DIR": str(tmp_path / "run"), **env})


def gpus_by_process(stdout: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^wave \d+\s+(\S+)\s+gpus=(\S+)", stdout, re.M)}


@pytest.mark.parametrize("recipe", RECIPES)
def test_default_partition_on_an_8_gpu_node(recipe, tmp_path):
    out = launch(recipe, tmp_path, 8, MODEL_PATH="/models/qwen3-4b")
    assert out.returncode == 0, out.stderr
    assert gpus_by_process(out.stdout) == {
        "pool": "none", "serve": "4", "serve-1": "5", "prm": "6,7", "judge": "none", "gateway": "none",
        "trainer-0": "0,1,2,3", "trainer-1": "0,1,2,3", "trainer-2": "0,1,2,3", "trainer-3": "0,1,2,3", "rollout": "none"}
    assert f"recipes/{recipe}/cluster.yaml" not in out.stdout  # the plan names the run's own config copy
    assert f"--config {tmp_path / 'run'}/config.yaml" in out.stdout
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_other_partitions_follow_the_variables(tmp_path):
    out = launch("combined", tmp_path, 8, MODEL_PATH="/m", NUM_GPUS="6", ACTOR_GPUS="2", ROLLOUT_GPUS="3", PRM_GPUS="1",
                 PRM_MODEL_PATH="/prm")
    assert out.returncode == 0, out.stderr
    gpus = gpus_by_process(out.stdout)
    assert [gpus[k] for k in ("trainer-0", "trainer-1", "serve", "serve-1", "serve-2", "prm")] == \
        ["0,1", "0,1", "2", "3", "4", "5"]
    assert "model.path=/prm serve.sglang.tp_size=1" in out.stdout


@pytest.mark.parametrize("env, message", [
    ({"ACTOR_GPUS": "3"}, "the partition does not add up: ACTOR_GPUS=3 + ROLLOUT_GPUS=2 + PRM_GPUS=2 != NUM_GPUS=8"),
    ({"NUM_GPUS": "16", "ACTOR_GPUS": "12"}, "NUM_GPUS=16 but this machine shows 8 GPU(s)"),
    ({"ROLLOUT_GPUS": "two"}, "ROLLOUT_GPUS must be a whole number, got 'two'"),
    ({"MODEL_PATH": ""}, "set MODEL_PATH to a local HF model directory"),
    ({"NUM_GPUS": "6", "PRM_GPUS": "0"}, "starts a PRM engine; give it GPUs in cluster.prm_gpus"),
])
def test_a_bad_partition_is_refused_before_anything_starts(env, message, tmp_path):
    out = launch("opd", tmp_path, 8, **{"MODEL_PATH": "/m", **env})
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "wave" not in out.stdout


def test_without_a_gpu_the_cpu_config_runs(tmp_path):
    out = launch("combined", tmp_path, 0)
    assert out.returncode == 0, out.stderr
    assert "no GPU on this machine; running recipes/combined/cpu.yaml" in out.stderr
    # the combined CPU recipe distils from the frozen base, in a teacher engine of its own
    assert gpus_by_process(out.stdout) == {"pool": "-", "serve": "-", "teacher": "-", "judge": "-", "gateway": "-",
                                           "trainer": "-", "rollout": "-"}


def test_live_has_no_rollout_loop(tmp_path):
    out = launch("live", tmp_path, 8, MODEL_PATH="/models/qwen3-4b")
    assert out.returncode == 0, out.stderr
    gpus = gpus_by_process(out.stdout)
    assert "rollout" not in gpus and gpus["gateway"] == "none" and gpus["trainer-0"] == "0,1,2,3"
    cpu = launch("live", tmp_path, 0)
    assert cpu.returncode == 0 and "running recipes/live/cpu.yaml" in cpu.stderr
    assert "gateway" in gpus_by_process(cpu.stdout) and "rollout" not in gpus_by_process(cpu.stdout)
