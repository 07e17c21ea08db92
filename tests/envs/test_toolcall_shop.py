import copy
import inspect
import json
import random
from collections import Counter

import pytest

from envs.toolcall.shop import (TOOLS, call_tool, expected_db, grade, load_db, load_tasks, oracle_answer,
                                oracle_calls, run_null, run_oracle, run_tool_calls)
from envs.toolcall.shop.db import canonical
from envs.toolcall.shop.tasks import REFUSAL_PHRASES, get_task
from envs.toolcall.shop.tools import IMPLEMENTATIONS, MUTATING, SCHEMAS
from envs.toolcall.text import contains, normalize

TASKS = load_tasks()
IDS = [t.id for t in TASKS]


def test_task_set_size_and_mix():
    kinds = Counter(t.kind for t in TASKS)
    assert len(TASKS) >= 22
    assert kinds == {"lookup": 8, "mutation": 7, "multi_step": 8, "refuse": 7}
    assert len(set(IDS)) == len(IDS)
    assert all(not t.actions for t in TASKS if t.kind in ("lookup", "refuse"))
    assert all(t.actions for t in TASKS if t.kind in ("mutation", "multi_step"))
    assert all(t.refuse == (t.kind == "refuse") for t in TASKS)


def test_database_is_consistent():
    db = load_db()
    assert (len(db["customers"]), len(db["products"]), len(db["orders"])) == (10, 15, 20)
    assert set(Counter(o["status"] for o in db["orders"].values())) == {"pending", "shipped", "delivered", "cancelled"}
    for o in db["orders"].values():
        assert o["customer_id"] in db["customers"]
        assert o["total"] == round(sum(i["quantity"] * i["unit_price"] for i in o["items"]), 2)
        assert all(i["product_id"] in db["products"] for i in o["items"])
        assert (o["tracking_number"] is not None) == (o["status"] in ("shipped", "delivered"))
    assert load_db() is not load_db() and load_db() == load_db()


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_oracle_passes(task):
    db = load_db()
    _, results = run_tool_calls(db, oracle_calls(task))
    assert [r.error for r in results if not r.ok] == []
    g = grade(task, db, [oracle_answer(task)])
    assert (g.passed, g.db_match, g.missing_outputs, g.db_diff) == (True, True, [], [])
    assert run_oracle(task).passed


@pytest.mark.parametrize("task", TASKS, ids=IDS)
def test_null_agent_fails(task):
    g = run_null(task)
    assert g.passed is False
    # every task has a gold change or a required output that an agent doing nothing misses
    assert g.db_match is (not task.actions)
    assert (len(g.missing_outputs) > 0) is bool(task.required_outputs)


def test_gold_actions_change_the_database_and_others_do_not():
    fresh = canonical(load_db())
    for t in TASKS:
        assert (canonical(expected_db(t)) != fresh) is bool(t.actions), t.id


def test_required_outputs_can_be_learned_from_the_tools():
    """Each fact the answer must state shows up in the oracle's tool results or the user's message."""
    for t in TASKS:
        db = load_db()
        messages, _ = run_tool_calls(db, oracle_calls(t))
        seen = t.instruction + "\n" + "\n".join(m["content"] for m in messages)
        for group in t.outputs:
            if group[0] in ("cancelled", "out of stock"):  # said as a status word or stock 0 by the tools
                continue
            assert any(contains(seen, s) for s in group), (t.id, group)


def test_oracle_calls_are_openai_tool_calls():
    calls = oracle_calls(get_task("find_and_cancel_pending"))
    assert [c["function"]["name"] for c in calls] == ["find_customer", "list_orders", "cancel_order"]
    assert calls[2] == {"id": "call_2", "type": "function", "function": {
        "name": "cancel_order", "arguments": json.dumps({"order_id": "O1002", "reason": "no longer needed"})}}
    assert oracle_answer(get_task("refuse_cancel_delivered")) == "Sorry, I cannot do that. delivered"
    assert oracle_answer(get_task("update_email")) == "Done."


# --- grader -----------------------------------------------------------------------------------

def _after(*calls):
    db = load_db()
    for name, args in calls:
        assert call_tool(db, name, args).ok, (name, args)
    return db


def test_grader_catches_wrong_database_state():
    task = get_task("find_and_cancel_pending")  # gold: cancel O1002 "no longer needed"
    wrong_order = _after(("cancel_order", {"order_id": "O1004", "reason": "no longer needed"}))
    g = grade(task, wrong_order, ["Done."])
    assert (g.passed, g.db_match) == (False, False)
    assert "orders.O1002.status" in g.db_diff and "orders.O1004.status" in g.db_diff
    wrong_reason = _after(("cancel_order", {"order_id": "O1002", "reason": "ordered by mistake"}))
    assert grade(task, wrong_reason, ["Done."]).db_diff == ["orders.O1002.cancel_reason"]
    extra = _after(("cancel_order", {"order_id": "O1002", "reason": "no longer needed"}),
                   ("update_customer_email", {"customer_id": "C01", "email": "a@example.com"}))
    assert grade(task, extra, ["Done."]).db_diff == ["customers.C01.email"]
    right = _after(("cancel_order", {"order_id": "O1002", "reason": "no longer needed"}))
    assert grade(task, right, ["Done."]).passed is True


def test_grader_catches_missing_outputs_and_normalizes_numbers():
    task = get_task("refund_one_item")  # refund 42.30 of O1011; answer must say 42.30
    db = _after(("refund_order", {"order_id": "O1011", "amount": 42.3}))
    assert grade(task, db, ["I refunded it."]).missing_outputs == ["42.30"]
    assert grade(task, db, ["Refunded 142.3 dollars."]).passed is False  # not the number 42.3
    assert grade(task, db, ["Refunded 42.35."]).passed is False
    for said in ["Refunded $42.3.", "refunded 42.30 USD", "You get  $42.300 back", "42.3"]:
        assert grade(task, db, ["ok", said]).passed is True, said
    lookup = get_task("lookup_order_status")
    assert grade(lookup, load_db(), ["It is SHIPPED."]).missing_outputs == ["TRK1003"]
    assert grade(lookup, load_db(), "Shipped, tracking trk1003.").passed is True


def test_grader_refusal_needs_unchanged_db_and_a_refusal():
    task = get_task("refuse_refund_too_much")  # 18.75 asked, only 13.75 left on O1017
    assert grade(task, load_db(), ["I can't: only $13.75 is left to refund."]).passed is True
    assert grade(task, load_db(), ["Only 13.75 is left."]).missing_outputs == [" | ".join(REFUSAL_PHRASES)]
    partial = _after(("refund_order", {"order_id": "O1017", "amount": 13.75}))
    g = grade(task, partial, ["I cannot refund 18.75, so I refunded 13.75."])
    assert (g.passed, g.db_diff) == (False, ["orders.O1017.refunded"])


def test_grader_ignores_case_and_spacing_of_typed_strings():
    task = get_task("change_address")
    db = _after(("modify_order_address", {"order_id": "O1007", "street": "45  elm STREET", "city": "riverton",
                                          "zip": "22003"}))
    assert grade(task, db, []).passed is True
    db = _after(("modify_order_address", {"order_id": "O1007", "street": "45 Elm St", "city": "Riverton",
                                          "zip": "22003"}))
    assert grade(task, db, []).db_diff == ["orders.O1007.address.street"]


def test_text_normalization():
    assert normalize("Refunded  $1,299.50\n now, 12.00.") == "refunded $1299.5 now, 12."
    assert contains("That’s not possible, I can’t.", "can't")
    assert contains("Total: 1,299.", "1299.00")
    assert not contains("O1005", "5") and not contains("0.5", "5") and not contains("12.55", "12.5")
    assert contains("status: Cancelled.", "cancelled") and not contains("uncancelled", "cancelled")


# --- tools ------------------------------------------------------------------------------------

def test_schemas_match_implementations():
    assert [t["function"]["name"] for t in TOOLS] == list(IMPLEMENTATIONS)
    for tool in TOOLS:
        f = tool["function"]
        params = list(inspect.signature(IMPLEMENTATIONS[f["name"]]).parameters.values())[1:]  # after db
        assert [p.name for p in params] == list(f["parameters"]["properties"]), f["name"]
        assert [p.name for p in params if p.default is inspect.Parameter.empty] == f["parameters"]["required"]
        assert tool["type"] == "function" and f["description"] and f["parameters"]["type"] == "object"
    assert MUTATING < set(IMPLEMENTATIONS)


ERRORS = [  # (tool, arguments, a piece of the error)
    ("no_such_tool", {}, "unknown tool 'no_such_tool'"),
    ("get_order", "{not json", "not valid JSON"),
    ("get_order", "[1, 2]", "must be a JSON object"),
    ("find_customer", {}, "give an email or a name"),
    ("find_customer", {"email": "nobody@example.com"}, "no customer matches"),
    ("find_customer", {"name": 7}, "'name' must be of type string"),
    ("get_customer", {"customer_id": "C99"}, "customer 'C99' not found"),
    ("get_customer", {}, "missing required argument 'customer_id'"),
    ("list_orders", {"customer_id": "C01", "status": "lost"}, "'status' must be one of"),
    ("list_orders", {"customer_id": "C99"}, "customer 'C99' not found"),
    ("get_order", {"order_id": "O9999"}, "order 'O9999' not found"),
    ("get_order", {"order_id": "O1001", "verbose": True}, "unexpected argument 'verbose'"),
    ("search_products", {"query": "spaceship"}, "no product matches 'spaceship'"),
    ("search_products", {"query": ""}, "'query' must not be empty"),
    ("get_product", {"product_id": "P99"}, "product 'P99' not found"),
    ("modify_order_address", {"order_id": "O1003", "street": "1 A St", "city": "B", "zip": "1"},
     "its status is 'shipped'; only pending orders can be modified"),
    ("modify_order_address", {"order_id": "O1002", "street": "1 A St", "city": "B"}, "missing required argument 'zip'"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P06", "quantity": 1}]}, "out of stock"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P15", "quantity": 4}]},
     "only 3 of P15 (Portable Charger) available"),
    ("modify_order_items", {"order_id": "O1007", "items": []}, "'items' must have at least 1 item"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P01", "quantity": 0}]},
     "'items[0].quantity' must be >= 1"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P01", "quantity": 1.5}]},
     "'items[0].quantity' must be of type integer"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P01", "quantity": 1}] * 2},
     "only once"),
    ("modify_order_items", {"order_id": "O1007", "items": [{"product_id": "P77", "quantity": 1}]},
     "product 'P77' not found"),
    ("modify_order_items", {"order_id": "O1001", "items": [{"product_id": "P01", "quantity": 1}]},
     "its status is 'delivered'"),
    ("cancel_order", {"order_id": "O1001", "reason": "no longer needed"},
     "its status is 'delivered'; only pending orders can be cancelled"),
    ("cancel_order", {"order_id": "O1006", "reason": "no longer needed"}, "its status is 'cancelled'"),
    ("cancel_order", {"order_id": "O1002", "reason": "too expensive"}, "'reason' must be one of"),
    ("refund_order", {"order_id": "O1018", "amount": 10}, "its status is 'pending'; only delivered orders"),
    ("refund_order", {"order_id": "O1017", "amount": 18.75}, "at most 13.75 of order O1017 is left"),
    ("refund_order", {"order_id": "O1008", "amount": 0}, "'amount' must be > 0"),
    ("refund_order", {"order_id": "O1008", "amount": "64"}, "'amount' must be of type number"),
    ("refund_order", {"order_id": "O1008", "amount": True}, "'amount' must be of type number, got bool"),
    ("update_customer_email", {"customer_id": "C08", "email": "grace.kim@example.com"}, "belongs to another"),
    ("update_customer_email", {"customer_id": "C08", "email": "not-an-email"}, "not a valid email"),
    ("update_customer_email", {"customer_id": "C99", "email": "x@example.com"}, "customer 'C99' not found"),
]


@pytest.mark.parametrize("name,args,expected", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_tool_errors_are_structured_and_change_nothing(name, args, expected):
    db = load_db()
    r = call_tool(db, name, args)
    assert (r.ok, json.loads(r.content)) == (False, {"error": r.error})
    assert expected in r.error
    assert db == load_db()


def test_every_tool_has_an_error_case():
    assert {e[0] for e in ERRORS} >= set(IMPLEMENTATIONS)


def test_tools_never_raise_on_random_arguments():
    rng = random.Random(0)
    values = [None, True, 0, -3, 2, 2.5, "", "O1002", "C01", "P03", "pending", "no longer needed", "x@y.io", [],
              [{"product_id": "P01", "quantity": 1}], [{"product_id": 3}], {"a": 1}, "Alice"]
    db = load_db()
    for _ in range(3000):
        name = rng.choice([*IMPLEMENTATIONS, "nope"])
        props = [*SCHEMAS.get(name, {}).get("properties", {}), "extra"]
        args = {k: rng.choice(values) for k in rng.sample(props, rng.randint(0, len(props)))}
        before = copy.deepcopy(db)
        r = call_tool(db, name, args if rng.random() < 0.9 else json.dumps(args)[:-1])
        assert isinstance(r.content, str) and json.loads(r.content) is not None
        if not r.ok:
            assert db == before and r.error


def test_successful_changes():
    db = load_db()
    r = call_tool(db, "modify_order_items", {"order_id": "O1002", "items": [
        {"product_id": "P08", "quantity": 2}, {"product_id": "P03", "quantity": 2}]})
    assert r.ok and json.loads(r.content)["total"] == 44.98
    o, p = db["orders"]["O1002"], db["products"]
    assert [i["product_id"] for i in o["items"]] == ["P03", "P08"] and o["paid"] == 44.98
    assert (p["P03"]["stock"], p["P08"]["stock"], p["P11"]["stock"]) == (120, 58, 203)  # P11 x3 released
    assert call_tool(db, "cancel_order", {"order_id": "O1002", "reason": "ordered by mistake"}).ok
    assert (o["status"], o["refunded"], p["P03"]["stock"], p["P08"]["stock"]) == ("cancelled", 44.98, 122, 60)
    assert call_tool(db, "refund_order", {"order_id": "O1017", "amount": 10}).ok
    assert json.loads(call_tool(db, "refund_order", {"order_id": "O1017", "amount": 3.75}).content) == {
        "order_id": "O1017", "refunded_now": 3.75, "refunded_total": 18.75, "paid": 18.75}
    assert call_tool(db, "refund_order", {"order_id": "O1017", "amount": 0.01}).error.startswith("cannot refund")
    assert json.loads(call_tool(db, "find_customer", {"name": "chen"}).content)["customers"][1]["customer_id"] == "C10"
    r = call_tool(db, "update_customer_email", {"customer_id": "C02", "email": " Bob@Example.org "})
    assert json.loads(r.content)["email"] == "bob@example.org"
