"""MiniWoB++'s text tasks (the `miniwob` PyPI package's pages), played through the accessibility tree.

The package is used as data: its pages are served from memory at MINIWOB_ORIGIN, and its
`fields.py` (each instruction's fields, e.g. the button to click) is loaded by path, so gymnasium
and selenium, which `import miniwob` pulls in, are never needed.

An episode seeds the page's random generator (`Math.seedrandom`), raises the task's time limit far
beyond any model's pace, and starts it. The task's own reward decides: +1 when its raw reward is
above 0, -1 otherwise. The page ends the episode when the task says it is done.

`ORACLES` holds a field-driven scripted solution per task type; `MINIWOB_SET` the types whose
oracle passes on 20 seeds (`python -m envs.gui.calibrate` checks them).
"""
from __future__ import annotations

import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from envs.gui.site import Site
from envs.gui.task import FinalState, GuiTask, Plan, Step, Target, Verdict, elements, find_element

MINIWOB_ORIGIN = "http://miniwob.task"
EPISODE_MAX_TIME_MS = 1_000_000_000  # about 11 days (setTimeout's limit is 2**31 - 1 ms): never the model's clock
MAX_TURNS = 12
STATE_JS = "({done: WOB_DONE_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON})"


class MiniwobUnavailable(RuntimeError):
    pass


@lru_cache(maxsize=1)
def package_dir() -> Path:
    """The installed `miniwob` package's directory (found without importing it)."""
    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise MiniwobUnavailable("gui env: the MiniWoB++ tasks need the `miniwob` package "
                                 "(pip install --no-deps miniwob==1.1.0, or the project's `gui` extra)")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=1)
def fields_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("miniwob_fields", package_dir() / "fields.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def instruction_fields(task_type: str, instruction: str) -> dict[str, str]:
    """The fields MiniWoB++ extracts from a task's instruction (e.g. {"target": "Yes"})."""
    return dict(fields_module().get_field_extractor(task_type)(instruction))


@lru_cache(maxsize=1)
def miniwob_site() -> Site:
    return Site(origin=MINIWOB_ORIGIN, files=package_dir() / "html", files_prefix="/")


def _judge(state: FinalState) -> Verdict:
    page = state.page_state or {}
    raw = float(page.get("raw") or 0.0)
    if not page.get("done"):
        return Verdict(False, "the task was not finished (the page never ended the episode)")
    reason = page.get("reason") or ""
    return Verdict(raw > 0, f"MiniWoB++ raw reward {raw:g}" + (f" ({reason})" if reason else ""))


# MiniWoB++'s score panel (last reward, time left, episodes done) is for people watching, not for the agent;
# hidden, the agent sees the whole page (dialogs and suggestion lists live outside the task's #wrap).
HIDE_SCORE_PANEL = ("document.head.insertAdjacentHTML('beforeend', "
                    "'<style>#reward-display { display: none !important; }</style>');")


def start_js(seed: int) -> str:
    return (f"{HIDE_SCORE_PANEL} Math.seedrandom({json.dumps(str(seed))}); "
            f"core.EPISODE_MAX_TIME = {EPISODE_MAX_TIME_MS}; core.startEpisodeReal();")


def miniwob_task(task_type: str, seed: int) -> GuiTask:
    oracle = ORACLES.get(task_type)
    return GuiTask(
        id=f"miniwob/{task_type}/s{seed}", category=f"miniwob/{task_type}", site=miniwob_site(),
        start_path=f"/miniwob/{task_type}.html", judge=_judge, start_js=start_js(seed), ready_js="WOB_TASK_READY",
        instruction_js="core.getUtterance()", observe="body", done_js="WOB_DONE_GLOBAL", state_js=STATE_JS,
        max_turns=MAX_TURNS, oracle=_field_plan(task_type, oracle) if oracle else None)


# ---------------------------------------------------------------- field-driven oracles
# An oracle gets the instruction's fields, the current observation and the step number; it returns the next
# step, or None when it has nothing more to do.
Oracle = Callable[[dict[str, str], str, int], Optional[Step]]


def _field_plan(task_type: str, oracle: Oracle) -> Plan:
    return lambda instruction, observation, k: oracle(instruction_fields(task_type, instruction), observation, k)


def _plan(k: int, *plan: Step) -> Optional[Step]:
    """Step `k` of a fixed plan (None once it is over)."""
    return plan[k] if k < len(plan) else None


def _click(role: str, name: str = "", **how: Any) -> Step:
    return Step("click", target=Target(role, name, **how))


def _fill(text: str, nth: int = 0) -> Step:
    """Type `text` into the page's `nth` text box (whatever its name)."""
    return Step("fill", {"text": text}, Target("textbox", exact=False, nth=nth))


def _texts(observation: str) -> list[str]:
    """The text of every element that shows some, in page order."""
    return [text for _, _, _, text in elements(observation) if text]


SUBMIT = _click("button", "Submit")


def _click_button(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click the button named in the instruction.
    return _plan(k, _click("button", fields["target"]))


def _press_button(name: str) -> Step:
    """Press the named button with the keyboard (Enter): where the page may place another button over it, a
    click could land on that one, or be refused."""
    return Step("press", {"key": "Enter"}, Target("button", name))


def _click_button_sequence(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Press button ONE, then button TWO (they may overlap).
    return _plan(k, _press_button("ONE"), _press_button("TWO"))


def _click_test_2(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Press the named one of two buttons (they may overlap).
    return _plan(k, _press_button(fields["target"]))


def _click_dialog(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Close the dialog with its "x" (whose accessible name is Close).
    return _plan(k, _click("button", "Close"))


def _click_dialog_2(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click the dialog's button labelled as asked: "x" is its Close button, the others are named.
    return _plan(k, _click("button", "Close" if fields["target"] == "x" else fields["target"]))


def _click_test(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click the (only) button.
    return _plan(k, _click("button", "Click Me!"))


def _click_checkboxes(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Tick the named checkboxes (maybe none), then Submit.
    names = [v for key, v in fields.items() if key.startswith("target")]
    return _plan(k, *[_click("checkbox", name) for name in names], SUBMIT)


def _click_option(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Choose the named radio button, then Submit.
    return _plan(k, _click("radio", fields["target"]), SUBMIT)


def _click_tab(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click Tab #N.
    return _plan(k, _click("link", f"Tab #{fields['target']}"))


def _click_collapsible(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Expand the (only) section, then Submit.
    return _plan(k, _click("tab", exact=False), SUBMIT)


def _choose_list(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Pick the named item of the drop-down list, then Submit.
    return _plan(k, Step("select_option", {"option": fields["target"]}, Target("combobox")), SUBMIT)


def _enter_text(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the given text, then Submit.
    return _plan(k, _fill(fields["target"]), SUBMIT)


def _enter_text_2(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the given text in upper or lower case, then Submit.
    text = fields["text"].upper() if fields["case"] == "upper" else fields["text"].lower()
    return _plan(k, _fill(text), SUBMIT)


def _enter_password(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the password into both boxes, then Submit.
    return _plan(k, _fill(fields["target"], 0), _fill(fields["target"], 1), SUBMIT)


def _enter_date(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Enter the date MM/DD/YYYY into the date box (which takes YYYY-MM-DD), then Submit.
    month, day, year = fields["target"].split("/")
    return _plan(k, _fill(f"{year}-{month}-{day}"), SUBMIT)


def _enter_time(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Enter the time H:MMAM/PM into the time box (which takes 24-hour HH:MM), then Submit.
    clock, half = fields["target"][:-2], fields["target"][-2:]
    hour, minute = (int(part) for part in clock.split(":"))
    hour = hour % 12 + (12 if half == "PM" else 0)
    return _plan(k, _fill(f"{hour:02d}:{minute:02d}"), SUBMIT)


def _login_user(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the username and the password, then log in.
    return _plan(k, _fill(fields["username"], 0), _fill(fields["password"], 1), _click("button", "Login"))


def _login_user_popup(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Log in as in login-user, cancelling the popup that may cover the form (its OK would quit).
    if find_element(observation, Target("button", "Cancel")):
        return _click("button", "Cancel")
    boxes = [text for role, _, _, text in elements(observation) if role == "textbox"]
    for i, value in enumerate((fields["username"], fields["password"])):
        if boxes[i] != value:
            return _fill(value, i)
    return _click("button", "OK")


def _focus_text(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click into the (only) text box.
    return _plan(k, _click("textbox", exact=False))


def _focus_text_2(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Click into the Nth text box.
    return _plan(k, _click("textbox", exact=False, nth=int(fields["target"]) - 1))


def _use_autocomplete(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Enter a text that starts and ends as asked (the page checks only that), leave the box (Tab: that closes
    # the suggestions, which would cover Submit), then Submit.
    return _plan(k, _fill(fields["start"] + fields.get("end", "")),
                 Step("press", {"key": "Tab"}, Target("textbox", exact=False)), SUBMIT)


def _read_table(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the table's value for the named row, then Submit.
    cells = [name for role, name, _, _ in elements(observation) if role == "cell"]
    value = cells[cells.index(fields["target"]) + 1]
    return _plan(k, _fill(value), SUBMIT)


def _read_table_2(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Fill each labelled box ("Color:") with the table's value for that label, then Submit.
    cells = [name for role, name, _, _ in elements(observation) if role == "cell"]
    table = dict(zip(cells[::2], cells[1::2]))
    labels = [text.removesuffix(":") for text in _texts(observation) if text.endswith(":")]
    return _plan(k, *[_fill(table[label], i) for i, label in enumerate(labels)], SUBMIT)


def _simple_arithmetic(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Solve the shown problem ("7 x 3 =") and Submit the answer.
    problem = next(t for t in _texts(observation) if re.fullmatch(r"\d+ [-+x] \d+ =", t))
    a, op, b, _ = problem.split()
    answer = {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op]
    return _plan(k, _fill(str(answer)), SUBMIT)


def _simple_algebra(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Solve the shown equation for x ("x - 3 = 40" or "3 - x = 40") and Submit x.
    equation = next(t for t in _texts(observation) if re.fullmatch(r"\S+ [-+] \S+ = -?\d+", t))
    left, op, right, _, result = equation.split()
    if left == "x":
        x = int(result) - int(right) if op == "+" else int(result) + int(right)
    else:
        x = int(result) - int(left) if op == "+" else int(left) - int(result)
    return _plan(k, _fill(str(x)), SUBMIT)


def _find_word(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the paragraph's Nth word (without punctuation), then Submit.
    paragraph = next(text for role, _, _, text in elements(observation) if role == "paragraph")
    word = re.sub(r"[^a-zA-Z]", "", paragraph.split()[int(fields["target"]) - 1])
    return _plan(k, _fill(word), SUBMIT)


def _scroll_text(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Type the last word of the text area (without punctuation) into the other text box, then Submit.
    text = next(text for role, _, _, text in elements(observation) if role == "textbox" and text)
    return _plan(k, _fill(re.sub(r"[^a-zA-Z0-9]", "", text.split()[-1]), 1), SUBMIT)


GUESS_TREE = {5: (2, 8), 2: (0, 3), 0: (None, 1), 3: (None, 4), 8: (6, 9), 6: (None, 7)}  # guess: (lower, higher)


def _guess_number(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Guess 0-9 and Submit, following the feedback down a search tree (5, then 2 or 8, ...).
    if k % 2:
        return SUBMIT
    feedback = next((re.match(r"The number is (lower|higher) than (\d+)", t) for t in _texts(observation)
                     if t.startswith("The number is")), None)
    guess = 5 if feedback is None else GUESS_TREE[int(feedback[2])][feedback[1] == "higher"]
    return Step("fill", {"text": str(guess)}, Target("spinbutton", exact=False))


def _use_spinner(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Set the spinner to the given number, then Submit.
    return _plan(k, Step("fill", {"text": fields["target"]}, Target("spinbutton", exact=False)), SUBMIT)


def _search_engine(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Search for the query, then click the Nth result (3 per page; the result links come first on a page).
    page, index = divmod(int(fields["rank"]) - 1, 3)
    turn_page = [_click("link", str(page + 1))] if page else []
    return _plan(k, _fill(fields["query"]), _click("button", "Search"), *turn_page,
                 _click("link", exact=False, nth=index))


MOVIE_LABELS = {"Genre": "genre", "Movie Genre": "genre", "Director": "director", "Director Name": "director",
                "Year": "year", "Released Date": "year"}


def _multi_layouts(fields: dict[str, str], observation: str, k: int) -> Optional[Step]:
    # Fill genre, director and year into the boxes their labels name (label i goes with box i), then submit.
    labels = [(name or text).removesuffix(":") for _, name, _, text in elements(observation)]
    boxes = [MOVIE_LABELS[label] for label in labels if label in MOVIE_LABELS]
    buttons = [name for role, name, _, _ in elements(observation) if role == "button"]
    submit = _click("button", buttons[0]) if buttons else next(
        _click("generic", t, text=True) for t in ("Submit", "Search") if t in _texts(observation))
    return _plan(k, *[_fill(fields[field], i) for i, field in enumerate(boxes)], submit)


ORACLES: dict[str, Oracle] = {
    "click-button": _click_button,
    "click-button-sequence": _click_button_sequence,
    "click-checkboxes": _click_checkboxes,
    "click-checkboxes-large": _click_checkboxes,
    "click-checkboxes-transfer": _click_checkboxes,
    "click-collapsible": _click_collapsible,
    "click-dialog": _click_dialog,
    "click-dialog-2": _click_dialog_2,
    "click-option": _click_option,
    "click-tab": _click_tab,
    "click-test": _click_test,
    "click-test-2": _click_test_2,
    "click-test-transfer": _click_test_2,
    "choose-list": _choose_list,
    "enter-date": _enter_date,
    "enter-password": _enter_password,
    "enter-text": _enter_text,
    "enter-text-2": _enter_text_2,
    "enter-text-dynamic": _enter_text,
    "enter-time": _enter_time,
    "find-word": _find_word,
    "focus-text": _focus_text,
    "focus-text-2": _focus_text_2,
    "guess-number": _guess_number,
    "login-user": _login_user,
    "login-user-popup": _login_user_popup,
    "multi-layouts": _multi_layouts,
    "multi-orderings": _multi_layouts,
    "read-table": _read_table,
    "read-table-2": _read_table_2,
    "scroll-text": _scroll_text,
    "search-engine": _search_engine,
    "simple-algebra": _simple_algebra,
    "simple-arithmetic": _simple_arithmetic,
    "unicode-test": _click_button,
    "use-autocomplete": _use_autocomplete,
    "use-spinner": _use_spinner,
}

# The task types whose oracle passed on 20 seeds (python -m envs.gui.calibrate); the public set. Left out:
# click-checkboxes-large (up to 12 boxes and Submit: more steps than MAX_TURNS), and types no oracle can play
# through this observation and these tools: click-link, click-tab-2, click-collapsible-2 (their links are styled
# text, with no role or id), click-widget (a textarea and a text input are both `textbox`), click-menu-2 (some
# items are icons only), navigate-tree (folders and files look alike until clicked, and a wrong file ends the
# episode), social-media (icon buttons with no name), copy-paste (the text to copy ends with a space the tree
# does not show).
MINIWOB_SET: tuple[str, ...] = (
    "click-button", "click-button-sequence", "click-checkboxes", "click-checkboxes-transfer", "click-collapsible",
    "click-dialog", "click-dialog-2", "click-option", "click-tab", "click-test", "click-test-2",
    "click-test-transfer", "choose-list", "enter-date", "enter-password", "enter-text", "enter-text-2",
    "enter-text-dynamic", "enter-time", "find-word", "focus-text", "focus-text-2", "guess-number", "login-user",
    "login-user-popup", "multi-layouts", "multi-orderings", "read-table", "read-table-2", "scroll-text",
    "search-engine", "simple-algebra", "simple-arithmetic", "unicode-test", "use-autocomplete", "use-spinner",
)


def miniwob_tasks(types: tuple[str, ...] = MINIWOB_SET, seeds: range = range(3)) -> list[GuiTask]:
    return [miniwob_task(t, s) for t in types for s in seeds]
