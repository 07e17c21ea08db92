#!/usr/bin/env bash
# tinker-cookbook 0.5.8 in its own virtual environment (.venv-cookbook; CLAWR1_COOKBOOK_VENV names another), for
# running the cookbook's recipes, unchanged, against `clawr1 tinker-serve` (docs/tinker.md, "tinker-cookbook"):
# about 2 minutes and 1.6 GB. Safe to run again. Package registries only, every package pinned by version and sha256
# (scripts/cookbook-requirements.lock).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CLAWR1_COOKBOOK_VENV:-.venv-cookbook}
LOCK=$(sha256sum scripts/cookbook-requirements.lock | cut -d' ' -f1)
if [ "$(cat "$VENV/.lock-sha256" 2>/dev/null)" = "$LOCK" ]; then
  exit 0  # installed from this very lock
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q --require-hashes --no-deps -r scripts/cookbook-requirements.lock
echo "$LOCK" > "$VENV/.lock-sha256"
