"""SGLang as the serving backend (serve.backend=sglang): launch command, supervised server, `clawr1 serve` path.

SGLang needs a GPU, so nothing here runs SGLang on CPU machines: the contract tests
(tests/serving/test_sglang_contract.py) pin the exact argument list and drive
`SGLangServer` with a stand-in server script. Flags follow docs/sglang_api_notes.md §7.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import httpx

from clawr1.config import Config, SGLangConfig

log = logging.getLogger("clawr1.serve")

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # launch_server's --dtype choices
# Value flags that launch_command sets from the config: extra_args may not repeat them, since
# argparse would silently keep the last one and the config would no longer say what runs.
MANAGED_FLAGS = frozenset({
    "--model-path", "--model", "--host", "--port", "--tp-size", "--tensor-parallel-size",
    "--mem-fraction-static", "--context-length", "--dtype", "--tool-call-parser", "--reasoning-parser",
    "--weight-version",
})
PR_SET_PDEATHSIG = 1


class SGLangStartError(RuntimeError):
    """The SGLang server exited or stayed unhealthy while starting; the message names its log file."""


# ---------------------------------------------------------------- the command


def _validate(s: SGLangConfig, model_path: str, port: int, weight_version: int) -> None:
    """Reject values SGLang would refuse late (after minutes of loading) or misread."""
    if not model_path:
        raise ValueError("model_path is empty: SGLang needs an HF model directory or hub id")
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port} (serve.port=0 is only filled in by `clawr1 run`)")
    if s.tp_size < 1:
        raise ValueError(f"serve.sglang.tp_size must be >= 1, got {s.tp_size}")
    if s.mem_fraction_static != 0 and not 0 < s.mem_fraction_static < 1:
        raise ValueError(f"serve.sglang.mem_fraction_static must be 0 (SGLang's default) or in (0, 1), "
                         f"got {s.mem_fraction_static}")
    if s.context_length < 0:
        raise ValueError(f"serve.sglang.context_length must be >= 0 (0: the model's), got {s.context_length}")
    if s.dtype not in DTYPES:
        raise ValueError(f"serve.sglang.dtype must be one of {', '.join(DTYPES)}, got {s.dtype!r}")
    if weight_version < 0:
        raise ValueError(f"weight_version must be >= 0, got {weight_version}")
    for arg in s.extra_args:
        if arg.split("=", 1)[0] in MANAGED_FLAGS:
            raise ValueError(f"serve.sglang.extra_args sets {arg.split('=', 1)[0]}, which clawr1 sets from the "
                             "config; change the config key instead")


def launch_command(cfg: Config, model_path: str, port: int, weight_version: int = 0) -> list[str]:
    """`python -m sglang.launch_server ...` for this config, validated (ValueError names the bad key)."""
    s = cfg.serve.sglang
    _validate(s, model_path, port, weight_version)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
           "--host", cfg.serve.host, "--port", str(port), "--tp-size", str(s.tp_size), "--dtype", s.dtype]
    if s.mem_fraction_static:
        cmd += ["--mem-fraction-static", str(s.mem_fraction_static)]
    if s.context_length:
        cmd += ["--context-length", str(s.context_length)]
    if s.tool_call_parser:
        cmd += ["--tool-call-parser", s.tool_call_parser]
    if s.reasoning_parser:
        cmd += ["--reasoning-parser", s.reasoning_parser]
    # versions count publishes; SGLang reports it as meta_info.weight_version until the first update
    cmd += ["--weight-version", str(weight_version), "--skip-server-warmup", "--enable-metrics"]
    return cmd + list(s.extra_args)


# ---------------------------------------------------------------- the process


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it when the thread that started it dies, even on kill -9."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: stop() still runs on every normal exit path


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a live process is left in the group. Zombies do not count: they wait on their reaper, not on us."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    if not os.path.isdir("/proc"):
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def _local_host(host: str) -> str:
    """Where this machine reaches a server bound to `host` (a wildcard bind is reached on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)


class SGLangServer:
    """One SGLang server: its own process group, output to `log_path`, stopped by its PID's group only.

    `command` replaces the launch_server command (tests use a stand-in script). Start it from a
    thread that lives as long as the server: with `die_with_parent` the kernel kills the server
    when that thread exits. Use as a context manager, or call start() and stop().
    """

    def __init__(self, cfg: Config, model_path: str, port: int, log_path: str | os.PathLike, *,
                 weight_version: int = 0, command: Optional[Sequence[str]] = None, die_with_parent: bool = True):
        self.command = list(command) if command is not None else launch_command(cfg, model_path, port, weight_version)
        self.url = f"http://{_local_host(cfg.serve.host)}:{port}"
        self.log_path = Path(log_path)
        self.die_with_parent = die_with_parent
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "SGLangServer":
        if self.proc is not None:
            raise RuntimeError("this SGLangServer was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent if self.die_with_parent else None)
        log.info("started SGLang (pid %d, log %s): %s", self.proc.pid, self.log_path, " ".join(self.command))
        return self

    @property
    def pid(self) -> int:
        return self._started().pid

    @property
    def returncode(self) -> Optional[int]:
        """None while running or before start()."""
        return self.proc.poll() if self.proc is not None else None

    def _started(self) -> subprocess.Popen:
        if self.proc is None:
            raise RuntimeError("the SGLang server was not started")
        return self.proc

    def healthy(self, timeout_s: float = 25.0) -> bool:
        """GET /health_generate answered 200: the server ran a one-token generation (it waits up to 20 s)."""
        try:
            return httpx.get(f"{self.url}/health_generate", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> None:
        """Block until healthy; SGLangStartError (naming the log) if the process exits or time runs out."""
        proc = self._started()
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise SGLangStartError(f"SGLang server exited with code {proc.returncode} before it was healthy; "
                                       f"see {self.log_path}; last lines:\n{_tail(self.log_path)}")
            left = deadline - time.monotonic()
            if self.healthy(timeout_s=max(1.0, min(25.0, left))):
                return
            if time.monotonic() >= deadline:
                raise SGLangStartError(f"SGLang server at {self.url} not healthy after {timeout_s:.0f}s; "
                                       f"see {self.log_path}; last lines:\n{_tail(self.log_path)}")
            time.sleep(poll_s)

    def wait(self) -> int:
        """Block until the server process exits; its return code (negative: killed by that signal)."""
        return self._started().wait()

    def _group_gone(self, timeout_s: float) -> bool:
        """Whether every process of the group has exited within timeout_s (reaping the leader as we go)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.proc.poll()  # reap the leader
            if not _group_alive(self.proc.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop(self, timeout_s: float = 20.0) -> Optional[int]:
        """SIGTERM this server's process group, SIGKILL it after timeout_s; the leader's return code.

        The group is signalled even if the leader already exited, so workers it left behind go too.
        """
        if self.proc is None:
            return None
        pgid = self.proc.pid  # start_new_session: the group id is the leader's PID
        _signal_group(pgid, signal.SIGTERM)
        if not self._group_gone(timeout_s):
            log.warning("SGLang (pid %d) did not stop within %.0fs; killing its process group", pgid, timeout_s)
            _signal_group(pgid, signal.SIGKILL)
            self._group_gone(5.0)
        return self.proc.wait()

    def __enter__(self) -> "SGLangServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- `clawr1 serve` with serve.backend=sglang


def _require_sglang() -> None:
    try:
        import sglang  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"serve.backend=sglang, but SGLang is not installed ({e}); "
                         "on a GPU machine run `pip install -e .[gpu]`") from None


def _exit_code(returncode: Optional[int]) -> int:
    """A child's return code as a process exit status (killed by signal N: 128 + N, as shells report it)."""
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


def _interrupt_once(signum: int, frame) -> None:
    """SIGTERM/SIGINT handler: the first one unwinds into the server's stop(); later ones are ignored."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def serve_sglang(cfg: Config, model_path: str) -> int:
    """Run SGLang on cfg.serve.port until it exits or this process gets SIGTERM/SIGINT; its exit status.

    Call from the main thread (it installs signal handlers). The server's output goes to
    RUN_DIR/logs/sglang-server.log; a server that dies or stays unhealthy while starting raises
    SGLangStartError naming that file.
    """
    _require_sglang()
    server = SGLangServer(cfg, model_path, cfg.serve.port, cfg.run_dir / "logs" / "sglang-server.log")
    previous = {sig: signal.signal(sig, _interrupt_once) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with server:
            server.wait_healthy(cfg.serve.sglang.startup_timeout_s)
            log.info("SGLang serving %s on %s", model_path, server.url)
            return _exit_code(server.wait())
    except KeyboardInterrupt:
        code = _exit_code(server.stop())  # already stopped on leaving `with`, unless the signal came mid-start
        log.info("stop requested; SGLang stopped")
        return code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
