#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
from collections import defaultdict

totals = defaultdict(list)
with open("sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]].append(float(row["amount"]))
with open("region_means.csv", "w", newline="") as f:
    out = csv.writer(f, lineterminator="\n")
    out.writerow(["region", "mean_amount"])
    for region in sorted(totals):
        out.writerow([region, f"{sum(totals[region]) / len(totals[region]):.2f}"])
PY
