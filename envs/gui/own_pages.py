"""The HTML of the project's own GUI tasks (envs/gui/tasks.py): short, self-contained pages, no network.

Forms POST to the site's own paths (the site records them for the judge); the apps keep their state
in localStorage, which each episode's fresh browser context starts empty.
"""
from __future__ import annotations

import html
import json


def page(title: str, body: str, script: str = "") -> str:
    """A whole HTML page (a task's pages are short: a title, a body, maybe a script)."""
    tail = f"<script>{script}</script>" if script else ""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title></head>"
            f"<body>{body}{tail}</body></html>")


# ---------------------------------------------------------------- form
CONTACT = page("Contact support", """<h1>Contact support</h1>
<form method=post action=/contact>
<p><label for=name>Your name</label> <input id=name name=name>
<p><label for=email>Email</label> <input id=email name=email type=email>
<p><label for=topic>Topic</label> <select id=topic name=topic><option value="">Choose a topic</option>
<option>Delivery</option><option>Billing</option><option>Technical problem</option><option>Something else</option>
</select>
<p><label for=message>Message</label> <textarea id=message name=message></textarea>
<p><button>Send</button></form>""")

SHIPPING = page("Delivery address", """<h1>Where should we deliver your order?</h1>
<form method=post action=/shipping>
<p><label for=name>Full name</label> <input id=name name=name>
<p><label for=street>Street and number</label> <input id=street name=street>
<p><label for=postcode>Postcode</label> <input id=postcode name=postcode>
<p><label for=city>City</label> <input id=city name=city>
<fieldset><legend>Delivery</legend>
<label><input type=radio name=speed value=standard checked> Standard (3 to 5 days)</label>
<label><input type=radio name=speed value=express> Express (next day)</label></fieldset>
<p><button>Continue to payment</button></form>""")

# ---------------------------------------------------------------- login
LOGIN = page("Sign in", """<h1>Sign in</h1>
<form method=post action=/session>
<label>Username <input name=username autocomplete=off></label>
<label>Password <input name=password type=password></label>
<button type=submit>Sign in</button></form>""")

IDENTIFY = page("Sign in", """<h1>Sign in</h1><p>Step 1 of 2.</p>
<form method=post action=/identify>
<label for=email>Email address</label> <input id=email name=email type=email autocomplete=off>
<button>Next</button></form>""")


def password_page(email: str) -> str:
    """Step 2 of the two-step sign-in, for the email given in step 1 ("Keep me signed in" starts ticked)."""
    email = html.escape(email, quote=True)
    return page("Sign in", f"""<h1>Sign in</h1><p>Step 2 of 2: signing in as {email}.</p>
<form method=post action=/session><input type=hidden name=email value="{email}">
<p><label for=password>Password</label> <input id=password name=password type=password>
<p><label><input type=checkbox name=remember checked> Keep me signed in</label>
<p><button>Sign in</button></form>""")


# ---------------------------------------------------------------- settings
NOTIFICATIONS = page("Notification settings", """<h1>Notifications</h1>
<form method=post action=/settings/notifications>
<p><label><input type=checkbox name=orders checked> Emails about my orders</label>
<p><label><input type=checkbox name=sms checked> Text messages (SMS)</label>
<p><label><input type=checkbox name=push checked> Push notifications</label>
<p><label><input type=checkbox name=digest> Weekly digest email</label>
<p><label for=quiet>Quiet hours</label> <select id=quiet name=quiet><option>None</option>
<option>21:00 to 06:00</option><option>22:00 to 07:00</option><option>23:00 to 08:00</option></select>
<p><button>Save</button></form>""")

DISPLAY = page("Display settings", """<h1>Display</h1>
<form method=post action=/settings/display>
<p><label for=theme>Theme</label> <select id=theme name=theme><option>System</option><option>Light</option>
<option>Dark</option><option>Dark (high contrast)</option></select>
<p><label for=size>Text size</label> <select id=size name=size><option>Small</option>
<option selected>Medium</option><option>Large</option></select>
<p><label><input type=checkbox name=motion> Reduce motion</label>
<p><button>Save</button></form>""")

# ---------------------------------------------------------------- search
# The results exist only once searched: every word of the query must be in an item's label.
SEARCH_JS = """
document.getElementById("search").onsubmit = event => {
  event.preventDefault();
  const words = document.getElementById("q").value.toLowerCase().split(/\\s+/).filter(Boolean);
  const found = ITEMS.filter(([value, label]) => words.length && words.every(w => label.toLowerCase().includes(w)));
  document.getElementById("results").replaceChildren(...found.map(([value, label]) => {
    const item = document.createElement("li"), button = document.createElement("button");
    Object.assign(button, {name: FIELD, value: value, textContent: VERB});
    button.setAttribute("aria-label", VERB + " " + label);
    item.append(label + " ", button);
    return item;
  }));
  document.getElementById("count").textContent = found.length + " result(s)";
};"""


def search_page(title: str, box_label: str, action: str, field: str, verb: str,
                items: list[tuple[str, str]]) -> str:
    """A search box over `items` ((value, label) pairs); each result's button (`verb`) POSTs field=value."""
    body = f"""<h1>{title}</h1>
<form id=search role=search><label for=q>{box_label}</label> <input id=q type=search> <button>Search</button></form>
<p id=count role=status></p>
<form method=post action={action}><ul id=results></ul></form>"""
    script = f"const ITEMS = {json.dumps(items)}, FIELD = {json.dumps(field)}, VERB = {json.dumps(verb)};" + SEARCH_JS
    return page(title, body, script)


LIBRARY = search_page("City library", "Search the catalogue", "/borrow", "book", "Borrow", [
    ("b11", "The Orchard by Theresa Weir (2011)"),
    ("b17", "The Orchard Keeper by Cormac McCarthy (1965)"),
    ("b23", "The Cherry Orchard by Anton Chekhov (1904)"),
    ("b31", "Blood Meridian by Cormac McCarthy (1985)"),
    ("b42", "The Road by Cormac McCarthy (2006)"),
    ("b56", "Orchard House by Tara Austen Weaver (2015)"),
])

SHOP = search_page("Cable corner", "Search products", "/cart", "sku", "Add to cart", [
    ("c-1m", "USB-C cable, 1 m (6.90 EUR)"),
    ("c-2m", "USB-C cable, 2 m (8.90 EUR)"),
    ("c-hdmi", "USB-C to HDMI adapter (19.00 EUR)"),
    ("a-2m", "USB-A to USB-C cable, 2 m (7.50 EUR)"),
    ("l-2m", "Lightning cable, 2 m (12.00 EUR)"),
])

# ---------------------------------------------------------------- second page
ACCOUNT_HOME = page("Home", """<h1>Welcome back, Ada</h1>
<nav aria-label=Main><a href=/account>Account settings</a></nav>
<h2>Request a call back</h2>
<form method=post action=/callback><label for=phone>Phone</label> <input id=phone name=phone>
<button>Request a call back</button></form>""")

ACCOUNT = page("Account settings", """<h1>Account settings</h1>
<form method=post action=/account>
<p><label for=name>Full name</label> <input id=name name=name value="Ada Lovelace">
<p><label for=email>Email</label> <input id=email name=email type=email value="ada@example.org">
<p><label for=phone>Phone</label> <input id=phone name=phone value="+44 20 7946 0000">
<p><button>Save changes</button></form>""")

SHOP_HOME = page("My shop", "<h1>My shop</h1><nav aria-label=Main><a href=/orders>Your orders</a></nav>")

ORDERS = {  # order number: (date, items)
    "1041": ("3 March", ["Running socks (3 pairs)", "Water bottle"]),
    "1042": ("9 March", ["Trail running shoes, size 42"]),
    "1043": ("20 March", ["Rain jacket", "Head torch", "Running socks (3 pairs)"]),
}

ORDER_LIST = page("Your orders", "<h1>Your orders</h1><ul>" + "".join(
    f"<li><a href=/orders/{n}>Order #{n}</a>, {date}, {len(items)} item(s)</li>"
    for n, (date, items) in ORDERS.items()) + "</ul>")


def order_page(number: str) -> str:
    date, items = ORDERS[number]
    return page(f"Order #{number}", f"""<h1>Order #{number}</h1><p>Ordered on {date}.</p>
<ul>{"".join(f"<li>{item}</li>" for item in items)}</ul>
<form method=post action=/returns><input type=hidden name=order value={number}>
<button>Request a return</button></form>""")


# ---------------------------------------------------------------- table
def table_page(title: str, caption: str, rows: list[list[str]]) -> str:
    """A page with one table; the first row is the header."""
    head = "".join(f"<th scope=col>{cell}</th>" for cell in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows[1:])
    return page(title, f"<h1>{title}</h1><table><caption>{caption}</caption><thead><tr>{head}</tr></thead>"
                       f"<tbody>{body}</tbody></table>")


TRAINS = table_page("Departures", "Today's departures from Dijon", [
    ["Departure", "Destination", "Platform", "Status"],
    ["08:10", "Lyon", "3", "On time"],
    ["09:25", "Geneva", "5", "On time"],
    ["12:40", "Lyon", "2", "Delayed 10 min"],
    ["15:05", "Marseille", "1", "On time"],
    ["17:55", "Lyon", "3", "On time"],
    ["19:20", "Geneva", "4", "On time"],
])

BUDGET = table_page("Spending 2024", "Spending per department and quarter, in EUR", [
    ["Department", "Q1", "Q2", "Q3", "Q4"],
    ["Engineering", "120,000", "135,000", "98,000", "150,000"],
    ["Marketing", "80,000", "95,000", "142,000", "70,000"],
    ["Sales", "60,000", "140,000", "110,000", "65,000"],
    ["Support", "40,000", "45,000", "50,000", "52,000"],
])

# ---------------------------------------------------------------- app
TODO = page("To do", """<h1>To do</h1>
<form id=add><label for=new>New task</label> <input id=new autocomplete=off> <button>Add</button></form>
<ul id=list></ul>""", """
const todos = JSON.parse(localStorage.getItem("todos") || "null") || [
  {text: "Call the plumber", done: false}, {text: "Call the bank", done: false},
  {text: "Water the plants", done: true}];
const input = document.getElementById("new");
function save() { localStorage.setItem("todos", JSON.stringify(todos)); render(); }
function render() {
  document.getElementById("list").replaceChildren(...todos.map(todo => {
    const box = Object.assign(document.createElement("input"), {type: "checkbox", checked: todo.done});
    box.setAttribute("aria-label", todo.text);
    box.onchange = () => { todo.done = box.checked; save(); };
    const item = document.createElement("li");
    item.append(box, " " + todo.text);
    return item;
  }));
}
document.getElementById("add").onsubmit = event => {
  event.preventDefault();
  if (input.value.trim()) todos.push({text: input.value.trim(), done: false});
  input.value = "";
  save();
};
save();""")

CART = page("Your cart", """<h1>Your cart</h1>
<table><thead><tr><th>Item</th><th>Quantity</th><th>Price</th><th>Change</th></tr></thead>
<tbody id=rows></tbody></table><p id=total></p>""", """
const PRICES = {"Notebook": 3.5, "Pens (pack of 10)": 4, "Stapler": 7.25};
const cart = JSON.parse(localStorage.getItem("cart") || "null")
  || {"Notebook": 1, "Pens (pack of 10)": 2, "Stapler": 1};
function change(item, by) { cart[item] += by; if (cart[item] <= 0) delete cart[item]; save(); }
function save() { localStorage.setItem("cart", JSON.stringify(cart)); render(); }
function button(text, label, onclick) {
  const b = Object.assign(document.createElement("button"), {textContent: text, onclick});
  b.setAttribute("aria-label", label);
  return b;
}
function render() {
  document.getElementById("rows").replaceChildren(...Object.entries(cart).map(([item, n]) => {
    const row = document.createElement("tr"), cells = [item, n, (n * PRICES[item]).toFixed(2) + " EUR", ""]
      .map(text => Object.assign(document.createElement("td"), {textContent: text}));
    cells[3].append(button("-", "One less " + item, () => change(item, -1)),
                    button("+", "One more " + item, () => change(item, 1)),
                    button("Remove", "Remove " + item, () => change(item, -cart[item])));
    row.append(...cells);
    return row;
  }));
  const total = Object.entries(cart).reduce((sum, [item, n]) => sum + n * PRICES[item], 0);
  document.getElementById("total").textContent = "Total: " + total.toFixed(2) + " EUR";
}
save();""")

# ---------------------------------------------------------------- dialog
FILES = ["report-final.docx", "old-draft.docx", "holiday.png"]

DELETE_FILES = page("Your files", "<h1>Your files</h1><ul>" + "".join(
    f"<li>{name} <button type=button aria-label=\"Delete {name}\" onclick=\"ask('{name}')\">Delete</button></li>"
    for name in FILES) + """</ul>
<dialog id=confirm aria-labelledby=question><form method=post action=/delete>
<p id=question></p><input type=hidden id=file name=file>
<button>Delete for good</button> <button type=button onclick="this.closest('dialog').close()">Cancel</button>
</form></dialog>""", """
function ask(name) {
  document.getElementById("file").value = name;
  document.getElementById("question").textContent = "Delete " + name + " for good?";
  document.getElementById("confirm").showModal();
}""")

SUBSCRIPTION = page("Your subscription", """<h1>Your subscription</h1><p>Plan: Reader, 9 EUR a month.</p>
<button type=button id=open>Cancel subscription</button>
<div id=box role=dialog aria-modal=true aria-labelledby=box-title hidden>
<h2 id=box-title>Cancel your subscription?</h2>
<form method=post action=/subscription/cancel>
<p><label for=reason>Why are you leaving?</label> <select id=reason name=reason required>
<option value="">Choose a reason</option><option>I do not use it enough</option><option>It is too expensive</option>
<option>I found another service</option><option>Something else</option></select>
<p><button>Confirm cancellation</button> <button type=button id=keep>Keep my subscription</button>
</form></div>""", """
const box = document.getElementById("box");
document.getElementById("open").onclick = () => { box.hidden = false; };
document.getElementById("keep").onclick = () => { box.hidden = true; };""")
