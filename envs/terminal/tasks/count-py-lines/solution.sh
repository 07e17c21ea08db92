#!/bin/bash
set -euo pipefail
find src -type f -name '*.py' -exec cat {} + | wc -l | tr -d ' ' > line_count.txt
