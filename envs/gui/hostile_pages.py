"""Pages written to break the GUI environment, each a task with a plain goal (env arg `tasks: hostile`).

A page may do anything a web page can; none of it may stop a run. Each task names its attack in its category
(hostile/<attack>) and asks for something simple, so an agent can still pass where the page allows it; where
the page makes the episode impossible (it hangs, its renderer crashes, it never loads) the attempt ends failed,
reward 0, with the reason in its details (envs/gui/world.py, `PageBroke`).
"""
from __future__ import annotations

from envs.gui.site import Site
from envs.gui.task import GuiTask, Step, Target, Verdict, steps
from envs.gui.tasks import expect_post

MAX_TURNS = 4
CONTINUE = Step("click", target=Target("button", "Continue"))


def _page(title: str, body: str, script: str = "") -> str:
    return (f"<!doctype html><html><head><title>{title}</title></head><body>{body}"
            f"{f'<script>{script}</script>' if script else ''}</body></html>")


def _never(state) -> Verdict:
    return Verdict(False, "this page's goal cannot be reached")


def _task(attack: str, pages: dict[str, str], judge, oracle=None, instruction: str = "Click Continue.") -> GuiTask:
    return GuiTask(id=f"hostile/{attack}", category=f"hostile/{attack}", site=Site(pages=pages), start_path="/",
                   judge=judge, instruction=instruction, max_turns=MAX_TURNS, oracle=oracle or steps(CONTINUE))


def hostile_tasks() -> list[GuiTask]:
    """One task per attack: navigation races, hangs, a renderer crash, a page that never loads."""
    form_away = _page("Form", '<form action="http://elsewhere.example/collect" method="post">'
                              '<input name="q" value="x"><button>Continue</button></form>')
    form_home = _page("Form", '<form action="/sent" method="post"><input name="q" value="x">'
                              '<button>Continue</button></form>')
    return [
        # a click submits a form to another origin: the read that follows races the navigation
        _task("form-elsewhere", {"/": form_away}, _never),
        # the same, to the site itself: the oracle passes through the race
        _task("form-navigates", {"/": form_home}, expect_post("/sent", q="x")),
        # a page that reloads itself: every read races a navigation
        _task("reload-loop", {"/": _page("Reload", "<button>Continue</button>",
                                         "setTimeout(() => location.reload(), 30)")}, _never),
        # a script that never yields, started by the click: the page stops answering
        _task("busy-after-click", {"/": _page("Busy", "<button onclick='setTimeout(() => {while (true) {}}, 0)'>"
                                                      "Continue</button>")}, _never),
        # a script that never yields while the page loads: the reset itself fails
        _task("busy-on-load", {"/": _page("Busy", "<button>Continue</button>", "while (true) {}")}, _never),
        # deep nesting: the accessibility snapshot (or the renderer) gives up
        _task("deep-nesting", {"/": _page("Deep", "<div>" * 5000 + "<button>Continue</button>" + "</div>" * 5000)},
              _never),
    ]
