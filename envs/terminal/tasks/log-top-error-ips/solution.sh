#!/bin/bash
set -euo pipefail
awk '$9 ~ /^5[0-9][0-9]$/ {n[$1]++} END {for (ip in n) print n[ip], ip}' access.log \
  | LC_ALL=C sort -k1,1nr -k2,2 | head -n 3 > top_error_ips.txt
