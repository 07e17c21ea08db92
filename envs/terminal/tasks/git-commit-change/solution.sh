#!/bin/bash
set -euo pipefail
cd repo
printf '1.5.0\n' > VERSION
printf -- '- 1.5.0: faster startup\n' >> CHANGELOG.md
git add VERSION CHANGELOG.md
git commit -q -m "Release 1.5.0"
