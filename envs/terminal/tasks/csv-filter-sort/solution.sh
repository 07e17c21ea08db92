#!/bin/bash
set -euo pipefail
{ head -n 1 employees.csv; awk -F, 'NR > 1 && $3 == "Engineering"' employees.csv | sort -t, -k4,4nr; } > engineers.csv
