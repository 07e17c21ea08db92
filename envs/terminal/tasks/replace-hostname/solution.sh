#!/bin/bash
set -euo pipefail
grep -rlF 'old-api.example.com' config | while IFS= read -r f; do
  sed -i 's/old-api\.example\.com/api.example.org/g' "$f"
done
