#!/bin/bash
set -euo pipefail
chmod 644 bin/report.sh
