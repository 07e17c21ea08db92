#!/bin/bash
set -euo pipefail
chmod u+x bin/report.sh
