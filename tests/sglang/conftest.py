"""Real SGLang 0.5.23 on CPU, from the environment scripts/setup_sglang.sh makes (docs/serving.md, "SGLang on CPU").

Without that environment these tests skip and say why; CI sets CLAWR1_REQUIRE_SGLANG=1, which turns the skip into
a failure. CLAWR1_SGLANG_PYTHON names another environment's Python.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clawr1.devtools import REPO, LoopProcess, local_config

SGLANG_STARTUP_S = 300  # 41-60 s alone on 2 cores; longer while another test's loops share them
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def sglang_python() -> Path:
    return Path(os.environ.get("CLAWR1_SGLANG_PYTHON") or REPO / ".venv-sglang" / "bin" / "python")


@pytest.fixture(scope="session")
def sglang() -> str:
    """The Python of SGLang's environment; skips (fails under CLAWR1_REQUIRE_SGLANG=1) where SGLang is missing."""
    python = sglang_python()
    probe = subprocess.run([str(python), "-c", "import sglang, sgl_kernel; print(sglang.__version__)"],
                           capture_output=True, text=True) if python.exists() else None
    if probe is None or probe.returncode != 0:
        why = (f"SGLang's environment is missing ({python}; run scripts/setup_sglang.sh)" if probe is None else
               f"SGLang does not import with {python}: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
        if os.environ.get("CLAWR1_REQUIRE_SGLANG") == "1":
            pytest.fail(why)
        pytest.skip(why)
    assert probe.stdout.strip() == "0.5.23", f"tests/sglang is written for SGLang 0.5.23, found {probe.stdout}"
    return str(python)


def sglang_overrides(python: str, *extra: str) -> tuple[str, ...]:
    """A recipe served by SGLang on CPU in float32 (log-probs are compared)."""
    return ("serve.backend=sglang", f"serve.sglang.python={python}", "serve.sglang.dtype=float32",
            f"serve.sglang.startup_timeout_s={SGLANG_STARTUP_S}", *extra)


@pytest.fixture(scope="module")
def sglang_engine(sglang, tiny_model, tmp_path_factory):
    """`clawr1 serve` with serve.backend=sglang on the tiny Qwen2 model, LoRA on (4 adapters of rank <= 8 on every
    linear), one per test module: (its URL, the run directory)."""
    run_dir = tmp_path_factory.mktemp("sglang")
    cfg = local_config(run_dir, *sglang_overrides(sglang, "serve.max_loras=4", "serve.max_lora_rank=8",
                                                  "lora.targets=[linear_qkv,linear_proj,linear_fc1,linear_fc2]"))
    proc = LoopProcess(cfg, "serve")
    try:
        proc.wait_http(f"{cfg.engine_url}/health", timeout=SGLANG_STARTUP_S)
        yield cfg.engine_url, run_dir
    finally:
        proc.stop()
