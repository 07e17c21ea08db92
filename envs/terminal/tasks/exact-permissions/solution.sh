#!/bin/bash
set -euo pipefail
chmod 700 secrets
chmod 600 secrets/api.key
chmod 755 scripts/build.sh scripts/deploy.sh
chmod 644 public/index.html public/style.css
chmod 640 config.yml
