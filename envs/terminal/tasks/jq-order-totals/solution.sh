#!/bin/bash
set -euo pipefail
jq '[.orders[] | select(.status == "paid")] | group_by(.customer)
    | map({key: .[0].customer, value: ([.[].items[] | .qty * .unit_price] | add // 0)}) | from_entries' \
  orders.json > totals.json
