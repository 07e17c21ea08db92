#!/bin/bash
set -euo pipefail
sqlite3 inventory.db "
  DELETE FROM items WHERE qty = 0;
  UPDATE items SET price = ROUND(price * 1.10, 2) WHERE category = 'tools';"
