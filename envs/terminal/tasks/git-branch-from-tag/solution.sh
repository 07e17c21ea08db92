#!/bin/bash
set -euo pipefail
cd repo
git checkout -q -b hotfix/1.0.1 v1.0
printf '1.0.1\n' > VERSION
git commit -q -am "Bump to 1.0.1"
