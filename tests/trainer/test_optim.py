"""The optimizers' checkpoint round trip (the trainer's own CPU path is held by tests/trainer/test_resume.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.trainer.families import save_random_model

STEPS, SPLIT = 4, 2


def test_distributed_optimizer_with_torch_adamw_resumes_exactly(tmp_path):
    """Issue 26: megatron's DistributedOptimizer over torch's AdamW (the GPU path without TransformerEngine).

    Its load_state_dict gives every parameter one shared Adam `step`, which AdamW would advance once per
    parameter; its load_parameter_state fails on the `step` its file lacks (and, with fp32 parameters, on
    copying into views of them). After save -> load the steps' losses must be the uninterrupted run's."""
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        pytest.skip("TransformerEngine or Apex is installed: megatron steps with their fused Adam, not torch's AdamW")
    model = save_random_model("qwen2-tied", tmp_path / "model")
    out = tmp_path / "losses.json"
    run = subprocess.run([sys.executable, "-m", "tests.trainer.distributed_optimizer_worker", str(model), str(out),
                          str(STEPS), str(SPLIT)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["inner_optimizer"] == "torch.optim.adamw"  # torch's AdamW, not TE's or Apex's fused Adam
    assert len(got["straight"]) == len(got["resumed"]) == STEPS
    assert len(set(got["straight"])) == STEPS  # the steps change the weights, so a wrong step would show
    # the step after the resume is SPLIT + 1; its effect is in the loss of the step after it
    assert got["resumed"] == got["straight"], got
