#!/usr/bin/env bash
# One GPU session (docs/gpu.md): run on the device machine from the repository root, with .whl carried
# (scripts/gpu_carry.sh). The four loops on one GPU, then the embedded engine's decode paths at 1/4/32/128 concurrent
# requests, then the trainer's speed with its fused kernels; each within its own budget (about 8 minutes in all with
# the defaults), each leaving its JSON line in $OUT.
# Usage: bash scripts/gpu_run.sh [ipc|disk|http] [LOOPS_BUDGET_S] [TRAINER_BUDGET_S] [ENGINE_TIMEOUT_S]
# DEVICE=cpu: the dry run here (the project's .venv, the tiny shapes, nothing installed; Triton's kernels only where
# TRITON_INTERPRET=1 and triton are on the path), to check the script before a GPU's minutes go to it.
set -uo pipefail
SYNC=${1:-ipc} LOOPS_S=${2:-150} TRAINER_S=${3:-210} ENGINE_S=${4:-90}
OUT=${OUT:-$(mktemp -d)}
if [ "${DEVICE:-cuda}" = cpu ]; then
  PY=${PYTHON:-.venv/bin/python} ON=(--device cpu) LOOPS=(--steps 4) TOK=()
else
  PY=python3 ON=() LOOPS=() TOK=(--tokenizer-dir .whl/tokenizer-qwen3)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" 2>&1
fi
export GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
"$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)" >> "$OUT/device.csv"
timeout -k 20 $((LOOPS_S + 30)) "$PY" benchmarks/gpu_loops.py "${ON[@]}" "${LOOPS[@]}" "${TOK[@]}" \
  --weight-sync "$SYNC" --budget-s "$LOOPS_S" --workdir /tmp/gl 2> "$OUT/gpu_loops.log" | tail -1
timeout -k 10 "$ENGINE_S" "$PY" benchmarks/gpu_engine.py "${ON[@]}" "${TOK[@]}" 2> "$OUT/gpu_engine.log" | tail -1
# torch.compile of the MLP and norms was measured before (no gain on an H200): its stage is left out here
timeout -k 20 $((TRAINER_S + 60)) "$PY" benchmarks/gpu_trainer.py "${ON[@]}" --budget-s "$TRAINER_S" \
  --compile-shape none 2> "$OUT/gpu_trainer.log" | tail -1
