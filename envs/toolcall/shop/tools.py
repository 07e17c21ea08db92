"""The shop's tools: pure functions over an in-memory database, their OpenAI schemas, and a dispatcher.

`call_tool(db, name, arguments)` never raises for anything a model can send: unknown tools,
malformed JSON, missing or extra arguments, wrong types and broken shop rules all come back
as `ToolResult(ok=False, error=...)` whose content is `{"error": "..."}`. A failed call
leaves the database untouched (every check runs before the first write).
"""
from __future__ import annotations

import re
from typing import Callable

from envs.toolcall.dispatch import ToolError, ToolResult, run_tool
from envs.toolcall.shop.db import ORDER_STATUSES, Db, money

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
MAX_QUANTITY = 10
_DONE = {"modify": "modified", "cancel": "cancelled", "refund": "refunded"}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")


def _order(db: Db, order_id: str) -> dict:
    if order_id not in db["orders"]:
        raise ToolError(f"order '{order_id}' not found")
    return db["orders"][order_id]


def _customer(db: Db, customer_id: str) -> dict:
    if customer_id not in db["customers"]:
        raise ToolError(f"customer '{customer_id}' not found")
    return db["customers"][customer_id]


def _product(db: Db, product_id: str) -> dict:
    if product_id not in db["products"]:
        raise ToolError(f"product '{product_id}' not found")
    return db["products"][product_id]


def _require_status(order: dict, status: str, action: str) -> None:
    if order["status"] != status:
        raise ToolError(f"cannot {action} order {order['order_id']}: its status is '{order['status']}'; "
                        f"only {status} orders can be {_DONE[action]}")


def _summary(c: dict) -> dict:
    return {"customer_id": c["customer_id"], "name": c["name"], "email": c["email"]}


# --- read-only tools -------------------------------------------------------------------------

def find_customer(db: Db, email: str = "", name: str = "") -> dict:
    if not email and not name:
        raise ToolError("give an email or a name")
    words = name.lower().split()
    found = [_summary(c) for c in db["customers"].values()
             if (not email or c["email"] == email.strip().lower())
             and all(w in c["name"].lower().split() for w in words)]
    if not found:
        raise ToolError("no customer matches")
    return {"customers": found}


def get_customer(db: Db, customer_id: str) -> dict:
    c = _customer(db, customer_id)
    orders = [o["order_id"] for o in db["orders"].values() if o["customer_id"] == customer_id]
    return {**c, "order_ids": orders}


def list_orders(db: Db, customer_id: str, status: str = "") -> dict:
    _customer(db, customer_id)
    orders = [{"order_id": o["order_id"], "status": o["status"], "total": o["total"]}
              for o in db["orders"].values()
              if o["customer_id"] == customer_id and (not status or o["status"] == status)]
    return {"customer_id": customer_id, "orders": orders}


def get_order(db: Db, order_id: str) -> dict:
    order = _order(db, order_id)
    left = money(order["paid"] - order["refunded"]) if order["status"] == "delivered" else 0.0
    return {**order, "refundable": left}


def search_products(db: Db, query: str) -> dict:
    words = query.lower().replace("-", " ").split()
    found = [{k: p[k] for k in ("product_id", "name", "price", "stock")}
             for p in db["products"].values()
             if all(w in f"{p['name']} {p['category']}".lower().replace("-", " ") for w in words)]
    if not found:
        raise ToolError(f"no product matches '{query}'")
    return {"products": found}


def get_product(db: Db, product_id: str) -> dict:
    return dict(_product(db, product_id))


# --- tools that change the database -----------------------------------------------------------

def modify_order_address(db: Db, order_id: str, street: str, city: str, zip: str) -> dict:
    order = _order(db, order_id)
    _require_status(order, "pending", "modify")
    order["address"] = {"street": street.strip(), "city": city.strip(), "zip": zip.strip()}
    return order


def modify_order_items(db: Db, order_id: str, items: list[dict]) -> dict:
    order = _order(db, order_id)
    _require_status(order, "pending", "modify")
    ids = [i["product_id"] for i in items]
    if len(set(ids)) != len(ids):
        raise ToolError("each product_id may appear only once in items")
    held = {i["product_id"]: i["quantity"] for i in order["items"]}  # stock this order already holds
    for item in items:
        p = _product(db, item["product_id"])
        available = p["stock"] + held.get(p["product_id"], 0)
        if item["quantity"] > available:
            raise ToolError(f"only {available} of {p['product_id']} ({p['name']}) available"
                            + (": out of stock" if available == 0 else ""))
    for pid, qty in held.items():
        db["products"][pid]["stock"] += qty
    new_items = []
    for item in sorted(items, key=lambda i: i["product_id"]):
        p = db["products"][item["product_id"]]
        p["stock"] -= item["quantity"]
        new_items.append({"product_id": p["product_id"], "name": p["name"], "quantity": item["quantity"],
                          "unit_price": p["price"]})
    order["items"] = new_items
    order["total"] = order["paid"] = money(sum(i["quantity"] * i["unit_price"] for i in new_items))
    return order


def cancel_order(db: Db, order_id: str, reason: str) -> dict:
    order = _order(db, order_id)
    _require_status(order, "pending", "cancel")
    for item in order["items"]:
        db["products"][item["product_id"]]["stock"] += item["quantity"]
    order.update(status="cancelled", cancel_reason=reason, refunded=order["paid"])
    return order


def refund_order(db: Db, order_id: str, amount: float) -> dict:
    order = _order(db, order_id)
    _require_status(order, "delivered", "refund")
    left = money(order["paid"] - order["refunded"])
    if money(amount) > left:
        raise ToolError(f"cannot refund {money(amount)}: at most {left} of order {order_id} is left to refund")
    order["refunded"] = money(order["refunded"] + amount)
    return {"order_id": order_id, "refunded_now": money(amount), "refunded_total": order["refunded"],
            "paid": order["paid"]}


def update_customer_email(db: Db, customer_id: str, email: str) -> dict:
    customer = _customer(db, customer_id)
    email = email.strip().lower()
    if not _EMAIL.match(email):
        raise ToolError(f"'{email}' is not a valid email address")
    if any(c["email"] == email for cid, c in db["customers"].items() if cid != customer_id):
        raise ToolError(f"'{email}' belongs to another customer")
    customer["email"] = email
    return _summary(customer)


# --- schemas ------------------------------------------------------------------------------------

def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": required, "additionalProperties": False}}}


def _id(what: str, example: str) -> dict:
    return {"type": "string", "description": f"The {what} id, e.g. '{example}'.", "minLength": 1}


TOOLS: list[dict] = [
    _tool("find_customer", "Find customers by email (exact) and/or name (all given words must match). "
          "Give at least one.",
          {"email": {"type": "string", "description": "The customer's email address."},
           "name": {"type": "string", "description": "The customer's name or part of it."}}, []),
    _tool("get_customer", "Get a customer's profile, address and order ids.",
          {"customer_id": _id("customer", "C01")}, ["customer_id"]),
    _tool("list_orders", "List a customer's orders with status and total.",
          {"customer_id": _id("customer", "C01"),
           "status": {"type": "string", "enum": list(ORDER_STATUSES), "description": "Only orders with this status."}},
          ["customer_id"]),
    _tool("get_order", "Get an order: status, items, total, amounts paid, refunded and still refundable, "
          "address, tracking number.",
          {"order_id": _id("order", "O1001")}, ["order_id"]),
    _tool("search_products", "Search products by words in their name or category.",
          {"query": {"type": "string", "description": "Words to look for, e.g. 'mouse'.", "minLength": 1}},
          ["query"]),
    _tool("get_product", "Get a product's name, category, price and stock.",
          {"product_id": _id("product", "P01")}, ["product_id"]),
    _tool("modify_order_address", "Change the shipping address of a pending order.",
          {"order_id": _id("order", "O1001"),
           "street": {"type": "string", "minLength": 1}, "city": {"type": "string", "minLength": 1},
           "zip": {"type": "string", "minLength": 1}}, ["order_id", "street", "city", "zip"]),
    _tool("modify_order_items", "Replace the items of a pending order. List every item the order should "
          "contain afterwards; the total is recomputed at current prices.",
          {"order_id": _id("order", "O1001"),
           "items": {"type": "array", "minItems": 1, "items": {
               "type": "object", "additionalProperties": False, "required": ["product_id", "quantity"],
               "properties": {"product_id": _id("product", "P01"),
                              "quantity": {"type": "integer", "minimum": 1, "maximum": MAX_QUANTITY}}}}},
          ["order_id", "items"]),
    _tool("cancel_order", "Cancel a pending order; the amount paid is refunded.",
          {"order_id": _id("order", "O1001"),
           "reason": {"type": "string", "enum": list(CANCEL_REASONS)}}, ["order_id", "reason"]),
    _tool("refund_order", "Refund part or all of a delivered order, at most what was paid minus earlier refunds.",
          {"order_id": _id("order", "O1001"),
           "amount": {"type": "number", "exclusiveMinimum": 0, "description": "Amount in dollars."}},
          ["order_id", "amount"]),
    _tool("update_customer_email", "Change a customer's email address.",
          {"customer_id": _id("customer", "C01"),
           "email": {"type": "string", "description": "The new email address.", "minLength": 1}},
          ["customer_id", "email"]),
]

IMPLEMENTATIONS: dict[str, Callable[..., dict]] = {
    "find_customer": find_customer, "get_customer": get_customer, "list_orders": list_orders,
    "get_order": get_order, "search_products": search_products, "get_product": get_product,
    "modify_order_address": modify_order_address, "modify_order_items": modify_order_items,
    "cancel_order": cancel_order, "refund_order": refund_order, "update_customer_email": update_customer_email,
}
MUTATING = frozenset({"modify_order_address", "modify_order_items", "cancel_order", "refund_order",
                      "update_customer_email"})
SCHEMAS: dict[str, dict] = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def call_tool(db: Db, name: str, arguments: str | dict | None) -> ToolResult:
    """Run one tool call on `db` (mutating it on success). `arguments` is the JSON string or a dict."""
    return run_tool(SCHEMAS, IMPLEMENTATIONS, name, arguments, db)
