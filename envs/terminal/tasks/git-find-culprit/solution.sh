#!/bin/bash
set -euo pipefail
line=$(grep -nx 'retries = 0' repo/settings.ini | cut -d: -f1)
git -C repo blame -l -L "$line,$line" --porcelain settings.ini | head -n 1 | cut -d' ' -f1 > culprit.txt
