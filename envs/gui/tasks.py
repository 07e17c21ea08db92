"""The project's own GUI tasks: small web apps served from memory, each with an oracle and a wrong solution.

Every task is judged once, at the end, from the recorded POSTs, the final page (its `state_js`) and
the submitted answer. Kinds (a task's category is own/<kind>): form, login, settings, search,
second-page, table, app, dialog. The pages are in envs/gui/own_pages.py.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

from envs.gui import own_pages as pages
from envs.gui.site import POSTED_PAGE, Site
from envs.gui.task import FinalState, GuiTask, Step, Target, Verdict, steps

MAX_TURNS = 10
Judge = Callable[[FinalState], Verdict]


# ---------------------------------------------------------------- judges
def _mismatch(form: dict[str, str], want: dict[str, Optional[str]]) -> str:
    """What in `form` differs from `want` (a value None: the field must be absent, e.g. an unticked box)."""
    def shown(value: Optional[str]) -> str:
        return "not sent" if value is None else repr(value)
    return "; ".join(f"{k}: got {shown(form.get(k))}, expected {shown(v)}" for k, v in want.items() if form.get(k) != v)


def expect_post(path: str, **want: Optional[str]) -> Judge:
    """A judge: passes when the last form POSTed to `path` has these field values (None: not sent)."""
    def judge(state: FinalState) -> Verdict:
        forms = state.posted(path)
        if not forms:
            return Verdict(False, f"nothing was POSTed to {path}")
        wrong = _mismatch(forms[-1], want)
        return Verdict(not wrong, f"{path} got wrong values ({wrong})" if wrong else f"{path} got the expected values")
    return judge


def expect_only_post(path: str, **want: Optional[str]) -> Judge:
    """A judge for an action that cannot be undone: exactly one form POSTed to `path`, with these values."""
    def judge(state: FinalState) -> Verdict:
        forms = state.posted(path)
        if len(forms) > 1:
            return Verdict(False, f"{len(forms)} forms were POSTed to {path}, expected exactly one: {forms}")
        return expect_post(path, **want)(state)
    return judge


def expect_answer(expected: str) -> Judge:
    """A judge: passes when the submitted answer equals `expected` (case and surrounding space ignored)."""
    def judge(state: FinalState) -> Verdict:
        if state.answer is None:
            return Verdict(False, "no answer was submitted")
        ok = state.answer.strip().casefold() == expected.casefold()
        return Verdict(ok, f"answered {state.answer!r}" + ("" if ok else f", expected {expected!r}"))
    return judge


def expect_state(what: str, expected: Any) -> Judge:
    """A judge: passes when the final page's state (the task's `state_js`) equals `expected`."""
    def judge(state: FinalState) -> Verdict:
        ok = state.page_state == expected
        return Verdict(ok, f"{what} is {state.page_state}" + ("" if ok else f", expected {expected}"))
    return judge


# ---------------------------------------------------------------- plan steps
def click(role: str, name: str) -> Step:
    return Step("click", target=Target(role, name))


def fill(name: str, text: str, role: str = "textbox") -> Step:
    return Step("fill", {"text": text}, Target(role, name))


def choose(name: str, option: str) -> Step:
    return Step("select_option", {"option": option}, Target("combobox", name))


def done(answer: Optional[str] = None) -> Step:
    return Step("submit", {} if answer is None else {"answer": answer})


def task(kind: str, name: str, instruction: str, site: Union[Site, dict[str, str]], judge: Judge,
         oracle: list[Step], wrong: list[Step], **more: Any) -> GuiTask:
    """An own task, id own/<name>, started at "/"; `site` may be just its pages."""
    return GuiTask(id=f"own/{name}", category=f"own/{kind}", instruction=instruction,
                   site=site if isinstance(site, Site) else Site(site), start_path="/", judge=judge,
                   max_turns=MAX_TURNS, oracle=steps(*oracle), wrong=steps(*wrong), **more)


# ---------------------------------------------------------------- form
def contact_form_task() -> GuiTask:
    you = [fill("Your name", "Ivo Petrov"), fill("Email", "ivo.petrov@example.com")]
    message = fill("Message", "Please resend my March invoice.")
    return task("form", "form-contact",
                "Ask support to resend your March invoice. You are Ivo Petrov (ivo.petrov@example.com). Pick the "
                "topic that fits and write exactly this message: Please resend my March invoice.",
                {"/": pages.CONTACT},
                expect_post("/contact", name="Ivo Petrov", email="ivo.petrov@example.com", topic="Billing",
                            message="Please resend my March invoice."),
                oracle=[*you, choose("Topic", "Billing"), message, click("button", "Send"), done()],
                wrong=[*you, choose("Topic", "Something else"), message, click("button", "Send"), done()])


def shipping_form_task() -> GuiTask:
    address = [fill("Full name", "Jonas Berg"), fill("Street and number", "Storgatan 12"),
               fill("Postcode", "114 51"), fill("City", "Stockholm")]
    go_on = click("button", "Continue to payment")
    return task("form", "form-shipping",
                "Have the order delivered to Jonas Berg, Storgatan 12, 114 51 Stockholm. It must arrive tomorrow.",
                {"/": pages.SHIPPING},
                expect_post("/shipping", name="Jonas Berg", street="Storgatan 12", postcode="114 51",
                            city="Stockholm", speed="express"),
                oracle=[*address, click("radio", "Express (next day)"), go_on, done()],
                wrong=[*address, go_on, done()])  # keeps the standard delivery


# ---------------------------------------------------------------- login
def login_task() -> GuiTask:
    username = fill("Username", "mara")
    sign_in = click("button", "Sign in")
    return task("login", "login", "Sign in as user mara with the password tulip-42.", {"/": pages.LOGIN},
                expect_post("/session", username="mara", password="tulip-42"),
                oracle=[username, fill("Password", "tulip-42"), sign_in, done()],
                wrong=[username, fill("Password", "tulip42"), sign_in, done()])


def two_step_login_task() -> GuiTask:
    """Email first, then the password on the page the site answers with; "Keep me signed in" starts ticked."""
    site = Site({"/": pages.IDENTIFY},
                post_reply=lambda path, form: pages.password_page(form.get("email", "")) if path == "/identify"
                else POSTED_PAGE)
    first = [fill("Email address", "lena@example.org"), click("button", "Next"), fill("Password", "r1ver-stone")]
    sign_in = click("button", "Sign in")
    return task("login", "login-two-step",
                "Sign in as lena@example.org with the password r1ver-stone. You are on a shared computer: do not "
                "stay signed in.", site,
                expect_post("/session", email="lena@example.org", password="r1ver-stone", remember=None),
                oracle=[*first, click("checkbox", "Keep me signed in"), sign_in, done()],
                wrong=[*first, sign_in, done()])  # leaves "Keep me signed in" ticked


# ---------------------------------------------------------------- settings
def notifications_task() -> GuiTask:
    rest = [click("checkbox", "Weekly digest email"), choose("Quiet hours", "22:00 to 07:00"), click("button", "Save")]
    return task("settings", "settings-notifications",
                "Stop the text messages, get the weekly digest email, and set quiet hours from 22:00 to 07:00. "
                "Leave the other notification settings as they are.",
                {"/": pages.NOTIFICATIONS},
                expect_post("/settings/notifications", orders="on", sms=None, push="on", digest="on",
                            quiet="22:00 to 07:00"),
                oracle=[click("checkbox", "Text messages (SMS)"), *rest, done()],
                wrong=[click("checkbox", "Push notifications"), *rest, done()])  # switches off the wrong channel


def display_task() -> GuiTask:
    rest = [choose("Text size", "Large"), click("checkbox", "Reduce motion"), click("button", "Save")]
    return task("settings", "settings-display",
                "Switch to the plain dark theme with large text, and reduce motion.",
                {"/": pages.DISPLAY},
                expect_post("/settings/display", theme="Dark", size="Large", motion="on"),
                oracle=[choose("Theme", "Dark"), *rest, done()],
                wrong=[choose("Theme", "Dark (high contrast)"), *rest, done()])


# ---------------------------------------------------------------- search
def library_search_task() -> GuiTask:
    search = [fill("Search the catalogue", "orchard", role="searchbox"), click("button", "Search")]
    return task("search", "search-library",
                "Borrow Cormac McCarthy's first novel, The Orchard Keeper, from the library.",
                {"/": pages.LIBRARY},
                expect_only_post("/borrow", book="b17"),
                oracle=[*search, click("button", "Borrow The Orchard Keeper by Cormac McCarthy (1965)"), done()],
                wrong=[*search, click("button", "Borrow The Orchard by Theresa Weir (2011)"), done()])


def shop_search_task() -> GuiTask:
    search = [fill("Search products", "usb-c cable", role="searchbox"), click("button", "Search")]
    return task("search", "search-shop",
                "Put a two-metre USB-C cable (USB-C at both ends) in the cart.",
                {"/": pages.SHOP},
                expect_only_post("/cart", sku="c-2m"),
                oracle=[*search, click("button", "Add to cart USB-C cable, 2 m (8.90 EUR)"), done()],
                wrong=[*search, click("button", "Add to cart USB-A to USB-C cable, 2 m (7.50 EUR)"), done()])


# ---------------------------------------------------------------- second page
def account_task() -> GuiTask:
    phone = "+44 20 7946 0018"
    save_on_account_page = [click("link", "Account settings"), fill("Phone", phone), click("button", "Save changes")]
    return task("second-page", "second-page-account",
                f"Change the phone number of your account to {phone}.",
                {"/": pages.ACCOUNT_HOME, "/account": pages.ACCOUNT},
                expect_post("/account", name="Ada Lovelace", email="ada@example.org", phone=phone),
                oracle=[*save_on_account_page, done()],
                wrong=[fill("Phone", phone), click("button", "Request a call back"), done()])  # the home page's form


def return_task() -> GuiTask:
    """The shoes are in the second order: the oracle looks at the first one, goes back, and opens the right one."""
    order_pages = {f"/orders/{n}": pages.order_page(n) for n in pages.ORDERS}
    look = [click("link", "Your orders"), click("link", "Order #1041")]
    return_it = click("button", "Request a return")
    return task("second-page", "second-page-orders",
                "Request a return for the order that contains the trail running shoes.",
                {"/": pages.SHOP_HOME, "/orders": pages.ORDER_LIST, **order_pages},
                expect_only_post("/returns", order="1042"),
                oracle=[*look, Step("go_back"), click("link", "Order #1042"), return_it, done()],
                wrong=[*look, return_it, done()])  # returns the running socks' order


# ---------------------------------------------------------------- table
def trains_task() -> GuiTask:
    return task("table", "table-trains",
                "When does the last train to Lyon leave today? Answer with its departure time as shown (HH:MM).",
                {"/": pages.TRAINS}, expect_answer("17:55"),
                oracle=[done("17:55")], wrong=[done("08:10")])  # the first train to Lyon


def budget_task() -> GuiTask:
    return task("table", "table-budget",
                "Which department spent the most in the third quarter (Q3)? Answer with the department's name.",
                {"/": pages.BUDGET}, expect_answer("Marketing"),
                oracle=[done("Marketing")], wrong=[done("Engineering")])  # the most over the whole year


# ---------------------------------------------------------------- app
def todo_task() -> GuiTask:
    add = [fill("New task", "Buy stamps"), click("button", "Add")]
    return task("app", "app-todo",
                "Add the task 'Buy stamps' to the to-do list and tick off 'Call the plumber'.",
                {"/": pages.TODO},
                expect_state("the to-do list", [{"text": "Call the plumber", "done": True},
                                                {"text": "Call the bank", "done": False},
                                                {"text": "Water the plants", "done": True},
                                                {"text": "Buy stamps", "done": False}]),
                oracle=[*add, click("checkbox", "Call the plumber"), done()],
                wrong=[*add, click("checkbox", "Call the bank"), done()],
                state_js="JSON.parse(localStorage.getItem('todos'))")


def cart_task() -> GuiTask:
    more = click("button", "One more Notebook")
    remove_pens = click("button", "Remove Pens (pack of 10)")
    return task("app", "app-cart",
                "Change the cart so that it holds 3 notebooks and no pens. Keep the stapler.",
                {"/": pages.CART},
                expect_state("the cart", {"Notebook": 3, "Stapler": 1}),
                oracle=[more, more, remove_pens, done()],
                wrong=[more, more, more, remove_pens, done()],  # adds 3 notebooks to the one already there
                state_js="JSON.parse(localStorage.getItem('cart'))")


# ---------------------------------------------------------------- dialog
def delete_file_task() -> GuiTask:
    ask = click("button", "Delete old-draft.docx")
    return task("dialog", "dialog-delete", "Delete the file old-draft.docx.", {"/": pages.DELETE_FILES},
                expect_only_post("/delete", file="old-draft.docx"),
                oracle=[ask, click("button", "Delete for good"), done()],
                wrong=[ask, click("button", "Cancel"), done()])  # backs out of the confirmation


def unsubscribe_task() -> GuiTask:
    confirm = click("button", "Confirm cancellation")
    return task("dialog", "dialog-unsubscribe",
                "Cancel your subscription. When asked why, say that it costs too much.",
                {"/": pages.SUBSCRIPTION},
                expect_only_post("/subscription/cancel", reason="It is too expensive"),
                oracle=[click("button", "Cancel subscription"), choose("Why are you leaving?", "It is too expensive"),
                        confirm, done()],
                wrong=[click("button", "Cancel subscription"), choose("Why are you leaving?", "Something else"),
                       confirm, done()])


def own_tasks() -> list[GuiTask]:
    """Every own task, sorted by id."""
    makers = [contact_form_task, shipping_form_task, login_task, two_step_login_task, notifications_task,
              display_task, library_search_task, shop_search_task, account_task, return_task, trains_task,
              budget_task, todo_task, cart_task, delete_file_task, unsubscribe_task]
    return sorted((make() for make in makers), key=lambda t: t.id)
