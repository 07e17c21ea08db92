"""The bundled shop database: customers, products and orders as plain JSON-like dicts.

`load_db()` returns a fresh deep copy every time, so an episode can mutate its copy freely.
Money is kept in floats rounded to cents; `money()` is the one place that rounds.
"""
from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DB_PATH = DATA_DIR / "shop.json"

Db = dict[str, Any]  # {"customers": {id: ...}, "products": {id: ...}, "orders": {id: ...}}

ORDER_STATUSES = ("pending", "shipped", "delivered", "cancelled")


@lru_cache(maxsize=None)
def _load(path: str) -> Db:
    return json.loads(Path(path).read_text())


def load_db(path: Path = DB_PATH) -> Db:
    """A fresh, mutable copy of the shop database."""
    return copy.deepcopy(_load(str(path)))


def money(x: float) -> float:
    return round(float(x), 2)


def _canon(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.lower().split())
    if isinstance(value, float):
        return money(value)
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canon(v) for v in value]
    return value


def canonical(db: Db) -> Db:
    """The database as compared by the grader: strings case- and whitespace-folded, money in cents.

    An agent that types "45 elm street" for "45 Elm Street" has made the same change.
    """
    return _canon(db)


def db_diff(a: Db, b: Db, path: str = "") -> list[str]:
    """Paths where two (canonical) databases differ, e.g. ["orders.O1002.status"]."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            sub = f"{path}.{k}" if path else str(k)
            out += [sub] if (k in a) != (k in b) else db_diff(a[k], b[k], sub)
        return out
    return [] if a == b else [path or "<root>"]
