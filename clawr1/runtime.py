"""What every process shares: logging, stop signals, readiness markers, API keys, extension points loaded
by import path, and the helpers that start child processes and stop them (by process group, never by name)."""
from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from clawr1.config import Config, GatewayConfig

PR_SET_PDEATHSIG = 1


# ---------------------------------------------------------------- logging and start-up
def file_sha256(path: Path) -> str:
    """A file's sha256, read in 1 MiB blocks (model files run to gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def setup_logging(loop: str) -> logging.Logger:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format=f"%(asctime)s {loop} %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "httpx2", "httpcore", "openai", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(f"clawr1.{loop}")


def freeze_startup_objects() -> None:
    """Move everything loaded so far (model code, tokenizer, libraries) out of the garbage collector's sight.

    None of it is garbage, and scanning it in every full collection costs a serving process
    milliseconds per collection; objects made while serving are collected as usual."""
    gc.collect()
    gc.freeze()


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT, for loops that poll it between units of work."""
    event = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: event.set())
    return event


def ready_file(cfg: Config, loop: str) -> Path:
    return cfg.run_dir / "state" / f"{loop}.ready"


def mark_ready(cfg: Config, loop: str) -> None:
    path = ready_file(cfg, loop)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(os.getpid()))


def write_atomically(path: Path, text: str) -> None:
    """Write aside, then rename into place: a reader never sees half a file, and writers on several hosts of a
    shared filesystem each write their own temporary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_whereabouts(cfg: Config) -> None:
    """RUN_DIR/state/<loop>.where.json, written by a loop process that a supervisor started (which names it in
    CLAWR1_LOOP_NAME): its pid and parent, host, node (on Ray) and CUDA_VISIBLE_DEVICES, as the process sees them."""
    name = os.environ.get("CLAWR1_LOOP_NAME")
    if not name:
        return
    write_atomically(cfg.run_dir / "state" / f"{name}.where.json", json.dumps({
        "loop": name, "pid": os.getpid(), "ppid": os.getppid(), "hostname": socket.gethostname(),
        "node_id": os.environ.get("CLAWR1_NODE_ID", ""), "node_ip": os.environ.get("CLAWR1_NODE_IP", ""),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))


def resolve_api_key(cfg: GatewayConfig) -> Optional[str]:
    """The gateway's key: from the file named in the config, else from the environment variable it names."""
    if cfg.api_key_file:
        key = Path(cfg.api_key_file).expanduser().read_text().strip()
        if not key:
            raise SystemExit(f"gateway.api_key_file {cfg.api_key_file} is empty")
        return key
    return os.environ.get(cfg.api_key_env) or None


def load_object(import_path: str, what: str) -> Any:
    """`package.module:Name` -> the object (an extension point named in the config: env, warm-start data...)."""
    module_name, _, name = import_path.partition(":")
    if not module_name or not name:
        raise ValueError(f"{what} must look like 'package.module:Name', got {import_path!r}")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {import_path!r} cannot be loaded: {e}") from None


# ---------------------------------------------------------------- child processes
def die_with_parent() -> None:
    """Runs in a child before exec: the kernel SIGKILLs it when the thread that started it dies, even on kill -9."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: children are still stopped on every normal exit path


def start_process(command: list[str], log_path: Path, env: Optional[dict[str, str]] = None,
                  dies_with_parent: bool = True, cwd: Optional[Path] = None,
                  pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A child in its own process group, output appended to `log_path`, no stdin; `pass_fds` stay open in it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True, cwd=cwd, pass_fds=pass_fds,
                                preexec_fn=die_with_parent if dies_with_parent else None)


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    """Until GET `url` answers 200; RuntimeError if `proc` (the server) exits first or time runs out."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(proc.args[3:5]) if isinstance(proc.args, list) else proc.args} "
                               f"exited with code {proc.returncode} before {url} was up")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not up after {timeout_s:.0f}s")


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; one that is already gone is not an error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether a live process is left in the group. Zombies do not count: they wait on their reaper, not on us."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
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


def wait_group_gone(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether every process of `proc`'s group exited within timeout_s (reaping the leader as we go)."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()
        if not group_alive(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_processes(procs: list[subprocess.Popen], grace_s: float) -> list[subprocess.Popen]:
    """SIGTERM every process group (started with `start_process`), wait up to `grace_s` for all of them
    together, then SIGKILL what is left. Returns the processes that had to be killed."""
    for p in procs:
        signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = [p for p in procs if not wait_group_gone(p, max(0.0, deadline - time.monotonic()))]
    for p in procs:
        signal_group(p.pid, signal.SIGKILL)  # also reaps grandchildren left in the group
    for p in procs:
        p.wait()
    return killed


def exit_status(returncode: Optional[int]) -> int:
    """A child's return code as a process exit status (killed by signal N: 128 + N, as shells report it)."""
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode
