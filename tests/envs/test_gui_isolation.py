"""The GUI env's browser has no power over the host: an unprivileged uid with Chromium's own sandbox (or bwrap
forbidding namespaces where that cannot start), limits on memory and CPU, and no connection of any protocol to
the host's loopback, with or without the sandbox's network namespace (envs/gui/browser.py)."""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
from pathlib import Path

import pytest

from envs.gui.browser import BrowserHost
from envs.gui.hostile_pages import SOCKETS_JS
from tests.envs.test_gui_env import _browser_missing, _goto_without_routes, made_up_task, page
from envs.gui.world import GuiWorld

pytestmark = pytest.mark.skipif(bool(_browser_missing()), reason=_browser_missing() or "-")
ROOT_ONLY = Path("/etc/shadow")


def _browser_processes(host: BrowserHost) -> dict[int, tuple[str, list[int]]]:
    """PID -> (command line, uids) of the sandbox's and the browser's processes (Playwright's driver, ours, left
    out). Chromium's children rewrite their command line into one string, so it is read as one."""
    found = {}
    for pid in host.processes():
        if pid == host.driver_pid():
            continue
        try:
            line = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue  # it ended meanwhile
        if not line:
            continue  # ending meanwhile: a process that exits has an empty command line
        uids = next(x for x in status if x.startswith("Uid:")).split()[1:]  # real, effective, saved, filesystem
        found[pid] = (line, [int(u) for u in uids])
    return found


def _with_a_page(host: BrowserHost) -> None:
    """Open a page, so the browser has a renderer."""
    assert "ok" in _goto_without_routes(host, "data:text/html,ok")


@pytest.fixture(scope="module")
def host():
    browser = BrowserHost().start()
    yield browser
    browser.close()


def test_the_browser_runs_as_an_unprivileged_uid_inside_chromiums_own_sandbox(host):
    world = GuiWorld(host, made_up_task({"/": page("<p>a renderer</p>")})).open()
    try:
        processes = _browser_processes(host)
    finally:
        world.close()
    assert any("--type=renderer" in line for line, _ in processes.values())
    for line, uids in processes.values():
        assert 0 not in uids, line[:120]
        assert "--no-sandbox" not in line, line[:120]
    assert host.chromium_sandbox


@pytest.mark.skipif(not (ROOT_ONLY.exists() and not ROOT_ONLY.stat().st_mode & stat.S_IROTH),
                    reason=f"needs a root-only {ROOT_ONLY} on the host")
def test_a_page_cannot_read_a_root_only_file_of_the_host(host):
    if os.geteuid() == 0:
        assert ROOT_ONLY.read_bytes() is not None  # the control: the file is there to be read, by root
    read = _goto_without_routes(host, ROOT_ONLY.as_uri())
    assert read.startswith("failed:") and "ERR_ACCESS_DENIED" in read, read[:300]


def test_without_chromiums_sandbox_bwrap_forbids_new_namespaces_and_the_uid_stays_unprivileged():
    browser = BrowserHost()
    browser.chromium_sandbox = False  # as where nested user namespaces are not allowed
    browser.start()
    try:
        _with_a_page(browser)
        launcher = next(browser._scratch.glob("sandboxed-chromium")).read_text()
        assert "--disable-userns" in launcher and "--seccomp" in launcher
        processes = _browser_processes(browser)
        for line, uids in processes.values():
            assert 0 not in uids, line[:120]
        modes = {pid: _seccomp_mode(pid) for pid, (line, _) in processes.items() if "chrom" in line.split()[0]}
        assert modes and all(mode in (2, None) for mode in modes.values()), modes  # a filter on every one
    finally:
        browser.close()


def _seccomp_mode(pid: int) -> int | None:
    """The process's seccomp mode (2: a filter), or None where it ended meanwhile."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return int(next(x for x in status if x.startswith("Seccomp:")).split()[1])


def _limits(pid: int) -> dict[str, str]:
    """The process's soft limits by name ({} where it ended meanwhile)."""
    try:
        rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    except OSError:
        return {}
    return {row[:26].strip(): row[26:].split()[0] for row in rows}


def test_every_browser_process_has_a_memory_and_a_cpu_limit():
    browser = BrowserHost(memory_mb=1536, cpu_s=1800).start()
    try:
        _with_a_page(browser)
        processes = _browser_processes(browser)
        chromium = [pid for pid, (line, _) in processes.items() if "chrom" in line.split()[0]]
        assert chromium
        read = {pid: _limits(pid) for pid in chromium}
        assert any(read.values())
        for pid, limits in read.items():
            if limits:  # not ended meanwhile
                assert (limits["Max data size"], limits["Max cpu time"]) == (str(1536 << 20), "1800"), processes[pid]
    finally:
        browser.close()


class _Listeners:
    """A TCP and a UDP socket on the host's loopback, counting whatever reaches them."""

    def __init__(self):
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.ports = [self.tcp.getsockname()[1], self.udp.getsockname()[1]]
        self.hits: list[str] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True),
                         threading.Thread(target=self._receive, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.tcp.accept()
            except OSError:
                return
            self.hits.append("tcp")
            conn.close()

    def _receive(self) -> None:
        while True:
            try:
                self.udp.recvfrom(4096)
            except OSError:
                return
            self.hits.append("udp")

    def close(self) -> None:
        for s in (self.tcp, self.udp):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        for thread in self._threads:
            thread.join(timeout=5)


def _every_protocol_page(ports: list[int]) -> str:
    http = f"http://127.0.0.1:{ports[0]}/"
    return page(f'<img src="{http}img"><iframe src="{http}frame"></iframe>',
                f"window.PORTS = {json.dumps(ports)};" + SOCKETS_JS +
                f"fetch('{http}fetch').catch(() => 0); navigator.sendBeacon('{http}beacon', 'x');"
                f"new EventSource('{http}events');")


@pytest.mark.parametrize("sandbox", [True, False], ids=["in-the-sandbox", "without-the-namespace"])
def test_no_connection_of_any_protocol_reaches_a_loopback_listener(sandbox):
    listeners = _Listeners()
    browser = BrowserHost(sandbox=sandbox).start()
    try:
        socket.create_connection(("127.0.0.1", listeners.ports[0]), timeout=5).close()  # the control: counted
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.sendto(b"x", ("127.0.0.1", listeners.ports[1]))
        probe.close()
        deadline = time.monotonic() + 10
        while len(listeners.hits) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(listeners.hits) == ["tcp", "udp"]
        listeners.hits.clear()

        world = GuiWorld(browser, made_up_task({"/": _every_protocol_page(listeners.ports)})).open()
        try:
            time.sleep(3)  # WebRTC gathers candidates and retries for a while
            refused = list(world.router.refused)
        finally:
            world.close()
        assert listeners.hits == []
        assert f"ws://127.0.0.1:{listeners.ports[0]}/" in refused  # the page's WebSocket: listed as refused
        assert any(u.startswith(f"http://127.0.0.1:{listeners.ports[0]}/") for u in refused)
    finally:
        browser.close()
        listeners.close()
