#!/bin/bash
set -euo pipefail
python3 -c '
import csv, json
with open("inventory.csv", newline="") as f:
    rows = [{"sku": r["sku"], "name": r["name"], "qty": int(r["qty"]), "price": float(r["price"])}
            for r in csv.DictReader(f)]
with open("inventory.json", "w") as f:
    json.dump(rows, f, indent=2)
'
