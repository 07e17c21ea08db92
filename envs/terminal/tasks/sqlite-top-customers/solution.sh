#!/bin/bash
set -euo pipefail
sqlite3 -csv -header shop.db "
  SELECT c.name AS name, printf('%.2f', SUM(o.amount_cents) / 100.0) AS total
  FROM customers c JOIN orders o ON o.customer_id = c.id
  WHERE o.status = 'completed'
  GROUP BY c.id ORDER BY SUM(o.amount_cents) DESC LIMIT 3;" | tr -d '\r' > top_customers.csv
