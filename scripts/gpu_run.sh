#!/usr/bin/env bash
# One GPU session (docs/gpu.md): run on the device machine from the repository root, with .whl carried
# (scripts/gpu_carry.sh). The four loops on one GPU, then the embedded engine's decode paths at 1/4/32/128 concurrent
# requests, then the trainer's speed with its fused kernels; each within its own budget (about 8 minutes in all with
# the defaults), each leaving its JSON line in $OUT.
# Usage: bash scripts/gpu_run.sh [ipc|disk|http] [LOOPS_BUDGET_S] [TRAINER_BUDGET_S] [ENGINE_TIMEOUT_S]
set -uo pipefail
SYNC=${1:-ipc} LOOPS_S=${2:-150} TRAINER_S=${3:-210} ENGINE_S=${4:-90}
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/device.csv" 2>&1
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, torch.version.cuda, 'triton',
triton.__version__)" >> "$OUT/device.csv" 2>&1
timeout -k 20 $((LOOPS_S + 30)) python3 benchmarks/gpu_loops.py --tokenizer-dir .whl/tokenizer-qwen3 \
  --weight-sync "$SYNC" --budget-s "$LOOPS_S" --workdir /tmp/gl 2> "$OUT/gpu_loops.log" | tail -1
timeout -k 10 "$ENGINE_S" python3 benchmarks/gpu_engine.py --tokenizer-dir .whl/tokenizer-qwen3 \
  2> "$OUT/gpu_engine.log" | tail -1
# torch.compile of the MLP and norms was measured before (no gain on an H200): its stage is left out here
timeout -k 20 $((TRAINER_S + 60)) python3 benchmarks/gpu_trainer.py --budget-s "$TRAINER_S" --compile-shape none \
  2> "$OUT/gpu_trainer.log" | tail -1
