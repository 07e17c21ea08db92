#!/bin/bash
set -euo pipefail
cd repo
git revert --no-edit "$(git log --format=%H --grep='^Enable debug logging$' main)" > /dev/null
