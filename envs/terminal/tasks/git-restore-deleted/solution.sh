#!/bin/bash
set -euo pipefail
cd repo
deleted_in=$(git log --format=%H --diff-filter=D -n 1 -- notes.md)
git checkout "$deleted_in~1" -- notes.md
git commit -q -m "Restore notes.md"
