"""One GUI episode: a fresh browser context, the task's site, actions by element id, the final state.

`GuiWorld` is an `envs.agentic.agent.World`: `call` runs one tool call and answers with the new
observation (the page's accessibility tree, an id per element); `grade` judges the end state once.
Its methods block; they run the browser work on the `BrowserHost`'s thread.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from envs.agentic.agent import Grade, ToolOutcome
from envs.gui.actions import Action, ActionError, parse_call
from envs.gui.browser import BrowserHost, first_line
from envs.gui.observation import page_observation
from envs.gui.site import SiteRouter
from envs.gui.task import FinalState, GuiTask

ACTION_TIMEOUT_MS = 3000
LOAD_TIMEOUT_MS = 10000
LOAD_GRACE_MS = 2000  # after the DOM is ready, how long to wait for `load` (a frame that never loads holds it off)
UNLOADED_FRAME_MS = 2000  # the snapshot's wait where a frame never loaded (a blocked file:// iframe waits it out)
READY_TIMEOUT_S = 10.0
VIEWPORT = {"width": 1024, "height": 768}
CALL_TIMEOUT_S = 60.0  # a whole call on the browser's thread (action, settling, observation)


class EpisodeSetupError(RuntimeError):
    pass


class PageBroke(RuntimeError):
    """The page made its episode impossible to go on: it could not be opened, its renderer crashed, or it stopped
    answering. The episode ends failed with reward 0 and this reason; the run goes on (never the env's own bug)."""


def _playwright_error() -> type:
    from playwright.async_api import Error

    return Error


def _navigated(error: BaseException) -> bool:
    """A read raced a navigation the page started (a form posted elsewhere, a script that reloads)."""
    text = str(error)
    return "Execution context was destroyed" in text or "navigation" in text.lower()


class GuiWorld:
    """A task's episode in its own browser context, closed by `close()` whatever happened."""

    def __init__(self, host: BrowserHost, task: GuiTask, max_observation_chars: int = 6000,
                 call_timeout_s: float = CALL_TIMEOUT_S):
        self.host = host
        self.call_timeout_s = call_timeout_s
        self.task = task
        self.max_chars = max_observation_chars
        self.router = SiteRouter(task.site)
        self.context: Any = None
        self.page: Any = None
        self.instruction = task.instruction
        self.observation = ""
        self.shown_ids: set[str] = set()  # in the last observation
        self.seen_ids: set[str] = set()  # in any observation of this episode
        self.answer: Optional[str] = None
        self.done = False
        self.broken = ""  # why the page ended the episode early (PageBroke's reason); "" while it has not
        self.events: list[str] = []  # what the page did during the current call that the agent is told of
        self._navigated = False  # the main frame loaded a new document during the current call
        self._closed = False

    # -- start
    def open(self) -> "GuiWorld":
        """Open the context and the start page; the first observation is in `self.observation`."""
        try:
            self.host.run(self._open(), self.call_timeout_s)
        except (_playwright_error(), TimeoutError, EpisodeSetupError) as e:
            self.close()
            raise PageBroke(f"the page could not be opened: {first_line(e)}") from e
        except BaseException:
            self.close()
            raise
        return self

    async def _open(self) -> None:
        self.context = await self.host.new_context(viewport=VIEWPORT, service_workers="block", locale="en-US",
                                                   timezone_id="UTC")
        await self.context.route("**/*", self.router.handle)
        self.context.set_default_timeout(ACTION_TIMEOUT_MS)
        self.page = await self.context.new_page()
        self.context.on("page", self._close_popup)
        self.page.on("console", self._note_refusal)
        self.page.on("framenavigated", self._note_navigation)
        self.page.on("websocket", lambda socket: self.router.refused.append(socket.url))  # the proxy refuses it
        await self.page.goto(self.task.site.url(self.task.start_path), timeout=LOAD_TIMEOUT_MS,
                             wait_until="domcontentloaded")
        await self._wait_loaded()
        if self.task.start_js:
            await self.page.evaluate(self.task.start_js)
        if self.task.ready_js:
            await self._wait_true(self.task.ready_js)
        if self.task.instruction_js:
            self.instruction = str(await self.page.evaluate(self.task.instruction_js))
        self.observation = await self._observe()

    async def _wait_loaded(self) -> None:
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        try:
            await self.page.wait_for_load_state("load", timeout=LOAD_GRACE_MS)
        except PlaywrightTimeout:
            pass  # a subframe that never loads (a blocked file:// iframe): the page is read as it is

    # -- what the page does by itself, told to the agent with the call's answer
    async def _close_popup(self, popup: Any) -> None:  # registered after the episode's own page was made
        url = popup.url if popup.url not in ("", "about:blank") else ""
        self.events.append(f"the page opened a new window{f' at {url}' if url else ''}: the env closed it "
                           f"(one window is shown)")
        await popup.close()

    def _note_refusal(self, message: Any) -> None:
        text = message.text
        if message.type == "error" and text.startswith("Not allowed to"):  # Chromium refused a navigation
            self.events.append(f"the page tried to open a URL the browser refuses ({text[:200]}): nothing opened")

    def _note_navigation(self, frame: Any) -> None:
        if frame == self.page.main_frame:
            self._navigated = True

    async def _leave_error_page(self) -> None:
        """The page navigated somewhere the site refused (another origin): say where, and go back."""
        refused = self.router.refused_navigations
        where = refused[-1] if refused else "a page outside the task's site"
        self.events.append(f"the page tried to open {where}, outside the task's site: refused, back on the "
                           f"previous page")
        await self.page.go_back(timeout=LOAD_TIMEOUT_MS, wait_until="domcontentloaded")

    async def _wait_true(self, js: str) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not await self.page.evaluate(js):
            if time.monotonic() > deadline:
                raise EpisodeSetupError(f"gui task {self.task.id}: the page never became ready ({js})")
            await asyncio.sleep(0.02)

    # -- acting
    def call(self, name: str, arguments: str) -> ToolOutcome:
        t0 = time.monotonic()
        try:
            action = parse_call(name, arguments)
        except ActionError as e:
            return ToolOutcome(self.observation, ok=False, error=str(e), wall_s=time.monotonic() - t0)
        if action.tool == "submit":
            self.answer = action.args.get("answer", "")
            return ToolOutcome("The task is submitted.", submitted=True, wall_s=time.monotonic() - t0)
        try:
            error = self.host.run(self._act(action), self.call_timeout_s)
        except TimeoutError:
            return self._end_early(f"the page did not answer within {self.call_timeout_s:g} s", t0)
        except _playwright_error() as e:  # past what _act turns into tool errors: the page is gone
            return self._end_early(f"the browser failed on this page ({first_line(e)})", t0)
        return ToolOutcome(self.observation, ok=not error, error=error, submitted=self.done,
                           wall_s=time.monotonic() - t0)

    def _end_early(self, reason: str, t0: float) -> ToolOutcome:
        """The page broke the episode: the agent is told, and the episode ends (graded failed, reward 0)."""
        self.broken = reason
        return ToolOutcome(f"The episode ended: {reason}.", ok=False, error=reason, submitted=True,
                           wall_s=time.monotonic() - t0)

    async def _act(self, action: Action) -> str:
        """Do `action`, then observe the page; the error ("" when it worked), with what the page did meanwhile."""
        self.events, self._navigated = [], False
        try:
            await self._perform(action)
            error = ""
        except ActionError as e:
            error = str(e)
        await self._settle()
        if self.page.url.startswith("chrome-error://"):
            await self._leave_error_page()
        if self.task.done_js and await self._evaluate(self.task.done_js):
            self.done = True
        self.observation = await self._observe()
        return "; ".join(filter(None, [error, *self.events]))

    async def _evaluate(self, js: str) -> Any:
        """`js` in the page, once more after the load if a navigation the page started raced it."""
        try:
            return await self.page.evaluate(js)
        except _playwright_error() as e:
            if not _navigated(e):
                raise
        await self.page.wait_for_load_state("load", timeout=LOAD_TIMEOUT_MS)
        return await self.page.evaluate(js)

    async def _perform(self, action: Action) -> None:
        from playwright.async_api import Error as PlaywrightError, TimeoutError as PlaywrightTimeout

        if action.tool == "go_back":
            if not await self._has_previous_page():
                raise ActionError("go_back: there is no previous page (this is the task's first page)")
            await self.page.go_back(timeout=LOAD_TIMEOUT_MS, wait_until="domcontentloaded")
            return
        target = await self._element(action) if action.element else None
        try:
            if action.tool == "click":
                await target.click()
            elif action.tool == "fill":
                await target.fill(action.args["text"])
            elif action.tool == "select_option":
                await target.select_option(label=action.args["option"])
            elif action.tool == "press":
                await (target.press(action.args["key"]) if target else self.page.keyboard.press(action.args["key"]))
        except PlaywrightTimeout:
            where = action.element or "the page"
            raise ActionError(f"{action.tool}: timed out after {ACTION_TIMEOUT_MS / 1000:g} s on {where} (it may be "
                              f"covered by another element, or not accept this action)") from None
        except PlaywrightError as e:
            raise ActionError(f"{action.tool} on {action.element or 'the page'} failed: {first_line(e)}") from None

    async def _has_previous_page(self) -> bool:
        """Whether the tab's history has a page of the task's before this one (the tab opened on about:blank)."""
        cdp = await self.context.new_cdp_session(self.page)
        try:
            history = await cdp.send("Page.getNavigationHistory")
        finally:
            await cdp.detach()
        i = history["currentIndex"]
        return i > 0 and history["entries"][i - 1]["url"] not in ("", "about:blank")

    async def _element(self, action: Action) -> Any:
        """The live element an action names, or an ActionError that says why there is none to act on."""
        ref = action.element
        stale = ActionError(f"{action.tool}: stale element id {ref!r}: it is no longer on the page (the page "
                            f"changed); use the ids of the new observation")
        if ref not in self.shown_ids:
            if ref in self.seen_ids:
                raise stale
            raise ActionError(f"{action.tool}: unknown element id {ref!r}: the last observation has no [ref={ref}]")
        locator = self.page.locator(f"aria-ref={ref}")
        try:
            found = await locator.count()
        except Exception:
            found = 0
        if not found:
            raise stale
        if not await locator.is_visible():
            raise ActionError(f"{action.tool}: element {ref} is hidden")
        if action.tool != "press" and not await locator.is_enabled():
            raise ActionError(f"{action.tool}: element {ref} is disabled")
        return locator

    async def _settle(self) -> None:
        """Let what the action started (a navigation, a script's timer) land before observing."""
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        await self._evaluate("() => new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")
        if not self._navigated:
            return
        try:
            await self.page.wait_for_load_state("domcontentloaded", timeout=LOAD_TIMEOUT_MS)
        except PlaywrightTimeout:
            return  # a page still loading is observed as it is
        await self._wait_loaded()

    async def _observe(self) -> str:
        tree = await self._snapshot()
        seen = page_observation(await self._evaluate("() => document.title"), self.page.url, tree, self.max_chars)
        self.shown_ids = set(seen.shown)
        self.seen_ids |= self.shown_ids
        return seen.text

    async def _snapshot(self) -> str:
        """The accessibility tree; where a frame never loaded, first with a short wait (the snapshot waits its
        whole timeout for such a frame, then leaves it out), then with the full one."""
        unloaded = any(not f.url for f in self.page.frames if f != self.page.main_frame)
        for timeout_ms in ((UNLOADED_FRAME_MS,) if unloaded else ()) + (LOAD_TIMEOUT_MS,):
            try:
                return await self.page.locator(self.task.observe).aria_snapshot(mode="ai", timeout=timeout_ms)
            except Exception as e:
                error = e
        return f"(the page could not be read: {first_line(error)})"

    # -- the end
    def grade(self, messages: list[dict]) -> Grade:
        if not self.broken:
            try:
                state = self.host.run(self._final_state(), self.call_timeout_s)
            except TimeoutError:
                self.broken = f"the final page did not answer within {self.call_timeout_s:g} s"
            except _playwright_error() as e:
                self.broken = f"the final page could not be read ({first_line(e)})"
        if self.broken:
            return Grade(False, 0.0, feedback=f"The episode ended early: {self.broken}.",
                         details={"reason": self.broken, "broken": True, "refused_requests": len(self.router.refused)})
        verdict = self.task.judge(state)
        details = {"reason": verdict.reason, "answer": state.answer, "posts": [p.as_dict() for p in state.posts],
                   "url": state.url, "refused_requests": len(self.router.refused)}
        return Grade(verdict.passed, 1.0 if verdict.passed else -1.0, feedback=verdict.reason, details=details)

    async def _final_state(self) -> FinalState:
        page_state = await self._evaluate(self.task.state_js) if self.task.state_js else None
        return FinalState(self.page.url, self.observation, list(self.router.posts), self.answer, page_state)

    def close(self) -> None:
        """Close the episode's context (its pages, storage and cookies go with it). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.host.run(self._close(), self.call_timeout_s)
        except RuntimeError:
            pass  # the browser is closed already: so is the context
        except (TimeoutError, _playwright_error()):
            pass  # a crashed or hung page's context: the browser disposes of it (or is restarted on its next use)

    async def _close(self) -> None:
        context, self.context = self.context, None
        if context is not None:
            await context.close()

