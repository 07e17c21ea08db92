#!/bin/bash
# Builds inventory.db (kept out of the repository as a binary).
set -euo pipefail
python3 -I - <<'PY'
import sqlite3

db = sqlite3.connect("inventory.db")
db.executescript("""
CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                    price REAL NOT NULL, qty INTEGER NOT NULL);
INSERT INTO items VALUES
  (1, 'hammer', 'tools', 12.99, 5),
  (2, 'wrench', 'tools', 8.5, 0),
  (3, 'screwdriver', 'tools', 4.4, 12),
  (4, 'glue', 'supplies', 3.1, 0),
  (5, 'tape', 'supplies', 2.0, 40),
  (6, 'saw', 'tools', 21.0, 2),
  (7, 'tool belt', 'apparel', 15.0, 3);
""")
db.commit()
db.close()
PY
