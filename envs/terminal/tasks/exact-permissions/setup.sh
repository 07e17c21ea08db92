#!/bin/bash
# Starting modes are set here: the repository does not keep them.
set -euo pipefail
chmod 755 secrets
chmod 666 secrets/api.key
chmod 644 scripts/build.sh
chmod 700 scripts/deploy.sh
chmod 664 public/index.html
chmod 644 public/style.css
chmod 666 config.yml
