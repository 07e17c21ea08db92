"""Triton kernels on a CPU: their tests run in a subprocess under Triton's interpreter (TRITON_INTERPRET=1).

The main environment has no triton (with it, torch and megatron-core import it at every start). The tests borrow
the pinned triton of SGLang's environment (scripts/setup_sglang.sh) through a directory that holds only it;
without that environment they skip (fail under CLAWR1_REQUIRE_SGLANG=1, as CI sets).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clawr1.devtools import REPO
from tests.sglang.conftest import sglang_python


@pytest.fixture(scope="session")
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


def run_interpreted(triton_path: Path, args: list[str], timeout_s: float = 900, **env: str) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root with triton on the path and its interpreter on."""
    env = {**os.environ, **env, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(triton_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
