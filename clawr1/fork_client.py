"""The side of `clawr1 run` of the fork server (clawr1/fork_server.py, whose text says what it is): start it,
ask it for loops, and hold each forked loop as a process handle the supervisor treats like subprocess.Popen."""
from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from clawr1.runtime import start_process, stop_processes

TITLE_ROOM = 4096  # bytes of command line a forked loop can show: the server starts with that much argv


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    """One message of the channel, either way: a JSON line."""
    sock.sendall((json.dumps(message) + "\n").encode())


class ForkServerGone(RuntimeError):
    """The fork server exited (its log says why)."""


def uses_fork_server(enabled: bool) -> bool:
    """Whether `clawr1 run` forks its loops: run.fork_server, on a machine without an NVIDIA GPU."""
    return enabled and sys.platform == "linux" and not Path("/dev/nvidiactl").exists()


class ForkServer:
    """Starts the server process and asks it for loops; see the module's text."""

    def __init__(self, log_path: Path, env: dict[str, str], preload_modules: tuple[str, ...] = ()):
        """preload_modules: what the server imports before it forks; empty: its own PRELOAD."""
        self.log_path = log_path
        ours, theirs = socket.socketpair()
        self.proc = start_process([sys.executable, "-m", "clawr1.fork_server", str(theirs.fileno()),
                                   ",".join(preload_modules), " " * TITLE_ROOM],
                                  log_path, env, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock = ours
        self.buffer = b""
        self.pids: dict[int, "ForkedProcess"] = {}
        self.pending: list[dict[str, Any]] = []  # answers read while collecting exits

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        """The server's ready message ({"ready": modules, "cpu_s": ...}); ForkServerGone if it failed."""
        return self._next("ready", timeout_s)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, args: list[str], env: dict[str, str], log_path: Path,
              cwd: Optional[Path] = None) -> "ForkedProcess":
        """A loop running `clawr1 <args>`, forked, with `env`, its output appended to `log_path`, in `cwd` (else
        the server's)."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        title = [sys.executable, "-m", "clawr1.cli", *args]
        request = {"args": args, "env": env, "log": str(log_path.resolve()), "title": title,
                   "cwd": str(cwd) if cwd else None}
        try:
            send_message(self.sock, request)
        except OSError:
            raise ForkServerGone(self._gone()) from None
        pid = self._next("pid", 30.0)["pid"]
        proc = ForkedProcess(self, pid, title)
        self.pids[pid] = proc
        return proc

    def collect(self, timeout_s: float = 0.0) -> None:
        """Read what the server said (within timeout_s): record exits, keep other answers for `_next`."""
        for message in self._read(timeout_s):
            if "exit" in message:
                if message["exit"] in self.pids:
                    self.pids[message["exit"]].returncode = message["returncode"]
            else:
                self.pending.append(message)

    def stop(self, grace_s: float) -> None:
        """Close the channel, so the server exits (call it after its loops are gone); then as any loop."""
        self.sock.close()
        try:
            self.proc.wait(timeout=min(grace_s, 5.0))
        except subprocess.TimeoutExpired:
            stop_processes([self.proc], grace_s)

    def _next(self, key: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for message in self.pending:
                if key in message or "error" in message:
                    self.pending.remove(message)
                    if "error" in message:
                        raise ForkServerGone(f"fork server: {message['error']}")
                    return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ForkServerGone(f"fork server gave no {key!r} within {timeout_s:.0f}s; see {self.log_path}")
            self.collect(min(remaining, 0.5))

    def _read(self, timeout_s: float) -> list[dict[str, Any]]:
        readable, _, _ = select.select([self.sock], [], [], timeout_s)
        if not readable:
            return []
        chunk = self.sock.recv(65536)
        if not chunk:
            self._orphans_died()
            if not self.pending:
                raise ForkServerGone(self._gone())
            return []
        self.buffer += chunk
        lines = self.buffer.split(b"\n")
        self.buffer = lines.pop()
        return [json.loads(line) for line in lines]

    def _orphans_died(self) -> None:
        """The server is gone, so every loop it forked was SIGKILLed (PR_SET_PDEATHSIG)."""
        self.proc.wait()
        for proc in self.pids.values():
            if proc.returncode is None:
                proc.returncode = -signal.SIGKILL

    def _gone(self) -> str:
        self.proc.poll()
        return f"fork server exited with code {self.proc.returncode}; see {self.log_path}"


class ForkedProcess:
    """A loop the fork server started, with the part of subprocess.Popen's interface the supervisor uses."""

    def __init__(self, server: ForkServer, pid: int, args: list[str]):
        self.server = server
        self.pid = pid
        self.args = args
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            try:
                self.server.collect()
            except ForkServerGone:
                pass
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            try:
                self.server.collect(0.05)
            except ForkServerGone:
                pass
        return self.returncode
