"""The GUI environment in a real sandboxed headless browser: bad calls, isolation, cleanup, determinism.

One browser serves the module (as one serves an environment process). Tasks made up here exercise one
behaviour each; the own and MiniWoB++ sets are calibrated in tests/envs/test_gui_tasks.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clawr1.environment import AssistantTurn
from envs.gui.actions import ActionError, element_id, parse_call
from envs.gui.browser import BrowserHost, BrowserUnavailable, find_chromium
from envs.gui.env import GuiEnv
from envs.gui.miniwob import miniwob_task
from envs.gui.site import Site
from envs.gui.task import GuiTask, Target, Verdict, find_element
from envs.gui.world import GuiWorld
from tests.conftest import pid_alive


def _browser_missing() -> str:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "needs playwright (the `gui` extra: scripts/setup.sh installs it)"
    try:
        find_chromium()
    except BrowserUnavailable:
        return "needs Chromium: apt-get install chromium-headless-shell (.ci/run does)"
    return ""


pytestmark = pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-")


def page(body: str, script: str = "") -> str:
    return f"<!doctype html><html><head><title>Test</title></head><body>{body}<script>{script}</script></body></html>"


def made_up_task(pages: dict[str, str], state_js: str = "", task_id: str = "test/made-up") -> GuiTask:
    return GuiTask(id=task_id, category="test", site=Site(pages), start_path="/", instruction="a test",
                   judge=lambda state: Verdict(bool(state.answer), "answered" if state.answer else "no answer"),
                   state_js=state_js)


@pytest.fixture(scope="module")
def env():
    gui = GuiEnv({"tasks": "own"})
    yield gui
    gui.close()


@pytest.fixture(scope="module")
def host(env) -> BrowserHost:
    return env.host()


def call(world: GuiWorld, tool: str, **args):
    return world.call(tool, json.dumps(args))


def element(world: GuiWorld, role: str, name: str) -> str:
    ref = find_element(world.observation, Target(role, name))
    assert ref, f"no {role} {name!r} in:\n{world.observation}"
    return ref


# ---------------------------------------------------------------- calls (pure)
@pytest.mark.parametrize("name, arguments, message", [
    ("click", "{not json", "not valid JSON"),
    ("click", "[1]", "must be a JSON object"),
    ("scroll", "{}", "unknown tool 'scroll'"),
    ("fill", '{"id": "e3"}', "missing argument 'text'"),
    ("click", '{"id": "e3", "force": true}', "unknown argument 'force'"),
    ("click", '{"id": "the button"}', "is not an element id"),
    ("fill", '{"id": "e3", "text": {"a": 1}}', "must be text"),
])
def test_a_malformed_call_is_refused_with_its_reason(name, arguments, message):
    with pytest.raises(ActionError, match=message):
        parse_call(name, arguments)


def test_element_ids_are_read_as_the_observation_writes_them():
    assert [element_id("click", v) for v in ("e5", "5", "[ref=e5]", "ref=e5", "f2e7")] == ["e5"] * 4 + ["f2e7"]
    assert parse_call("press", '{"key": "Enter"}').element == ""


OBSERVATION = """Page: Orders http://gui.task/orders
- generic [active] [ref=e1]:
  - 'link "Order #1041" [ref=e2] [cursor=pointer]'
  - button "Save" [disabled] [ref=e3]
  - generic [ref=f1e4]: Submit
  - textbox "Name" [ref=e5]: Ada
  - textbox [ref=e6]
  - button "Save" [ref=e7]"""


@pytest.mark.parametrize("target, found", [
    (Target("link", "Order #1041"), "e2"),  # an entry Playwright quotes (its name holds '#')
    (Target("button", "Save"), "e3"), (Target("button", "Save", nth=1), "e7"), (Target("button", "Save", nth=2), None),
    (Target("generic", "Submit", text=True), "f1e4"),  # matched on its text; a frame-prefixed id
    (Target("textbox", exact=False, nth=1), "e6"), (Target("textbox", "Nam"), None), (Target("link", "Order"), None),
])
def test_a_scripted_agent_finds_elements_by_role_and_name(target, found):
    assert find_element(OBSERVATION, target) == found


# ---------------------------------------------------------------- bad calls in a live page
BAD_CALLS_PAGE = page(
    '<label>Name <input id=name></label><button id=fading>Fading</button><button disabled>Locked</button>'
    '<a href="/two">Next page</a>')


def test_bad_calls_fail_with_a_reason_and_the_episode_goes_on(host):
    world = GuiWorld(host, made_up_task({"/": BAD_CALLS_PAGE, "/two": page("<button>Done</button>")})).open()
    try:
        box, fading = element(world, "textbox", "Name"), element(world, "button", "Fading")
        # the page changes by itself after the agent saw it (as a timer would): the button it saw is now hidden
        host.run(world.page.evaluate("document.getElementById('fading').style.visibility = 'hidden'"))
        cases = [(call(world, "click", id=fading), f"element {fading} is hidden"),
                 (world.call("fill", "{oops"), "not valid JSON"), (world.call("hover", "{}"), "unknown tool"),
                 (call(world, "fill", id=box), "missing argument 'text'"),
                 (call(world, "click", id="e999"), "unknown element id 'e999'"),
                 (call(world, "click", id=element(world, "button", "Locked")), "is disabled"),
                 (call(world, "select_option", id=box, option="x"), "select_option on")]
        for outcome, reason in cases:
            assert not outcome.ok and reason in outcome.error and not outcome.submitted
            assert outcome.output.startswith("Page:")  # the agent still sees the page
        assert call(world, "fill", id=box, text="Ada").ok
        assert call(world, "click", id=element(world, "link", "Next page")).ok
        stale = call(world, "fill", id=box, text="again")
        assert not stale.ok and f"stale element id '{box}'" in stale.error
        assert "button \"Done\"" in world.observation
        back = call(world, "go_back")
        assert back.ok and find_element(world.observation, Target("textbox", "Name"))
        assert call(world, "submit", answer="done").submitted
        assert world.grade([]).passed
    finally:
        world.close()


# ---------------------------------------------------------------- isolation
STORAGE_PAGE = page('<p id=seen>?</p><a href="/">Reload</a>',
                    "document.getElementById('seen').textContent = 'storage=' + (localStorage.getItem('mark') || "
                    "'none') + ' cookie=' + (document.cookie || 'none'); localStorage.setItem('mark', 'set'); "
                    "document.cookie = 'mark=set; path=/';")


def test_storage_and_cookies_never_reach_the_next_episode(host):
    task = made_up_task({"/": STORAGE_PAGE})
    for _ in range(2):
        world = GuiWorld(host, task).open()
        try:
            assert "storage=none cookie=none" in world.observation
            call(world, "click", id=element(world, "link", "Reload"))  # within the episode they do persist
            assert "storage=set cookie=mark=set" in world.observation
        finally:
            world.close()


class _CountingServer:
    def __init__(self):
        self.hits = 0
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                counter.hits += 1
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"reached")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def _goto_without_routes(browser: BrowserHost, url: str) -> str:
    """Open `url` in a context with no routing at all: only the browser's sandbox stands in the way."""
    async def go() -> str:
        context = await browser.new_context()
        try:
            page_ = await context.new_page()
            try:
                await page_.goto(url, timeout=5000)
                return await page_.content()
            except Exception as e:
                return f"failed: {e}"
        finally:
            await context.close()
    return browser.run(go(), timeout_s=60)


def test_a_server_on_the_host_loopback_is_unreachable_from_a_page(host):
    with _CountingServer() as server:
        fetching = page("<button onclick=\"fetch(URL).then(() => document.title = 'reached', "
                        "() => document.title = 'blocked')\">Fetch</button>".replace("URL", json.dumps(server.url)
                                                                                   .replace('"', "'")))
        world = GuiWorld(host, made_up_task({"/": fetching}, state_js="document.title")).open()
        try:
            call(world, "click", id=element(world, "button", "Fetch"))
            deadline = time.monotonic() + 10
            while world.host.run(world.page.title()) == "Test" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert world.host.run(world.page.title()) == "blocked"
            assert any(server.url in url for url in world.router.refused)
        finally:
            world.close()
        assert "failed:" in _goto_without_routes(host, server.url)  # the sandbox's own network namespace
        assert server.hits == 0
        unsandboxed = BrowserHost(sandbox=False).start()  # no namespace: the browser's own settings refuse it too
        try:
            assert "failed:" in _goto_without_routes(unsandboxed, server.url)
        finally:
            unsandboxed.close()
        assert server.hits == 0
        urllib.request.urlopen(server.url, timeout=10).read()  # the control: what reaches the server is counted
        assert server.hits == 1


# ---------------------------------------------------------------- cleanup
class _RaisingClient:
    async def chat(self, *args, **kwargs) -> AssistantTurn:
        raise RuntimeError("the policy broke")

    async def complete(self, *args, **kwargs) -> None:
        pass


class _HangingClient:
    def __init__(self):
        self.asked = asyncio.Event()

    async def chat(self, *args, **kwargs) -> AssistantTurn:
        self.asked.set()
        await asyncio.sleep(3600)

    async def complete(self, *args, **kwargs) -> None:
        pass


def test_no_context_is_left_after_an_episode_raises_or_is_cancelled(env, host):
    task = env.tasks("own")[0]
    with pytest.raises(RuntimeError, match="the policy broke"):
        asyncio.run(env.run_task(_RaisingClient(), task, "raises"))
    assert host.context_count() == 0

    async def cancel_mid_episode() -> None:
        client = _HangingClient()
        episode = asyncio.create_task(env.run_task(client, task, "cancelled"))
        await asyncio.wait_for(client.asked.wait(), 60)
        assert host.context_count() == 1
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode

    asyncio.run(cancel_mid_episode())
    assert host.context_count() == 0

    async def cancel_while_opening() -> None:
        episode = asyncio.create_task(env.run_task(_HangingClient(), task, "opening"))
        await asyncio.sleep(0)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode

    asyncio.run(cancel_while_opening())
    deadline = time.monotonic() + 30  # the world finishes opening in its thread, then closes itself
    while host.context_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host.context_count() == 0


def test_no_browser_process_is_left_after_the_environment_closes():
    gui = GuiEnv({"tasks": "own"})
    host = gui.host()
    pids = host.processes()
    assert len(pids) >= 3, pids  # the driver, bwrap, Chromium and its helpers
    assert all(pid_alive(p) for p in pids)
    gui.close()
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if pid_alive(p)]


def test_a_crashed_browser_is_restarted_for_the_next_episode():
    gui = GuiEnv({"tasks": "own"})
    try:
        host = gui.host()
        driver = host.driver_pid()
        for pid in host.processes():
            if pid != driver:
                with contextlib.suppress(ProcessLookupError):  # it may have died with the sandbox
                    os.kill(pid, signal.SIGKILL)  # the sandbox and the browser this test started
        deadline = time.monotonic() + 30
        while host.connected() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not host.connected()
        oracle = gui.scripted_agent("oracle")
        result = asyncio.run(gui.run_task(oracle, gui.tasks("own")[0], "after-crash"))
        assert result.passed and host.launches == 2
    finally:
        gui.close()


# ---------------------------------------------------------------- determinism
@pytest.mark.parametrize("make", [lambda env: miniwob_task("click-button", 7),
                                  lambda env: env.tasks("own")[0]], ids=["miniwob", "own"])
def test_the_same_task_and_seed_give_the_same_first_observation(env, host, make):
    firsts = []
    for _ in range(3):
        world = GuiWorld(host, make(env)).open()
        firsts.append((world.instruction, world.observation))
        world.close()
    assert firsts[0] == firsts[1] == firsts[2]
    assert "[ref=e" in firsts[0][1]


def test_miniwob_seeds_differ(host):
    seen = set()
    for seed in range(4):
        world = GuiWorld(host, miniwob_task("click-button", seed)).open()
        seen.add(world.observation)
        world.close()
    assert len(seen) > 1
