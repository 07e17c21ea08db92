#!/usr/bin/env bash
# SGLang 0.5.23 in its own virtual environment (.venv-sglang; CLAWR1_SGLANG_VENV names another) for
# serve.backend=sglang on a CPU machine: about 3 minutes and 6.6 GB. Safe to run again. Package registries only,
# every package pinned by version and sha256 (scripts/sglang-requirements.lock). What is real and what is not:
# docs/serving.md, "SGLang on CPU".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CLAWR1_SGLANG_VENV:-.venv-sglang}
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r scripts/sglang-requirements.lock
# SGLang's CPU kernel package is not on PyPI: clawr1's stand-in (every name raises if called), and, without CUDA,
# SGLang's LoRA code made not to pin host memory (clawr1/serving/sglang_cpu.py).
"$VENV/bin/python" -m clawr1.serving.sglang_cpu install "$VENV"
