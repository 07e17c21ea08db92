#!/bin/bash
# Builds shop.db (kept out of the repository as a binary).
set -euo pipefail
python3 -I - <<'PY'
import sqlite3

db = sqlite3.connect("shop.db")
db.executescript("""
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     amount_cents INTEGER NOT NULL, status TEXT NOT NULL);
INSERT INTO customers VALUES (1, 'Ana Lima', 'BR'), (2, 'Bo Chen', 'CN'), (3, 'Cy Diaz', 'MX'),
                             (4, 'Di Evans', 'UK'), (5, 'Ed Fox', 'US');
INSERT INTO orders (customer_id, amount_cents, status) VALUES
  (1, 12000, 'completed'), (1, 3050, 'completed'), (1, 99900, 'cancelled'),
  (2, 45000, 'completed'), (2, 5000, 'refunded'),
  (3, 7525, 'completed'), (3, 7525, 'completed'), (3, 20000, 'completed'),
  (4, 50000, 'pending'), (4, 1999, 'completed'),
  (5, 30000, 'completed'), (5, 4001, 'completed');
""")
db.commit()
db.close()
PY
